"""The fleet simulator: determinism, failure labels, gaps, label-noise knobs, the default fleet."""

from __future__ import annotations

import numpy as np
import pandas as pd

from data.sensors.config import SimulatorConfig
from data.sensors.simulator import simulate_fleet

SMALL = SimulatorConfig(n_units=12, n_steps=400)


def test_same_seed_same_fleet_and_other_seed_differs():
    a, b, c = simulate_fleet(SMALL, 3), simulate_fleet(SMALL, 3), simulate_fleet(SMALL, 4)
    pd.testing.assert_frame_equal(a, b)
    assert not a.equals(c)


def test_columns_and_types():
    df = simulate_fleet(SMALL, 0)
    assert list(df.columns) == ["unit", "time", *SMALL.channels, "label"]
    assert df["unit"].iloc[0] == "m000"
    assert df["time"].dtype.kind == "i" and df["label"].dtype.kind == "i"
    assert set(df["label"].unique()) <= {0, 1}


def test_failing_units_end_with_their_only_positive_row():
    df = simulate_fleet(SMALL, 1)
    lengths = df.groupby("unit").size()
    positives = df.groupby("unit")["label"].sum()
    last_label = df.groupby("unit")["label"].last()
    failing = positives[positives > 0].index
    assert len(failing) == round(SMALL.failure_fraction * SMALL.n_units)
    assert (positives[failing] == 1).all() and (last_label[failing] == 1).all()
    assert (lengths[failing] < SMALL.n_steps).all()
    healthy = positives.index.difference(failing)
    assert (lengths[healthy] == SMALL.n_steps).all()
    assert (df.groupby("unit")["time"].apply(lambda t: (np.diff(t) == 1).all())).all()


def test_degradation_is_visible_before_failure():
    df = simulate_fleet(SimulatorConfig(n_units=20, n_steps=600, failure_fraction=0.5), 2)
    failing = df.groupby("unit")["label"].transform("sum") > 0
    first, last = df[failing].groupby("unit")["vibration"].first(), df[failing].groupby("unit")["vibration"].last()
    assert (last > first).mean() > 0.8  # vibration rises towards failure


def test_dropout_gaps_are_present_and_span_several_steps():
    df = simulate_fleet(SimulatorConfig(n_units=10, n_steps=500, dropout_rate=0.01), 0)
    missing = df["vibration"].isna().to_numpy()
    assert 0.01 < missing.mean() < 0.15
    assert (missing[1:] & missing[:-1]).any()
    assert df[["unit", "time", "label"]].notna().all().all()


def test_no_gaps_without_dropouts():
    assert not simulate_fleet(SimulatorConfig(n_units=5, n_steps=200, dropout_rate=0.0), 0).isna().any().any()


def test_label_shift_moves_recorded_failure_within_bound():
    base = simulate_fleet(SMALL, 5).groupby("unit")
    shifted = simulate_fleet(SMALL.model_copy(update={"label_shift_max": 10}), 5).groupby("unit")
    failing = base["label"].sum() > 0
    assert ((shifted["label"].sum() > 0) == failing).all()
    delta = shifted.size()[failing] - base.size()[failing]
    assert (delta.abs() <= 10).all() and (delta != 0).any()
    assert (shifted["label"].last()[failing] == 1).all()


def test_label_flip_rate_adds_noisy_positive_rows():
    noisy = simulate_fleet(SMALL.model_copy(update={"label_flip_rate": 0.02}), 0)
    rate = noisy["label"].mean()
    assert 0.01 < rate < 0.03


def test_default_fleet_has_its_machines_and_healthy_machines_run_to_the_end():
    cfg = SimulatorConfig()
    df = simulate_fleet(cfg, 0)
    lengths = df.groupby("unit").size()
    failing = df.groupby("unit")["label"].max() == 1
    assert len(lengths) == cfg.n_units and failing.sum() == round(cfg.failure_fraction * cfg.n_units)
    assert (lengths[~failing] == cfg.n_steps).all() and (lengths[failing] <= cfg.n_steps).all()


def test_plant_seed_keeps_the_plant_and_regime_shift_moves_every_level():
    plant = SMALL.model_copy(update={"plant_seed": 7, "dropout_rate": 0.0, "failure_fraction": 0.2})
    a, b = simulate_fleet(plant, 1), simulate_fleet(plant, 2)
    channels = SMALL.channels
    # same plant: channel levels agree within a few percent across fleets; without plant_seed they do not
    ratio = a[channels].median() / b[channels].median()
    assert np.allclose(ratio, 1.0, atol=0.1)
    other = simulate_fleet(SMALL.model_copy(update={"dropout_rate": 0.0}), 2)
    assert not np.allclose(a[channels].median() / other[channels].median(), 1.0, atol=0.1)
    shifted = simulate_fleet(plant.model_copy(update={"regime_shift": 1.0}), 1)
    # +1 adds 10% of each channel's (positive) level on every row of the same machines
    difference = (shifted[channels] - a[channels]).to_numpy()
    assert (difference > 0).all() and np.allclose(difference, difference[0], rtol=1e-9)
