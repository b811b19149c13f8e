"""Uncertainty-quality measures (models/uncertainty_quality.py) and MC-dropout sampling (models/mc_dropout.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from models.mc_dropout import mc_dropout_passes, sample_dropout
from models.uncertainty_quality import (coverage_at_levels, regression_uncertainty_quality, risk_curve,
                                        uncertainty_quality)


def test_an_uncertainty_that_orders_the_losses_reaches_the_oracle_and_its_reverse_is_worse_than_chance():
    rng = np.random.default_rng(0)
    loss = rng.exponential(size=500)
    best = uncertainty_quality(loss, loss * 3 + 1)  # any increasing function of the loss
    assert best["aurc"] == pytest.approx(best["aurc_oracle"]) and best["aurc_gain"] == pytest.approx(1.0)
    assert best["spearman"] == pytest.approx(1.0)
    worst = uncertainty_quality(loss, -loss)
    assert worst["aurc_gain"] < -0.5 and worst["spearman"] == pytest.approx(-1.0)
    noise = uncertainty_quality(loss, rng.normal(size=500))
    assert abs(noise["aurc_gain"]) < 0.2 and noise["aurc_random"] == pytest.approx(loss.mean())


def test_the_risk_curve_is_the_running_mean_loss_and_ties_enter_together():
    curve = risk_curve(np.array([4.0, 0.0, 2.0]), np.array([3.0, 1.0, 2.0]))
    assert curve == pytest.approx([0.0, 1.0, 2.0])
    # the two tied items both stand for their mean, whatever their order in the input
    assert risk_curve(np.array([0.0, 2.0]), np.array([1.0, 1.0])) == pytest.approx([1.0, 1.0])
    assert risk_curve(np.array([2.0, 0.0]), np.array([1.0, 1.0])) == pytest.approx([1.0, 1.0])
    constant = uncertainty_quality(np.array([0.0, 2.0, 1.0]), np.ones(3))
    assert np.isnan(constant["spearman"]) and constant["aurc_gain"] == pytest.approx(0.0)


def test_gaussian_intervals_cover_their_nominal_levels():
    rng = np.random.default_rng(1)
    sigma = rng.uniform(0.5, 2.0, size=20000)
    value = rng.normal(size=20000)
    y = value + sigma * rng.normal(size=20000)
    coverage = coverage_at_levels(y, value, sigma)
    assert set(coverage) == {"0.5", "0.8", "0.9", "0.95"}
    for level, got in coverage.items():
        assert got == pytest.approx(float(level), abs=0.01)
    assert coverage_at_levels(y, value, sigma / 2)["0.9"] < 0.7  # too narrow intervals undercover
    quality = regression_uncertainty_quality(y, value, sigma)
    assert quality["spearman"] > 0.2 and quality["coverage"] == coverage


def test_bad_shapes_are_a_clear_error():
    with pytest.raises(ValueError, match="as many losses"):
        uncertainty_quality(np.zeros(3), np.zeros(2))


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.drop, self.out = nn.BatchNorm1d(4), nn.Dropout(0.5), nn.Linear(4, 1)

    def forward(self, x):
        return self.out(self.drop(self.norm(x))).squeeze(-1)


def test_mc_dropout_samples_dropout_only_and_its_passes_repeat_with_the_seed():
    torch.manual_seed(0)
    net = _Net()
    net.train()(torch.randn(64, 4))  # running statistics that differ from a batch's own
    x = torch.randn(16, 4)
    sample_dropout(net)
    assert net.drop.training and not net.norm.training and not net.out.training

    def predict():
        with torch.no_grad():
            return sample_dropout(net)(x).numpy()

    passes = mc_dropout_passes(predict, 8, seed=3)
    assert passes.shape == (8, 16) and passes.std(axis=0).min() > 0  # the passes differ
    assert np.array_equal(passes, mc_dropout_passes(predict, 8, seed=3))
    net.eval()
    with torch.no_grad():
        deterministic = net(x).numpy()
    # with dropout off the batch-norm statistics are the running ones: the passes centre on the eval output
    assert np.abs(passes.mean(axis=0) - deterministic).mean() < np.abs(passes - deterministic).mean()
    with pytest.raises(ValueError, match="at least one pass"):
        mc_dropout_passes(predict, 0, seed=0)


def test_a_sensor_models_mc_passes_differ_and_a_plain_prediction_after_them_is_deterministic_again():
    from models.sensor.config import SensorModelConfig
    from models.sensor.network import SensorClassifier
    from models.sensor.training import predict_logits

    torch.manual_seed(0)
    features = np.random.default_rng(0).normal(size=(32, 6, 16)).astype(np.float32)
    model = SensorClassifier(6, SensorModelConfig(hidden=8, layers=2, dropout=0.3, statistics_bins=0))
    cpu = torch.device("cpu")
    passes = mc_dropout_passes(lambda: predict_logits(model, features, cpu, dropout=True), 4, seed=0)
    assert passes.std(axis=0).min() > 0
    plain = predict_logits(model, features, cpu)
    assert not any(m.training for m in model.modules())
    assert np.array_equal(plain, predict_logits(model, features, cpu))


def test_fixed_masks_give_each_molecule_one_answer_per_pass_whatever_its_batch_and_the_passes_differ():
    from models.mc_dropout import FixedMaskDropout, fix_dropout_masks, set_pass
    from models.molecule.training import predict_raw
    from tests.unit.test_molecule_model import HANDFUL, SMALL, model, molecules

    net = model()
    net.apply(lambda m: setattr(m, "p", 0.3) if isinstance(m, nn.Dropout) else None)
    cpu = torch.device("cpu")
    every, alone = molecules(HANDFUL), molecules(HANDFUL[2:3])

    def fixed_passes(seed: int) -> tuple[nn.Module, np.ndarray]:
        masked = fix_dropout_masks(net, 6, seed, lambda m: predict_raw(m, every, cpu))
        return masked, np.stack([predict_raw(set_pass(masked, index), every, cpu) for index in range(6)])

    masked, passes = fixed_passes(seed=1)
    assert passes.shape == (6, len(HANDFUL)) and passes.std(axis=0).min() > 0  # the sub-networks differ
    assert np.array_equal(passes, fixed_passes(seed=1)[1]) and not np.allclose(passes, fixed_passes(seed=2)[1])
    for index in range(6):  # a molecule alone gets its answer from inside the batch
        assert predict_raw(set_pass(masked, index), alone, cpu)[0] == pytest.approx(passes[index, 2], abs=1e-5)
    fixed = [m for m in masked.modules() if isinstance(m, FixedMaskDropout)]
    assert fixed and not any(isinstance(m, nn.Dropout) for m in masked.modules())  # every Dropout was reached
    kept = torch.cat([m.masks.flatten() for m in fixed])
    assert kept.unique().tolist() == [0.0, pytest.approx(1 / 0.7)] and 0.6 < (kept > 0).float().mean() < 0.8
    assert all(m.masks.shape[-1] in (SMALL.hidden, 2 * SMALL.hidden) for m in fixed)  # the feature axis
    plain = predict_raw(net, every, cpu)  # the trained model itself is left as it was
    assert np.array_equal(plain, predict_raw(net, every, cpu)) and not np.allclose(plain, passes[0])
    with pytest.raises(ValueError, match="at least one pass"):
        fix_dropout_masks(net, 0, 0, lambda m: None)


def test_the_molecule_ensemble_answers_member_by_member_on_each_fixed_mask_pass():
    from models.mc_dropout import set_pass
    from models.molecule.training import ensemble_raw, fixed_mask_members, predict_raw
    from tests.unit.test_molecule_model import HANDFUL, model, molecules

    members = [model(), model()]
    for net in members:
        net.apply(lambda m: setattr(m, "p", 0.3) if isinstance(m, nn.Dropout) else None)
    every, cpu = molecules(HANDFUL), torch.device("cpu")
    raw = ensemble_raw(members, every, cpu, mask_passes=3, mask_seed=4)
    assert raw.shape == (len(HANDFUL), 6)  # what calibrate fits on and the exported graph's samples
    masked = fixed_mask_members(members, 3, 4, every.subset(range(min(8, len(HANDFUL)))))
    for column, (member, index) in enumerate((m, p) for m in (0, 1) for p in range(3)):  # member by member
        assert raw[:, column] == pytest.approx(predict_raw(set_pass(masked[member], index), every, cpu), abs=1e-6)
    assert np.array_equal(raw, ensemble_raw(members, every, cpu, mask_passes=3, mask_seed=4))
    assert not np.allclose(raw, ensemble_raw(members, every, cpu, mask_passes=3, mask_seed=5))
    plain = ensemble_raw(members, every, cpu)  # no passes: one column per member, the members as trained
    assert plain.shape == (len(HANDFUL), 2)
    assert np.array_equal(plain[:, 1], predict_raw(members[1], every, cpu))


def test_sensor_fixed_masks_drop_channels_for_any_window_length_and_leave_attention_weights_alone():
    from models.mc_dropout import FixedMaskDropout
    from models.sensor.config import SensorModelConfig
    from models.sensor.network import SensorClassifier
    from models.sensor.training import ensemble_logits, fixed_mask_members, predict_logits

    torch.manual_seed(0)
    cfg = SensorModelConfig(hidden=8, layers=2, attention_layers=1, heads=2, dropout=0.3, statistics_bins=0)
    members = [SensorClassifier(6, cfg).eval() for _ in range(2)]
    rng = np.random.default_rng(0)
    features, longer = (rng.normal(size=(12, 6, t)).astype(np.float32) for t in (16, 40))
    cpu = torch.device("cpu")

    logits = ensemble_logits(members, features, cpu, mask_passes=3, mask_seed=5)
    assert logits.shape == (12, 6) and logits.std(axis=1).min() > 0  # member by member, 3 sub-networks each
    assert np.array_equal(logits, ensemble_logits(members, features, cpu, mask_passes=3, mask_seed=5))
    assert not np.allclose(logits, ensemble_logits(members, features, cpu, mask_passes=3, mask_seed=6))
    masked = fixed_mask_members(members, 3, 5, features[:8])
    for window in (features, longer):  # masks over channels, not time steps: any window length, any batch
        batch = np.stack([predict_logits(m, window, cpu) for m in masked])  # pass 0 of each member
        alone = predict_logits(masked[1], window[4:5], cpu)
        assert batch.shape == (2, len(window)) and alone[0] == pytest.approx(batch[1, 4], abs=1e-5)
    tcn = [m.drop for m in masked[0].encoder.blocks]
    assert all(isinstance(d, FixedMaskDropout) and d.axis == 1 and d.masks.shape == (3, 8) for d in tcn)
    weights_dropout = masked[0].encoder.attention[0].attention.drop
    assert type(weights_dropout) is nn.Dropout and not weights_dropout.training  # (B, heads, T, T): stays off
    x = torch.ones(2, 8, 5)
    out = tcn[0](x)  # a channel is kept or dropped at every step alike
    assert torch.equal(out, tcn[0].masks[0].reshape(1, 8, 1).expand(2, 8, 5))
    plain = ensemble_logits(members, features, cpu)
    assert plain.shape == (12, 2) and np.array_equal(plain, ensemble_logits(members, features, cpu))
    assert all(type(m.encoder.blocks[0].drop) is nn.Dropout for m in members)  # the trained members are left alone
