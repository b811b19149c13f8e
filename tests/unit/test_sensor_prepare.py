"""prepare_sensor_data end to end: default simulator stats, label flips, save/load, CMAPSS FD001 and SKAB."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

from data.sensors.config import SensorDataConfig
from data.sensors.prepare import load_prepared, prepare_sensor_data, prepare_sensor_frame, save_prepared
from data.sensors.sources import load_cmapss, load_skab

SPLITS = ("train", "val", "test")


@pytest.fixture(scope="module")
def default_prepared():
    return prepare_sensor_data(SensorDataConfig())


def test_default_config_has_rare_positives_in_every_split(default_prepared):
    r = default_prepared.report
    assert r["source"] == "simulator"
    for name in SPLITS:
        assert r["windows"][name] > 500
        assert 0.01 <= r["positives"][name] / r["windows"][name] <= 0.05
    assert sum(r["units"].values()) == 80
    w = default_prepared.windows["train"]
    assert w.X.shape[1:] == (len(default_prepared.channels), 32)
    assert np.isnan(w.X).any()


def test_prepare_is_deterministic(default_prepared):
    again = prepare_sensor_data(SensorDataConfig())
    for name in SPLITS:
        np.testing.assert_array_equal(again.windows[name].X, default_prepared.windows[name].X)
        np.testing.assert_array_equal(again.windows[name].y, default_prepared.windows[name].y)


def test_train_label_flips_are_seeded_and_counted():
    cfg = SensorDataConfig(train_label_flip_rate=0.2, simulator={"n_units": 12, "n_steps": 400})
    p = prepare_sensor_data(cfg)
    changed = p.windows["train"].y != p.y_clean_train
    assert changed.sum() == round(0.2 * len(p.y_clean_train)) == p.report["train_label_flips"]
    assert p.report["positives"]["train"] == p.y_clean_train.sum()
    np.testing.assert_array_equal(prepare_sensor_data(cfg).windows["train"].y, p.windows["train"].y)
    clean = prepare_sensor_data(cfg.model_copy(update={"train_label_flip_rate": 0.0}))
    np.testing.assert_array_equal(clean.windows["val"].y, p.windows["val"].y)


def test_withheld_training_labels_are_seeded_and_leave_the_other_splits_alone():
    cfg = SensorDataConfig(train_unlabelled_fraction=0.5, simulator={"n_units": 12, "n_steps": 400})
    p, full = prepare_sensor_data(cfg), prepare_sensor_data(cfg.model_copy(update={"train_unlabelled_fraction": 0.0}))
    assert len(full.unlabelled) == 0
    assert len(p.unlabelled) == round(0.5 * len(full.windows["train"])) == p.report["unlabelled_train_windows"]
    assert len(p.windows["train"]) + len(p.unlabelled) == len(full.windows["train"])
    assert (p.unlabelled.y == -1).all() and len(p.y_clean_train) == len(p.windows["train"])
    np.testing.assert_array_equal(prepare_sensor_data(cfg).unlabelled.time, p.unlabelled.time)
    for name in ("val", "test"):
        np.testing.assert_array_equal(p.windows[name].y, full.windows[name].y)


def test_constant_channel_is_dropped_and_reported():
    df = pd.DataFrame({"unit": np.repeat(["a", "b", "c"], 20), "time": np.tile(np.arange(20), 3)})
    df["wobble"], df["flat"], df["label"] = np.sin(np.arange(60)), 1.0, np.tile(np.r_[np.zeros(19, int), 1], 3)
    cfg = SensorDataConfig(window=5, stride=1, horizon=2)
    p = prepare_sensor_frame(df, cfg, "mem")
    assert p.channels == ["wobble"] and p.report["dropped_channels"] == ["flat"]
    kept = prepare_sensor_frame(df, cfg.model_copy(update={"drop_constant": False}), "mem")
    assert kept.channels == ["wobble", "flat"] and kept.windows["test"].X.shape[1] == 2


def test_save_load_round_trip_and_byte_identical_resave(tmp_path, monkeypatch):
    p = prepare_sensor_data(SensorDataConfig(train_label_flip_rate=0.1, simulator={"n_units": 10, "n_steps": 300}))
    save_prepared(p, tmp_path / "a")
    q = load_prepared(tmp_path / "a")
    assert q.channels == p.channels and q.report == p.report
    np.testing.assert_array_equal(q.y_clean_train, p.y_clean_train)
    for name in SPLITS:
        for field in ("X", "y", "unit", "time"):
            np.testing.assert_array_equal(getattr(q.windows[name], field), getattr(p.windows[name], field))
        assert q.windows[name].X.dtype == np.float32
    monkeypatch.setattr(time, "time", lambda: 2_000_000_000.0)  # a different wall clock must not change the bytes
    save_prepared(q, tmp_path / "b")
    for name in ("train.npz", "val.npz", "test.npz", "meta.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


@pytest.mark.shared_data
def test_cmapss_fd001_loads(shared_data):
    df = load_cmapss(shared_data / "cmapss_fd001" / "train_FD001.txt.gz")
    assert df.shape == (20631, 27)
    assert df["unit"].nunique() == 100 and df["label"].sum() == 100
    last = df.groupby("unit").tail(1)
    assert (last["label"] == 1).all() and last["unit"].iloc[0] == "e001"


@pytest.mark.shared_data
def test_cmapss_fd001_anchor_protocol(shared_data):
    """ANCHORS.md: engines 1-70 train, 71-85 val, 86-100 test, window 30, stride 1, RUL <= 30: test 2856 windows, 465 positive."""
    path = shared_data / "cmapss_fd001" / "train_FD001.txt.gz"
    df = load_cmapss(path)
    engine = df["unit"].str[1:].astype(int)
    df["split"] = np.where(engine <= 70, "train", np.where(engine <= 85, "val", "test"))
    cfg = SensorDataConfig(source="cmapss", path=path, window=30, stride=1, horizon=30, split="column")
    by_column = prepare_sensor_frame(df, cfg, str(path))
    assert by_column.report["windows"]["test"] == 2856 and by_column.report["positives"]["test"] == 465
    assert {"op_setting_3", "s1", "s18", "s19"} <= set(by_column.report["dropped_channels"])
    by_order = prepare_sensor_data(cfg.model_copy(update={"split": "unit", "unit_order": "sorted"}))
    assert by_order.report["windows"] == by_column.report["windows"]
    assert by_order.report["positives"] == by_column.report["positives"]
    np.testing.assert_array_equal(by_order.windows["test"].X, by_column.windows["test"].X)


@pytest.mark.shared_data
def test_skab_loads_and_prepares(shared_data):
    df = load_skab(shared_data / "skab")
    assert len(df) == 37401 and df["unit"].nunique() == 34 and df["label"].sum() == 13067
    assert {"valve1/0", "valve2/3", "other/14"} <= set(df["unit"])
    assert "datetime" not in df.columns and "changepoint" not in df.columns
    p = prepare_sensor_data(SensorDataConfig(source="skab", path=shared_data / "skab"))
    assert len(p.channels) == 8 and all(p.report["positives"][name] > 0 for name in SPLITS)
