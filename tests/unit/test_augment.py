"""Augmentations: shapes kept, seeded, masks and missing values handled."""

import numpy as np
import pytest

from data.sensors.augment import AUGMENTATIONS, augment, crop, frequency_noise, resample, scaling, time_warp

C, T = 3, 24


def windows(n=5, missing=0.2, seed=0):
    rng = np.random.default_rng(seed)
    mask = (rng.random((n, C, T)) > missing).astype(np.float32)
    values = rng.normal(size=(n, C, T)).astype(np.float32) * mask
    return np.concatenate([values, mask], axis=1)


@pytest.mark.parametrize("name", sorted(AUGMENTATIONS))
def test_shape_seed_and_missing_values(name):
    x = windows()
    fn = AUGMENTATIONS[name]
    a, b = fn(x, np.random.default_rng(1)), fn(x, np.random.default_rng(1))
    assert a.shape == x.shape and a.dtype == np.float32
    assert np.array_equal(a, b)  # deterministic under a seed
    assert not np.array_equal(a, fn(x, np.random.default_rng(2)))
    assert not np.array_equal(a, x)
    assert set(np.unique(a[:, C:])) <= {0.0, 1.0}  # masks stay binary
    assert np.all(a[:, :C][a[:, C:] == 0] == 0)  # missing values stay 0
    if name not in ("time_warp", "crop"):
        assert np.array_equal(a[:, C:], x[:, C:])  # value augmentations never move masks


def test_fully_observed_stays_observed_and_constants_stay_constant():
    x = np.concatenate([np.full((4, C, T), 2.5, np.float32), np.ones((4, C, T), np.float32)], axis=1)
    for fn in (time_warp, crop):
        out = fn(x, np.random.default_rng(0))
        assert np.allclose(out, x, atol=1e-5)


def test_identity_settings():
    x = windows()
    rng = np.random.default_rng(0)
    assert np.allclose(time_warp(x, rng, sigma=0.0), x, atol=1e-5)
    assert np.allclose(crop(x, rng, min_ratio=1.0), x, atol=1e-5)
    assert np.allclose(frequency_noise(x, rng, sigma=0.0), x, atol=1e-5)


def test_scaling_is_one_factor_per_window_channel():
    x = windows(missing=0.0)
    out = scaling(x, np.random.default_rng(0))
    ratio = out[:, :C] / x[:, :C]
    assert np.allclose(ratio, ratio[..., :1], rtol=1e-4)


def test_resample_interpolates_between_observed_and_takes_nearest_next_to_gaps():
    values = np.array([[[0.0, 1.0, 0.0, 3.0]]], np.float32)
    mask = np.array([[[1.0, 1.0, 0.0, 1.0]]], np.float32)
    out = resample(np.concatenate([values, mask], axis=1), np.array([[0.5, 1.25, 1.75, 3.0]]))
    assert np.allclose(out[0, 0], [0.5, 1.0, 0.0, 3.0])  # linear; nearest observed (1); nearest missing (0); exact
    assert np.allclose(out[0, 1], [1.0, 1.0, 0.0, 1.0])


def test_augment_applies_a_share_of_windows():
    x = windows(n=200)
    out = augment(x, np.random.default_rng(0), ["jitter"], probability=0.5)
    changed = np.any(out != x, axis=(1, 2)).mean()
    assert 0.35 < changed < 0.65
    assert np.array_equal(augment(x, np.random.default_rng(0), list(AUGMENTATIONS), 0.0), x)
