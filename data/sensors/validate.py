"""Checks a canonical sensor frame before anything is computed from it; errors name the file and the column."""

from __future__ import annotations

import numpy as np
import pandas as pd
from pandas.api.types import is_numeric_dtype

from data.errors import DataValidationError
from data.sensors.config import SensorDataConfig

SPLITS = ("train", "val", "test")
_KEY_COLUMNS = ("unit", "time", "label", "split")
MAX_CELLS = 5  # bad cells named in a message


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
    infinite_time = np.isinf(df["time"].to_numpy(dtype=np.float64))
    if infinite_time.any():
        rows = np.flatnonzero(infinite_time)[:MAX_CELLS].tolist()
        raise DataValidationError(f"infinite time values (first rows {rows})", file=source, column=column_name(cfg, "time"))
    if df.duplicated(["unit", "time"]).any():
        raise DataValidationError("a unit has the same time twice", file=source, column=column_name(cfg, "time"))

    labels = df["label"]
    known = labels.dropna()
    if not is_numeric_dtype(labels) or not known.isin([0, 1]).all():
        bad = sorted(map(str, pd.unique(known[~known.isin([0, 1])])))[:5]
        raise DataValidationError(f"labels must be 0, 1 or missing (an unlabelled row), found {bad}", file=source,
                                  column=column_name(cfg, "label"))
    if known.empty:
        raise DataValidationError("every label is missing", file=source, column=column_name(cfg, "label"))

    if cfg.split == "column":
        bad = sorted(map(str, pd.unique(df["split"][~df["split"].isin(SPLITS)])))
        if bad:
            raise DataValidationError(f"split values must be train/val/test, found {bad}", file=source, column=column_name(cfg, "split"))

    if cfg.sensor_columns is None:
        channels = [c for c in df.columns if c not in _KEY_COLUMNS and _has_numbers(df[c])]
    else:
        channels = list(cfg.sensor_columns)
    if not channels:
        raise DataValidationError("no sensor columns (no numeric column besides unit, time, label and split)", file=source)
    for channel in channels:
        if channel not in df.columns:
            raise DataValidationError("missing sensor column", file=source, column=channel)
        if df[channel].dtype == bool:
            raise DataValidationError("sensor column is not numeric (dtype bool)", file=source, column=channel)
        if not is_numeric_dtype(df[channel]):
            raise DataValidationError(f"sensor column is not numeric: {_non_numeric_cells(df[channel])}", file=source, column=channel)
    return channels


def unused_columns(df: pd.DataFrame, channels: list[str]) -> list[str]:
    """Columns that are neither key columns nor sensor channels (e.g. a name or status column with sensor_columns: null)."""
    return [str(c) for c in df.columns if c not in _KEY_COLUMNS and c not in channels]


def check_finite(df: pd.DataFrame, channels: list[str], cfg: SensorDataConfig, source: str) -> tuple[pd.DataFrame, dict[str, int]]:
    """(frame, {channel: count}) with +-inf and values beyond float32 (windows are float32) masked as NaN when
    cfg.nonfinite is "as_missing"; with "error" such a value raises DataValidationError naming column and rows."""
    counts, out = {}, df
    for channel in channels:
        values = df[channel].to_numpy(dtype=np.float64)
        bad = np.isinf(values) | (np.abs(np.nan_to_num(values)) > np.finfo(np.float32).max)
        if not bad.any():
            continue
        if cfg.nonfinite == "error":
            rows = np.flatnonzero(bad)
            cells = ", ".join(f"row {r} {float(values[r])!r}" for r in rows[:MAX_CELLS])
            raise DataValidationError(
                f"{len(rows)} infinite or out-of-float32-range values ({cells}); fix them or set "
                "sensor.data.nonfinite: as_missing", file=source, column=str(channel))
        counts[str(channel)] = int(bad.sum())
        out = out.copy() if out is df else out
        out[channel] = np.where(bad, np.nan, values)
    return out, counts


def _has_numbers(values: pd.Series) -> bool:
    """Whether a column holds numbers: a numeric dtype, or any cell that parses as a number (its other cells
    are then errors, not a reason to skip the column)."""
    if is_numeric_dtype(values):
        return True
    return bool(pd.to_numeric(values, errors="coerce").notna().any())


def _non_numeric_cells(values: pd.Series) -> str:
    """The first non-numeric cells of a column as "N cells are not numbers (row 3 'hot', ...)"; rows from 0."""
    bad = pd.to_numeric(values, errors="coerce").isna() & values.notna()
    rows = np.flatnonzero(bad.to_numpy())
    cells = ", ".join(f"row {r} {values.iloc[r]!r}" for r in rows[:MAX_CELLS])
    return f"{len(rows)} of {len(values)} cells are not numbers ({cells})"
