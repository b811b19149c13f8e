"""Train/val/test assignment of the rows of a sensor frame: by whole unit, by time, or from a column; never by window."""

from __future__ import annotations

import numpy as np
import pandas as pd

from data.sensors.config import SensorDataConfig


def _split_counts(n: int, val_fraction: float, test_fraction: float) -> tuple[int, int, int]:
    """(train, val, test) sizes of n items; val and test get at least one each when n >= 3."""
    n_val, n_test = round(val_fraction * n), round(test_fraction * n)
    if n >= 3:
        n_val, n_test = max(n_val, 1), max(n_test, 1)
    return n - n_val - n_test, n_val, n_test


def _unit_splits(df: pd.DataFrame, cfg: SensorDataConfig) -> np.ndarray:
    """Whole units per split: sorted order, or seeded shuffle stratified by "has a positive row"."""
    units = pd.unique(df["unit"])
    if cfg.unit_order == "sorted":
        groups = [units]
    else:
        rng = np.random.default_rng(cfg.seed)
        positive = set(df.loc[df["label"] == 1, "unit"])
        groups = [rng.permutation([u for u in units if u in positive]), rng.permutation([u for u in units if u not in positive])]
    split_of = {}
    for group in groups:
        counts = _split_counts(len(group), cfg.val_fraction, cfg.test_fraction)
        split_of.update(zip(group, np.repeat(["train", "val", "test"], counts)))
    return df["unit"].map(split_of).to_numpy(dtype=str)


def _time_splits(df: pd.DataFrame, cfg: SensorDataConfig) -> np.ndarray:
    """Global time quantiles: the first 1 - val - test share of time is train, then val, then test."""
    time = df["time"].to_numpy(dtype=float)
    train_end = np.quantile(time, 1 - cfg.val_fraction - cfg.test_fraction)
    val_end = np.quantile(time, 1 - cfg.test_fraction)
    return np.where(time < train_end, "train", np.where(time < val_end, "val", "test"))


def assign_splits(df: pd.DataFrame, cfg: SensorDataConfig) -> np.ndarray:
    """(n_rows,) str array of 'train'/'val'/'test' for a validated canonical frame, per cfg.split."""
    if cfg.split == "unit":
        return _unit_splits(df, cfg)
    if cfg.split == "time":
        return _time_splits(df, cfg)
    return df["split"].to_numpy(dtype=str)
