"""WindowFeaturizer (standardise + masks, relative channels against unit levels, JSON round trip) and the summary
features of the tabular baseline."""

from __future__ import annotations

import json

import numpy as np
import pytest

from data.sensors.featurize import WindowFeaturizer, channel_levels, first_windows, reference_levels, reference_windows
from data.sensors.prepare import PreparedSensorData
from data.sensors.summary_features import summary_feature_names, summary_features
from data.sensors.windows import Windows


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


def test_the_earliest_windows_of_each_unit_are_its_reference_whatever_the_order():
    units = np.array(["b", "a", "b", "a", "b", "a", "c"])
    times = np.array([30, 9, 10, 7, 20, 8, 1])
    assert first_windows(units, times, 2).tolist() == [False, False, True, True, True, True, True]
    assert reference_windows(100, 32, 4) == 18 and reference_windows(10, 32, 4) == 1


def _two_pumps(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two units, 20 windows each (3 channels, 8 steps): pump p0 runs at 30 L/min, p1 at 130; p1's last 5 windows
    drift 6 above its level on channel 0, still inside the fleet's range."""
    X = rng.normal(0.0, 1.0, (40, 3, 8))
    X[:20, 0] += 30.0
    X[20:, 0] += 130.0
    X[35:, 0] += 6.0
    X[3, 1, :] = np.nan
    units = np.repeat(["p0", "p1"], 20)
    times = np.tile(np.arange(20), 2)
    return X, units, times


def test_unit_levels_are_each_units_channel_means_over_its_first_windows():
    X, units, times = _two_pumps(np.random.default_rng(1))
    levels = reference_levels(X, units, times, 4)
    np.testing.assert_allclose(levels[:20], np.tile(np.nanmean(X[:4], axis=(0, 2)), (20, 1)))
    np.testing.assert_allclose(levels[20:], np.tile(np.nanmean(X[20:24], axis=(0, 2)), (20, 1)))
    dead = np.full((2, 2, 5), np.nan)
    dead[:, 0] = 1.0
    assert channel_levels(dead)[0] == 1.0 and np.isnan(channel_levels(dead)[1])


def test_relative_channels_put_each_unit_at_its_own_level_and_show_its_departure():
    X, units, times = _two_pumps(np.random.default_rng(2))
    levels = reference_levels(X, units, times, 4)
    f = WindowFeaturizer(["flow", "b", "c"], relative=True).fit(X, levels)
    Z = f.transform(X, levels)
    assert Z.shape == (40, 12, 8) and f.width == 12
    values, relative, masks = Z[:, :3], Z[:, 3:6], Z[:, 6:]
    np.testing.assert_array_equal(masks, np.concatenate([~np.isnan(X), ~np.isnan(X)], axis=1).astype(np.float32))
    healthy0, healthy1, drifted = relative[:20, 0].mean(), relative[20:35, 0].mean(), relative[35:, 0].mean()
    assert abs(values[:20, 0].mean() - values[20:35, 0].mean()) > 1.5  # standardised, the pumps stay apart
    assert abs(healthy0 - healthy1) < 0.25  # relative to their own levels they look alike
    assert drifted - healthy1 > 1.0  # and p1's drift stands out
    assert relative[3, 1].tolist() == [0.0] * 8  # a missing reading stays 0 with its mask 0


def test_a_window_without_a_unit_level_has_its_relative_channels_masked():
    X, units, times = _two_pumps(np.random.default_rng(3))
    levels = reference_levels(X, units, times, 4)
    f = WindowFeaturizer(["flow", "b", "c"], relative=True).fit(X, levels)
    unknown = levels.copy()
    unknown[:5] = np.nan
    unknown[7, 2] = np.nan
    known, got = f.transform(X, levels), f.transform(X, unknown)
    assert (got[:5, 3:6] == 0).all() and (got[:5, 9:] == 0).all()  # relative values and their masks
    np.testing.assert_array_equal(got[:5, :3], known[:5, :3])  # the values and their masks stay
    np.testing.assert_array_equal(got[:5, 6:9], known[:5, 6:9])
    assert (got[7, 5] == 0).all() and (got[7, 11] == 0).all()  # one channel's level unknown: that channel only
    np.testing.assert_array_equal(got[7, [3, 4, 9, 10]], known[7, [3, 4, 9, 10]])
    np.testing.assert_array_equal(got[5:7], known[5:7])
    np.testing.assert_array_equal(f.transform(X)[:, 3:6], np.zeros((40, 3, 8), np.float32))
    with pytest.raises(ValueError, match=r"unit levels of shape \(40 windows, 3 channels\)"):
        f.transform(X, levels[:, :2])
    with pytest.raises(ValueError, match="pass levels"):
        WindowFeaturizer(["flow", "b", "c"], relative=True).fit(X)


def test_relative_state_round_trips_and_an_older_state_has_no_relative_channels():
    X, units, times = _two_pumps(np.random.default_rng(4))
    levels = reference_levels(X, units, times, 4)
    f = WindowFeaturizer(["flow", "b", "c"], relative=True).fit(X, levels)
    g = WindowFeaturizer.from_dict(json.loads(json.dumps(f.to_dict())))
    assert g.relative and g.width == 12
    np.testing.assert_array_equal(f.transform(X, levels), g.transform(X, levels))
    older = {k: v for k, v in f.to_dict().items() if k != "relative"}
    assert not WindowFeaturizer.from_dict(older).relative and WindowFeaturizer.from_dict(older).width == 6
    broken = {**f.to_dict(), "relative": {"scale": [1.0]}}
    with pytest.raises(ValueError, match="different numbers"):
        WindowFeaturizer.from_dict(broken)


def test_training_and_unlabelled_windows_of_a_unit_share_its_level_from_its_earliest_windows():
    """A unit's earliest windows may have no label (they joined the unlabelled windows): its level is still theirs,
    for its labelled and unlabelled windows alike; a validation unit's comes from its own earliest windows."""
    rng = np.random.default_rng(5)

    def windows(level: float, times: np.ndarray, unit: str) -> Windows:
        X = (level + rng.normal(size=(len(times), 2, 4))).astype(np.float32)
        return Windows(X=X, y=np.zeros(len(times), np.int8), unit=np.full(len(times), unit), time=times)

    early, late = windows(0.0, np.arange(3), "a"), windows(50.0, np.arange(3, 9), "a")
    val = windows(7.0, np.arange(4), "b")
    prepared = PreparedSensorData(windows={"train": late, "val": val, "test": val}, channels=["x", "y"],
                                  y_clean_train=late.y, report={"reference_windows": 3}, unlabelled=early)
    expected = channel_levels(early.X)
    np.testing.assert_allclose(prepared.unit_levels("train"), np.tile(expected, (6, 1)))
    np.testing.assert_allclose(prepared.unit_levels("unlabelled"), np.tile(expected, (3, 1)))
    np.testing.assert_allclose(prepared.unit_levels("val"), np.tile(channel_levels(val.X[:3]), (4, 1)))
    featurizer = prepared.fit_featurizer(relative=True)
    assert prepared.features(featurizer, "train").shape == (6, 8, 4)
    dropped = prepared.features(featurizer, "train", level_dropout=0.5)
    without = (dropped[:, 6:] == 0).all(axis=(1, 2))  # relative masks all 0: the window has no level
    assert 0 < without.sum() < 6
    np.testing.assert_array_equal(dropped[~without], prepared.features(featurizer, "train")[~without])
    np.testing.assert_array_equal(dropped, prepared.features(featurizer, "train", level_dropout=0.5))  # seeded
    assert prepared.features(prepared.fit_featurizer(relative=False), "val").shape == (4, 4, 4)


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
