"""WindowFeaturizer (standardise + masks, JSON round trip) and the summary features of the tabular baseline."""

from __future__ import annotations

import json

import numpy as np
import pytest

from data.sensors.featurize import WindowFeaturizer
from data.sensors.summary_features import summary_feature_names, summary_features


def _windows() -> np.ndarray:
    X = np.random.default_rng(0).normal(loc=[[5.0], [-2.0], [0.0]], scale=[[2.0], [0.5], [1.0]], size=(50, 3, 10))
    X[0, 0, 3] = np.nan
    X[4, 1, :] = np.nan
    return X.astype(np.float32)


def test_fit_statistics_ignore_nan():
    X = _windows()
    f = WindowFeaturizer(["a", "b", "c"]).fit(X)
    np.testing.assert_allclose(f.mean, np.nanmean(X, axis=(0, 2)), rtol=1e-6)
    np.testing.assert_allclose(f.std, np.nanstd(X, axis=(0, 2)), rtol=1e-6)


def test_transform_nan_to_zero_and_mask():
    X = _windows()
    f = WindowFeaturizer(["a", "b", "c"]).fit(X)
    Z = f.transform(X)
    assert Z.shape == (50, 6, 10) and Z.dtype == np.float32
    assert Z[0, 0, 3] == 0.0 and Z[0, 3, 3] == 0.0
    assert (Z[4, 1] == 0).all() and (Z[4, 4] == 0).all()
    assert Z[0, 3, 2] == 1.0 and Z[5, 4, 0] == 1.0
    np.testing.assert_allclose(Z[1, 2], (X[1, 2] - f.mean[2]) / f.std[2], rtol=1e-5)
    assert set(np.unique(Z[:, 3:])) == {0.0, 1.0}


def test_all_nan_and_constant_channels():
    X = np.stack([np.full((4, 6), np.nan), np.full((4, 6), 3.0)], axis=1)
    f = WindowFeaturizer(["dead", "flat"]).fit(X)
    assert f.mean.tolist() == [0.0, 3.0] and f.std.tolist() == [1.0, 1e-6]
    Z = f.transform(X)
    assert not np.isnan(Z).any() and (Z[:, :2] == 0).all()
    assert (Z[:, 2] == 0).all() and (Z[:, 3] == 1).all()


def test_round_trip_through_json():
    X = _windows()
    f = WindowFeaturizer(["a", "b", "c"]).fit(X)
    g = WindowFeaturizer.from_dict(json.loads(json.dumps(f.to_dict())))
    assert g.channels == ["a", "b", "c"]
    np.testing.assert_array_equal(f.transform(X), g.transform(X))


def test_wrong_shapes_raise_clear_errors():
    f = WindowFeaturizer(["a", "b", "c"]).fit(_windows())
    with pytest.raises(ValueError, match=r"3 channels.*\(50, 2, 10\)"):
        f.transform(np.zeros((50, 2, 10)))
    with pytest.raises(ValueError, match="expected windows of shape"):
        f.transform(np.zeros((3, 10)))
    with pytest.raises(ValueError, match="not fitted"):
        WindowFeaturizer(["a"]).transform(np.zeros((1, 1, 4)))


def test_summary_features_by_hand():
    X = np.array([[[1.0, np.nan, 3.0, 5.0], [np.nan] * 4, [2.0, np.nan, np.nan, np.nan]]])
    F = summary_features(X)
    assert F.shape == (1, 18) and F.dtype == np.float32
    # observed (t, v) = (0, 1), (2, 3), (3, 5): slope = 6 / (14 / 3) = 9 / 7
    np.testing.assert_allclose(F[0, :6], [5.0, 3.0, np.sqrt(8 / 3), 1.0, 5.0, 9 / 7], rtol=1e-6)
    np.testing.assert_array_equal(F[0, 6:12], np.zeros(6))
    np.testing.assert_array_equal(F[0, 12:], [2.0, 2.0, 0.0, 2.0, 2.0, 0.0])


def test_summary_features_match_numpy_without_nan():
    X = np.random.default_rng(1).normal(size=(7, 2, 12))
    F = summary_features(X).reshape(7, 2, 6)
    t = np.arange(12)
    np.testing.assert_allclose(F[..., 0], X[..., -1], rtol=1e-5)
    np.testing.assert_allclose(F[..., 2], X.std(axis=2), rtol=1e-5)
    np.testing.assert_allclose(F[..., 5], np.polyfit(t, X.reshape(14, 12).T, 1)[0].reshape(7, 2), rtol=1e-4, atol=1e-6)


def test_summary_feature_names():
    names = summary_feature_names(["vib", "temp"])
    assert names[:6] == ["vib_last", "vib_mean", "vib_std", "vib_min", "vib_max", "vib_slope"]
    assert len(names) == 12 and names[6] == "temp_last"
