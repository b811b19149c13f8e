"""Checks a canonical sensor frame before anything is computed from it; errors name the file and the column."""

from __future__ import annotations

import pandas as pd
from pandas.api.types import is_numeric_dtype

from data.errors import DataValidationError
from data.sensors.config import SensorDataConfig

SPLITS = ("train", "val", "test")
_KEY_COLUMNS = ("unit", "time", "label", "split")


def column_name(cfg: SensorDataConfig, canonical: str) -> str:
    """The name the user knows for a canonical column: their own for a `file` source."""
    if cfg.source != "file":
        return canonical
    return {"unit": cfg.unit_column, "time": cfg.time_column, "label": cfg.label_column, "split": cfg.split_column}[canonical]


def validate_sensor_frame(df: pd.DataFrame, cfg: SensorDataConfig, source: str) -> list[str]:
    """Sensor channel names of a valid frame (cfg.sensor_columns, or every other numeric column); else DataValidationError."""
    required = ["unit", "time", "label", *(["split"] if cfg.split == "column" else [])]
    for canonical in required:
        if canonical not in df.columns:
            raise DataValidationError("missing column", file=source, column=column_name(cfg, canonical))
    if df.empty:
        raise DataValidationError("no rows", file=source)

    for canonical in ("unit", "time"):
        if df[canonical].isna().any():
            raise DataValidationError("missing values", file=source, column=column_name(cfg, canonical))
    if not is_numeric_dtype(df["time"]):
        raise DataValidationError("time must be numeric (steps); convert timestamps first", file=source, column=column_name(cfg, "time"))
    if df.duplicated(["unit", "time"]).any():
        raise DataValidationError("a unit has the same time twice", file=source, column=column_name(cfg, "time"))

    labels = df["label"]
    if not is_numeric_dtype(labels) or labels.isna().any() or not labels.isin([0, 1]).all():
        bad = sorted(map(str, pd.unique(labels[~labels.isin([0, 1])])))[:5]
        raise DataValidationError(f"labels must be 0 or 1, found {bad}", file=source, column=column_name(cfg, "label"))

    if cfg.split == "column":
        bad = sorted(map(str, pd.unique(df["split"][~df["split"].isin(SPLITS)])))
        if bad:
            raise DataValidationError(f"split values must be train/val/test, found {bad}", file=source, column=column_name(cfg, "split"))

    if cfg.sensor_columns is None:
        channels = [c for c in df.columns if c not in _KEY_COLUMNS and is_numeric_dtype(df[c])]
    else:
        channels = list(cfg.sensor_columns)
    if not channels:
        raise DataValidationError("no sensor columns (no numeric column besides unit, time, label and split)", file=source)
    for channel in channels:
        if channel not in df.columns:
            raise DataValidationError("missing sensor column", file=source, column=channel)
        if not is_numeric_dtype(df[channel]) or df[channel].dtype == bool:
            raise DataValidationError(f"sensor column is not numeric (dtype {df[channel].dtype})", file=source, column=channel)
    return channels
