"""Sensor training: resumable checkpoints, sampling, mixup, curriculum, pretraining, calibration choice, MiniRocket."""

import numpy as np
import pytest
import torch

import models.sensor.training as sensor_training
from models.calibration import select_calibration
from models.sensor.baselines import fit_minirocket
from models.sensor.config import SensorFinetuneConfig, SensorModelConfig, SensorPretrainConfig
from models.sensor.minirocket import KERNELS, MiniRocket, _shifted
from models.sensor.training import finetune_member, mixup, pretrain_encoder
from tests.devices import DEVICES

TINY = SensorModelConfig(hidden=8, layers=2, dropout=0.2, attention_layers=1, heads=2, projection=4)


def data(n=96, c=2, t=16, seed=0):
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.25).astype(np.int8)
    values = rng.normal(size=(n, c, t)) + y[:, None, None] * np.linspace(0, 2, t)
    return np.concatenate([values, np.ones((n, c, t))], axis=1).astype(np.float32), y


def finetune_cfg(**kw):
    base = dict(epochs=4, batch_size=32, lr=0.01, patience=10, ensemble_size=2, sampling="uncertainty",
                mixup_alpha=0.4, small_loss_drop=0.1, loss={"terms": {"focal": 1.0, "gce": 0.5}})
    return SensorFinetuneConfig(**{**base, **kw})


@pytest.fixture
def deterministic():
    """Bit-identical kernels, so that a resumed run can equal an uninterrupted one on CUDA as well
    (cuBLAS needs CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment for it)."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("device", DEVICES)
def test_killed_finetuning_resumes_after_its_last_epoch_and_ends_identically(tmp_path, monkeypatch, device,
                                                                            deterministic):
    """Dropout draws from the device's generator: on CUDA the checkpoint must restore that one too."""
    x, y = data()
    vx, vy = data(seed=1)
    cfg = finetune_cfg()
    reference, uninterrupted = finetune_member(x, y, vx, vy, TINY, cfg, None, seed=3, device=device)

    real_rate, seen = sensor_training.small_loss_rate, []

    def interrupted(cfg_, epoch):
        if epoch == 2:
            raise KeyboardInterrupt("killed during epoch 2")
        seen.append(epoch)
        return real_rate(cfg_, epoch)

    checkpoint = tmp_path / "member.pt"
    monkeypatch.setattr(sensor_training, "small_loss_rate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        finetune_member(x, y, vx, vy, TINY, cfg, None, seed=3, device=device, checkpoint=checkpoint)
    assert seen == [0, 1] and checkpoint.exists()

    seen.clear()
    monkeypatch.setattr(sensor_training, "small_loss_rate", lambda c, e: seen.append(e) or real_rate(c, e))
    resumed, result = finetune_member(x, y, vx, vy, TINY, cfg, None, seed=3, device=device, checkpoint=checkpoint)
    assert result.resumed_from == 1 and seen == [2, 3]
    assert result.history == uninterrupted.history  # the epochs after the restart too, not only the best one
    for name, tensor in reference.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), name

    # another setting does not resume from this checkpoint
    seen.clear()
    _, other = finetune_member(x, y, vx, vy, TINY, finetune_cfg(lr=0.005), None, seed=3, device=device,
                               checkpoint=checkpoint)
    assert other.resumed_from is None and seen == [0, 1, 2, 3]


def test_mixup_mixes_windows_labels_and_weights_alike():
    x, y = data(n=32)
    w = np.linspace(1, 2, 32).astype(np.float32)
    mx, my, mw = mixup(x, y.astype(np.float32), w, 0.4, np.random.default_rng(0))
    assert mx.shape == x.shape and my.shape == y.shape
    assert np.all((my >= 0) & (my <= 1)) and np.any((my > 0) & (my < 1))
    assert np.all((mw >= 1) & (mw <= 2))


@pytest.mark.parametrize("device", DEVICES)
def test_pretraining_with_both_objectives_runs_and_learns(device):
    x, _ = data(n=64)
    cfg = SensorPretrainConfig(epochs=3, batch_size=32, lr=0.01)
    encoder, decoder, result = pretrain_encoder(x, TINY, cfg, device)
    losses = [r["train_loss"] for r in result.history]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
    assert set(encoder.state_dict()) == set(sensor_training.SensorClassifier(4, TINY).encoder.state_dict())


def test_calibration_choice_follows_cross_fitted_nll():
    rng = np.random.default_rng(0)
    units = np.repeat(np.arange(20), 50)
    z = rng.normal(0, 3, 1000)
    # logistic truth, overconfident logits: temperature suffices and isotonic only adds variance
    y = (rng.random(1000) < 1 / (1 + np.exp(-z / 2))).astype(int)
    chosen, scores = select_calibration(np.stack([z, z], 1), y, units, ["temperature", "isotonic"])
    assert chosen.method == "temperature" and chosen.temperature == pytest.approx(2.0, rel=0.25)
    # a step-shaped truth no temperature can express: isotonic wins
    y = (rng.random(1000) < np.where(z > 1, 0.9, 0.05)).astype(int)
    chosen, scores = select_calibration(np.stack([z, z], 1), y, units, ["temperature", "isotonic"])
    assert chosen.method == "isotonic" and scores["isotonic"] < scores["temperature"]


def test_minirocket_kernel_on_an_impulse_and_feature_count():
    x = np.zeros((1, 1, 20), np.float32)
    x[0, 0, 10] = 1.0
    taps = _shifted(x, 1)
    a, b, g = KERNELS[0]  # weight 2 at positions 0, 1, 2; -1 elsewhere
    conv = (3 * (taps[a] + taps[b] + taps[g]) - taps.sum(axis=0))[0, 0]
    expected = np.zeros(20)
    expected[[12, 13, 14]] = 2  # output t reads x[t + j - 4]: the impulse at t = 14 - j
    expected[[6, 7, 8, 9, 10, 11]] = -1
    assert np.array_equal(conv, expected)
    X = np.random.default_rng(0).normal(size=(30, 3, 32)).astype(np.float32)
    rocket = MiniRocket(500, seed=1).fit(X)
    features = rocket.transform(X)
    assert features.shape == (30, 84 * (500 // 84)) and ((features >= 0) & (features <= 1)).all()
    assert np.array_equal(features, MiniRocket(500, seed=1).fit(X).transform(X))


def test_minirocket_baseline_separates_a_pattern():
    rng = np.random.default_rng(0)
    y = np.tile([0, 1], 60)
    X = rng.normal(size=(120, 2, 32)) + y[:, None, None] * np.sin(np.arange(32) / 2)
    scorer, info = fit_minirocket(X[:80], y[:80], np.repeat(np.arange(8), 10), n_features=420, c_grid=[0.01, 1.0])
    p = scorer(X[80:])
    assert info["C"] in (0.01, 1.0) and set(info["cv_pr_auc"]) == {"0.01", "1.0"}
    assert p[y[80:] == 1].mean() > p[y[80:] == 0].mean() + 0.3
