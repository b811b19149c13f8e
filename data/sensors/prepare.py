"""The sensor data step: load, validate, split, window, check, optionally add training label noise; save and load.

Windows without a label (data/sensors/windows.py) leave the splits: training ones become the unlabelled windows
that semi-supervised fine-tuning uses (models/sensor/teacher.py), validation and test ones are dropped (counted).

Saved layout (byte-identical for identical inputs, so DVC sees no spurious change):
`train.npz`, `val.npz`, `test.npz` with X (n, C, T) float32, y (n,) int8, unit (n,) str, time (n,) int64
(train also y_clean, the labels before flipping), `unlabelled.npz` (y all -1), and `meta.json` with channels,
window, horizon and the report.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from data.errors import DataValidationError
from data.sensors.config import SensorDataConfig
from data.sensors.featurize import WindowFeaturizer, reference_levels, reference_windows
from data.sensors.sources import load_sensor_frame
from data.sensors.split import assign_splits
from data.sensors.validate import SPLITS, check_finite, column_name, unused_columns, validate_sensor_frame
from data.sensors.windows import Windows, make_windows


@dataclass
class PreparedSensorData:
    """Windows per split (train labels possibly flipped), channel names, clean train labels (n_train,), report,
    and the training windows without a label."""

    windows: dict[str, Windows]
    channels: list[str]
    y_clean_train: np.ndarray
    report: dict
    unlabelled: Windows

    def unit_levels(self, split: str) -> np.ndarray:
        """(n, C): each window's unit level (data/sensors/featurize.py) over the unit's `reference_windows` earliest
        windows in the split; training and unlabelled windows (of the same units) are taken together."""
        count = self.report["reference_windows"]
        if split in ("train", "unlabelled"):
            train, both = self.windows["train"], (self.windows["train"], self.unlabelled)
            levels = reference_levels(np.concatenate([w.X for w in both]), np.concatenate([w.unit for w in both]),
                                      np.concatenate([w.time for w in both]), count)
            return levels[:len(train)] if split == "train" else levels[len(train):]
        windows = self.windows[split]
        return reference_levels(windows.X, windows.unit, windows.time, count)

    def fit_featurizer(self, relative: bool) -> WindowFeaturizer:
        """The featurizer fitted on the training windows (with `relative`, and their unit levels)."""
        levels = self.unit_levels("train") if relative else None
        return WindowFeaturizer(self.channels, relative).fit(self.windows["train"].X, levels)

    def features(self, featurizer: WindowFeaturizer, split: str, level_dropout: float = 0.0) -> np.ndarray:
        """A split's ('train', 'val', 'test' or 'unlabelled') windows featurised, (n, 2C or 4C, T); with relative
        channels a seeded `level_dropout` share of the windows without their unit's level (as a unit without a
        reference is served), so that training teaches the network to answer those too."""
        windows = self.unlabelled if split == "unlabelled" else self.windows[split]
        if not featurizer.relative:
            return featurizer.transform(windows.X)
        levels = self.unit_levels(split)
        levels[np.random.default_rng([len(levels), 0]).random(len(levels)) < level_dropout] = np.nan
        return featurizer.transform(windows.X, levels)


def _constant_on(df: pd.DataFrame, channels: list[str], rows: np.ndarray) -> list[str]:
    """Channels with at most one distinct observed value on the selected rows."""
    counts = df.loc[rows, channels].nunique(dropna=True)
    return [channel for channel in channels if counts[channel] <= 1]


def _flip_labels(y: np.ndarray, rate: float, seed: int) -> np.ndarray:
    """Copy of y (n,) with round(rate * n) seeded random entries flipped 0 <-> 1."""
    rng = np.random.default_rng(seed)
    flipped = y.copy()
    idx = rng.choice(len(y), size=round(rate * len(y)), replace=False)
    flipped[idx] = 1 - flipped[idx]
    return flipped


def _withhold(train: Windows, fraction: float, seed: int) -> np.ndarray:
    """(n,) bool: a seeded round(fraction * n) of the training windows whose labels are withheld."""
    withheld = np.zeros(len(train), bool)
    withheld[np.random.default_rng([seed, 1]).choice(len(train), size=round(fraction * len(train)), replace=False)] = True
    return withheld


def prepare_sensor_frame(df: pd.DataFrame, cfg: SensorDataConfig, source: str) -> PreparedSensorData:
    """All of prepare_sensor_data after loading: for a canonical frame already in memory (`source` names it in errors)."""
    channels = validate_sensor_frame(df, cfg, source)
    df, nonfinite = check_finite(df, channels, cfg, source)
    longest = int(df.groupby("unit").size().max())
    if longest < cfg.window:
        raise DataValidationError(f"every unit is shorter than the window ({cfg.window} steps); the longest has {longest} rows",
                                  file=source, column=column_name(cfg, "time"))
    df = df.sort_values(["unit", "time"], kind="stable").reset_index(drop=True)
    df = df.assign(unit=df["unit"].astype(str), label=df["label"].fillna(-1).astype(np.int8))
    splits = assign_splits(df, cfg)

    dropped = _constant_on(df, channels, splits == "train") if cfg.drop_constant else []
    channels = [channel for channel in channels if channel not in dropped]
    if not channels:
        raise DataValidationError(f"every sensor channel is constant on the training split: {dropped}", file=source)

    windows = make_windows(df, channels, cfg.window, cfg.stride, cfg.horizon, splits)
    without_label = {name: int((split.y < 0).sum()) for name, split in windows.items()}
    withheld = (windows["train"].y < 0) | _withhold(windows["train"], cfg.train_unlabelled_fraction, cfg.seed)
    unlabelled = windows["train"].take(withheld)
    unlabelled.y = np.full(len(unlabelled), -1, np.int8)
    windows = {name: split.take(~withheld if name == "train" else split.y >= 0) for name, split in windows.items()}
    label = column_name(cfg, "label")
    for name, split in windows.items():
        if len(split) == 0:
            raise DataValidationError(f"split '{name}' has no windows of {cfg.window} steps", file=source, column=label)
        if split.y.sum() == 0:
            raise DataValidationError(
                f"split '{name}' has no positive window (no label 1 within horizon {cfg.horizon})", file=source, column=label
            )

    y_clean = windows["train"].y
    windows["train"].y = _flip_labels(y_clean, cfg.train_label_flip_rate, cfg.seed)
    report = {
        "source": source,
        "n_rows": len(df),
        "window": cfg.window,
        "stride": cfg.stride,
        "reference_steps": cfg.reference_steps,
        "reference_windows": reference_windows(cfg.reference_steps, cfg.window, cfg.stride),
        "horizon": cfg.horizon,
        "split": cfg.split,
        "units": {name: int(pd.unique(df["unit"][splits == name]).size) for name in SPLITS},
        "windows": {name: len(windows[name]) for name in SPLITS},
        "positives": {name: int((y_clean if name == "train" else windows[name].y).sum()) for name in SPLITS},
        "dropped_channels": dropped,
        "skipped_columns": unused_columns(df, channels + dropped),
        "nonfinite_as_missing": nonfinite,
        "train_label_flips": int((windows["train"].y != y_clean).sum()),
        "windows_without_label": without_label,
        "unlabelled_train_windows": len(unlabelled),
    }
    return PreparedSensorData(windows=windows, channels=channels, y_clean_train=y_clean, report=report,
                              unlabelled=unlabelled)


def prepare_sensor_data(cfg: SensorDataConfig) -> PreparedSensorData:
    """Load the configured source and prepare it: windows per split, channels kept, clean train labels, report."""
    df, source = load_sensor_frame(cfg)
    return prepare_sensor_frame(df, cfg, source)


def save_prepared(p: PreparedSensorData, out_dir: Path) -> None:
    """Write train/val/test .npz and meta.json into out_dir (created if needed)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, w in {**p.windows, "unlabelled": p.unlabelled}.items():
        arrays = {"X": w.X, "y": w.y, "unit": w.unit.astype(str), "time": w.time}
        if name == "train":
            arrays["y_clean"] = p.y_clean_train
        np.savez(out_dir / f"{name}.npz", **arrays)  # zip entries carry the fixed 1980 date: no timestamps
    meta = {"channels": p.channels, "window": p.report["window"], "horizon": p.report["horizon"], "report": p.report}
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def load_prepared(out_dir: Path) -> PreparedSensorData:
    """Read what save_prepared wrote."""
    out_dir = Path(out_dir)
    meta = json.loads((out_dir / "meta.json").read_text())
    windows, y_clean = {}, None
    for name in (*SPLITS, "unlabelled"):
        with np.load(out_dir / f"{name}.npz", allow_pickle=False) as npz:
            windows[name] = Windows(X=npz["X"], y=npz["y"], unit=npz["unit"], time=npz["time"])
            if name == "train":
                y_clean = npz["y_clean"]
    unlabelled = windows.pop("unlabelled")
    return PreparedSensorData(windows=windows, channels=meta["channels"], y_clean_train=y_clean, report=meta["report"],
                              unlabelled=unlabelled)
