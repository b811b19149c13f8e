"""Windows and splits: never crossing units or splits, horizon labels on a hand-built frame, unit and time splits."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from data.sensors.config import SensorDataConfig
from data.sensors.simulator import simulate_fleet
from data.sensors.split import assign_splits
from data.sensors.windows import horizon_labels, make_windows


@pytest.fixture
def tiny():
    """Unit A: t 0..9, fails at t 9, rows t 0-6 train and t 7-9 val. Unit B: t 0..5, anomaly at t 3, all test."""
    df = pd.DataFrame(
        {
            "unit": ["A"] * 10 + ["B"] * 6,
            "time": [*range(10), *range(6)],
            "v": [*range(10), *range(100, 106)],
            "label": [0] * 9 + [1] + [0, 0, 0, 1, 0, 0],
        }
    )
    df["w"] = -df["v"]
    splits = np.array(["train"] * 7 + ["val"] * 3 + ["test"] * 6)
    return df, splits


def test_horizon_labels_by_hand():
    unit = np.array(["A"] * 5 + ["B"] * 3)
    label = np.array([0, 0, 0, 0, 1, 0, 1, 0])
    assert horizon_labels(unit, label, 0).tolist() == [0, 0, 0, 0, 1, 0, 1, 0]
    assert horizon_labels(unit, label, 2).tolist() == [0, 0, 1, 1, 1, 1, 1, 0]
    # B's positive never leaks back into A: A's rows only see A
    assert horizon_labels(np.array(["A", "A", "B"]), np.array([0, 0, 1]), 5).tolist() == [0, 0, 1]


def test_horizon_labels_with_unlabelled_rows():
    """-1 rows: a row is unlabelled when its horizon reaches one and no failure; a known failure still wins."""
    unit = np.array(["A"] * 6 + ["B"] * 2)
    label = np.array([0, -1, 0, 0, 1, 0, 0, 0])
    assert horizon_labels(unit, label, 0).tolist() == [0, -1, 0, 0, 1, 0, 0, 0]
    assert horizon_labels(unit, label, 1).tolist() == [-1, -1, 0, 1, 1, 0, 0, 0]
    assert horizon_labels(unit, label, 3).tolist() == [-1, 1, 1, 1, 1, 0, 0, 0]
    # an unlabelled row of B is not A's
    assert horizon_labels(np.array(["A", "B"]), np.array([0, -1]), 3).tolist() == [0, -1]


def test_windows_by_hand_horizon_3(tiny):
    df, splits = tiny
    w = make_windows(df, ["v", "w"], window=3, stride=2, horizon=3, splits=splits)
    # segments A-train t0..6 -> ends 6, 4, 2; A-val t7..9 -> end 9 only; B-test t0..5 -> ends 5, 3
    # purged: A-train's ends 6 and 4 would look ahead into A's val rows (the failure at t9 labelled t6 positive)
    assert w["train"].time.tolist() == [2]
    assert w["train"].y.tolist() == [0]
    assert w["val"].time.tolist() == [9] and w["val"].y.tolist() == [1]
    assert w["test"].time.tolist() == [3, 5] and w["test"].y.tolist() == [1, 0]
    assert w["test"].unit.tolist() == ["B", "B"]
    np.testing.assert_array_equal(w["train"].X[0], [[0, 1, 2], [0, -1, -2]])
    np.testing.assert_array_equal(w["test"].X[0], [[101, 102, 103], [-101, -102, -103]])
    assert w["train"].X.dtype == np.float32 and w["train"].X.shape == (1, 2, 3)
    assert w["train"].y.dtype == np.int8 and w["train"].time.dtype == np.int64


def test_no_window_is_labelled_across_a_split_boundary():
    """A time split of simulated machines: every kept window's look-ahead stays inside its own split's rows, and
    the units' last segments keep their windows up to the end."""
    df = simulate_fleet(SensorDataConfig().simulator.model_copy(update={"n_units": 8, "n_steps": 400}), 3)
    df = df.sort_values(["unit", "time"], ignore_index=True)
    cfg = SensorDataConfig(split="time", val_fraction=0.2, test_fraction=0.2)
    splits = assign_splits(df, cfg)
    horizon = 24
    windows = make_windows(df, ["vibration"], window=16, stride=4, horizon=horizon, splits=splits)
    split_at = {(u, t): s for u, t, s in zip(df["unit"], df["time"], splits)}
    last_time = df.groupby("unit")["time"].max()
    for name, w in windows.items():
        for unit, end in zip(w.unit, w.time):
            ahead = [split_at.get((unit, t)) for t in range(end, min(end + horizon, last_time[unit]) + 1)]
            assert set(ahead) == {name}, (name, unit, end)
    assert len(windows["test"]) and (windows["test"].time == last_time[windows["test"].unit].to_numpy()).any()


def test_windows_by_hand_horizon_0(tiny):
    df, splits = tiny
    w = make_windows(df, ["v"], window=3, stride=2, horizon=0, splits=splits)
    assert w["train"].y.tolist() == [0, 0, 0]
    assert w["val"].y.tolist() == [1]
    assert w["test"].y.tolist() == [1, 0]


def test_nan_kept_and_short_segments_give_no_window(tiny):
    df, splits = tiny
    df.loc[1, "v"] = np.nan
    w = make_windows(df, ["v"], window=4, stride=1, horizon=0, splits=splits)
    assert np.isnan(w["train"].X[0, 0, 1])
    assert len(w["val"]) == 0 and w["val"].X.shape == (0, 1, 4)  # the val segment has 3 rows


def _check_windows_inside_segments(df, splits, windows, window):
    key = pd.Series(df["unit"].astype(str) + "|" + splits)
    position = {(u, t): i for i, (u, t) in enumerate(zip(df["unit"], df["time"]))}
    for name, w in windows.items():
        for unit, end in zip(w.unit, w.time):
            last = position[(unit, end)]
            rows = key.iloc[last - window + 1 : last + 1]
            assert rows.nunique() == 1 and rows.iloc[0] == f"{unit}|{name}"


def test_simulated_windows_never_cross_units_or_splits():
    cfg = SensorDataConfig(split="time", window=16, stride=5, horizon=12, simulator={"n_units": 6, "n_steps": 300})
    df = simulate_fleet(cfg.simulator, 0)
    splits = assign_splits(df, cfg)
    windows = make_windows(df, cfg.simulator.channels, cfg.window, cfg.stride, cfg.horizon, splits)
    assert all(len(w) > 0 for w in windows.values())
    _check_windows_inside_segments(df, splits, windows, cfg.window)
    # a unit's last segment long enough for a window has one ending on its last row (failure-adjacent windows
    # included); an earlier segment's windows end a horizon before the next split (the purge)
    segments = df.assign(split=splits).groupby(["unit", "split"])["time"].agg(["max", "size"])
    long_enough = segments[segments["size"] >= cfg.window + cfg.horizon]
    assert len(long_enough) >= 12
    unit_last = df.groupby("unit")["time"].max()
    for (unit, name), t_last in long_enough["max"].items():
        ends = windows[name].time[windows[name].unit == unit]
        if t_last == unit_last[unit]:
            assert t_last in ends
        else:
            assert ends.max() + cfg.horizon <= t_last < ends.max() + cfg.horizon + cfg.stride


def test_unit_split_keeps_units_whole_and_spreads_failures():
    cfg = SensorDataConfig(seed=7)
    df = simulate_fleet(cfg.simulator, cfg.seed)
    splits = assign_splits(df, cfg)
    per_unit = pd.Series(splits).groupby(df["unit"]).nunique()
    assert (per_unit == 1).all()
    failing = df.groupby("unit")["label"].max()
    unit_split = pd.Series(splits).groupby(df["unit"]).first()
    assert set(unit_split[failing == 1]) == {"train", "val", "test"}
    assert unit_split.value_counts().to_dict() == {"train": 56, "val": 12, "test": 12}
    np.testing.assert_array_equal(splits, assign_splits(df, cfg))
    assert not np.array_equal(splits, assign_splits(df, cfg.model_copy(update={"seed": 8})))


def test_unit_split_sorted_order():
    df = pd.DataFrame({"unit": np.repeat([f"e{i:03d}" for i in range(1, 21)], 2), "time": [0, 1] * 20, "label": 0})
    splits = assign_splits(df, SensorDataConfig(unit_order="sorted"))
    assert splits.tolist() == ["train"] * 28 + ["val"] * 6 + ["test"] * 6


def test_time_split_is_ordered_in_time():
    cfg = SensorDataConfig(split="time", simulator={"n_units": 5, "n_steps": 200})
    df = simulate_fleet(cfg.simulator, 0)
    splits = assign_splits(df, cfg)
    t = df["time"].to_numpy()
    assert t[splits == "train"].max() < t[splits == "val"].min()
    assert t[splits == "val"].max() < t[splits == "test"].min()
    assert 0.6 < (splits == "train").mean() < 0.8


def test_column_split_is_taken_from_the_column():
    df = pd.DataFrame({"unit": ["a"] * 3, "time": [0, 1, 2], "label": 0, "split": ["train", "val", "test"]})
    assert assign_splits(df, SensorDataConfig(split="column")).tolist() == ["train", "val", "test"]
