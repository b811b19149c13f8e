"""The samplings of sensor fine-tuning: a plain permutation, inverse-frequency weights by the model's confidence."""

import numpy as np
import pytest
import torch

import models.sensor.training as sensor_training
from models.sensor.sampling import SAMPLINGS, confidence_factors, inverse_frequency
from models.sensor.training import finetune_member
from tests.unit.test_sensor_training import TINY, data, finetune_cfg

Y = np.array([1] * 10 + [0] * 90)


def draw(name, uncertainty=None, seed=0):
    return SAMPLINGS[name](Y, np.random.default_rng(seed), uncertainty)


def test_a_permutation_and_inverse_frequency_weights():
    order, weights = draw("none")
    assert sorted(order) == list(range(100)) and np.all(weights == 1)
    order, w = draw("uncertainty")  # the first epoch has no model to ask: inverse-frequency weights alone
    assert sorted(order) == list(range(100))
    assert w.mean() == pytest.approx(1.0) and w[Y == 1].sum() == pytest.approx(w[Y == 0].sum())


def test_uncertainty_weights_favour_sure_minority_windows_and_keep_the_class_total():
    u = np.r_[np.linspace(0.0, 0.3, 10), np.full(90, 0.5)]
    _, first = draw("uncertainty")  # the first epoch has no model to ask
    np.testing.assert_allclose(first, inverse_frequency(Y))
    _, w = draw("uncertainty", lambda: u)
    assert np.all(np.diff(w[:10]) < 0)  # less uncertain, more weight
    assert w[Y == 1].sum() == pytest.approx(first[Y == 1].sum())
    np.testing.assert_allclose(w[Y == 0], first[Y == 0])  # the majority class is left alone
    assert np.all(confidence_factors(Y, np.zeros(100)) == 1)  # no spread (no dropout): plain weights


def test_minority_is_whichever_class_is_rarer():
    y = 1 - Y
    factors = confidence_factors(y, np.r_[np.linspace(0.0, 0.3, 10), np.full(90, 0.5)])
    assert np.all(factors[10:] == 1) and factors[0] > factors[9]


def test_uncertainty_sampling_asks_the_model_from_the_second_epoch_on(monkeypatch):
    x, y = data()
    vx, vy = data(seed=1)
    calls = []
    real = sensor_training.mc_dropout_spread

    def spy(model, features, device, passes, seed):
        calls.append((len(features), passes, model.training))
        return real(model, features, device, passes, seed)

    monkeypatch.setattr(sensor_training, "mc_dropout_spread", spy)
    cfg = finetune_cfg(sampling="uncertainty", uncertainty_passes=3, epochs=3, small_loss_drop=0.0)
    member, result = finetune_member(x, y, vx, vy, TINY, cfg, None, seed=3, device=torch.device("cpu"))
    assert calls == [(len(x), 3, True), (len(x), 3, True)]  # epochs 1 and 2, the model in training mode then
    assert len(result.history) == 3
    # with no spread to weigh by, every epoch keeps the first epoch's inverse-frequency weights
    monkeypatch.setattr(sensor_training, "mc_dropout_spread", lambda model, features, *_: np.zeros(len(features)))
    _, plain = finetune_member(x, y, vx, vy, TINY, cfg, None, seed=3, device=torch.device("cpu"))
    assert plain.history[0] == result.history[0] and plain.history[1] != result.history[1]
