"""Robust binary losses and NT-Xent against hand-computed values."""

import math

import pytest
import torch

from models.losses import bce, focal, gce, make_loss, nt_xent, reduce_loss, sce

LN2, LN4 = math.log(2), math.log(4)
LOG_FLOOR = -math.log(1e-4)  # 9.2103...

# z = 0 (p = 0.5) with y = 1, and z = ln 3 (p = 0.75) with y = 0
Z = torch.tensor([0.0, math.log(3)])
Y = torch.tensor([1.0, 0.0])


def test_bce():
    assert torch.allclose(bce(Z, Y), torch.tensor([LN2, LN4]))


def test_focal_by_hand():
    # y=1: alpha (1-p)^2 (-ln p) = 0.25 * 0.25 * ln 2; y=0: (1-alpha) p^2 (-ln(1-p)) = 0.75 * 0.5625 * ln 4
    expected = torch.tensor([0.25 * 0.25 * LN2, 0.75 * 0.5625 * LN4])
    assert torch.allclose(focal(Z, Y, gamma=2.0, alpha=0.25), expected, atol=1e-6)
    assert torch.allclose(focal(Z, Y, gamma=0.0, alpha=None), bce(Z, Y))  # gamma 0, no alpha: BCE


def test_gce_by_hand():
    # (1 - p_y^q) / q with q = 0.5: (1 - sqrt(0.5)) / 0.5 and (1 - sqrt(0.25)) / 0.5 = 1
    assert torch.allclose(gce(Z, Y, q=0.5), torch.tensor([(1 - math.sqrt(0.5)) / 0.5, 1.0]), atol=1e-6)
    assert torch.allclose(gce(Z, Y, q=1.0), torch.tensor([0.5, 0.75]), atol=1e-6)  # q = 1: MAE |y - p|
    assert torch.allclose(gce(Z, Y, q=1e-4), bce(Z, Y), atol=1e-3)  # q -> 0: cross entropy


def test_sce_by_hand():
    # alpha CE + beta RCE; RCE = -(p log y + (1-p) log(1-y)) with log 0 -> log 1e-4
    expected = torch.tensor([0.1 * LN2 + 0.5 * LOG_FLOOR, 0.1 * LN4 + 0.75 * LOG_FLOOR])
    assert torch.allclose(sce(Z, Y, alpha=0.1, beta=1.0), expected, atol=1e-5)


def test_combination_and_soft_targets():
    loss = make_loss({"bce": 1.0, "gce": 2.0}, gce_q=0.5)
    assert loss(Z[:1], Y[:1]).item() == pytest.approx(LN2 + 2 * (1 - math.sqrt(0.5)) / 0.5, abs=1e-6)
    half = torch.tensor([0.5])  # soft target 0.5 at p = 0.5: both halves of focal are (0.5)(0.25) ln 2
    assert focal(torch.zeros(1), half, gamma=2.0).item() == pytest.approx(0.25 * LN2, abs=1e-6)
    with pytest.raises(ValueError, match="unknown loss"):
        make_loss({"hinge": 1.0})


def test_reduce_drops_the_largest_losses_and_weights():
    losses = torch.tensor([1.0, 2.0, 3.0, 10.0])
    assert reduce_loss(losses).item() == pytest.approx(4.0)
    assert reduce_loss(losses, drop_largest=0.25).item() == pytest.approx(2.0)
    assert reduce_loss(losses, torch.tensor([1.0, 1.0, 2.0, 0.0])).item() == pytest.approx((1 + 2 + 6) / 4)


def test_nt_xent_by_hand():
    # two orthogonal pairs, T = 1: each anchor has similarity 1 to its positive and 0 to two negatives
    z = torch.eye(2)
    assert nt_xent(z, z.clone(), temperature=1.0).item() == pytest.approx(math.log(1 + 2 / math.e), abs=1e-6)
    # swapping the partners makes the positives the worst-aligned pairs: a larger loss
    assert nt_xent(z, z.flip(0), temperature=1.0).item() > 1.0
