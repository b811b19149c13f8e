"""Sliding windows over a sorted sensor frame, labelled by whether a failure row follows within a horizon.

A row's label is 1 (failure), 0 or -1 (missing: an unlabelled row). A window is positive when a failure row
follows within the horizon, unlabelled (-1) when none does but a row of its horizon has no label, else 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view

from data.sensors.validate import SPLITS


@dataclass
class Windows:
    """n windows: X (n, C, T) float32 with NaN kept, y (n,) int8 (-1: unlabelled), unit (n,) str, time (n,) int64
    time of the last row."""

    X: np.ndarray
    y: np.ndarray
    unit: np.ndarray
    time: np.ndarray

    def __len__(self) -> int:
        return len(self.y)

    def take(self, mask: np.ndarray) -> "Windows":
        """The windows where the boolean (n,) mask holds, in order."""
        return Windows(X=self.X[mask], y=self.y[mask], unit=self.unit[mask], time=self.time[mask])


def _changes(keys: np.ndarray) -> np.ndarray:
    """(n,) bool, True where a key differs from the previous row's (and on row 0)."""
    return np.r_[True, keys[1:] != keys[:-1]]


def _run_bounds(new_run: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n,) first and last row index of the run each row belongs to; a run starts where `new_run` is True."""
    n = len(new_run)
    starts = np.flatnonzero(new_run)
    ends = np.r_[starts[1:] - 1, n - 1]
    run = np.cumsum(new_run) - 1
    return starts[run], ends[run]


def _next_row(flag: np.ndarray) -> np.ndarray:
    """(n,) index of the first row at or after each row where `flag` holds (n where none does)."""
    n = len(flag)
    return np.minimum.accumulate(np.where(flag, np.arange(n), n)[::-1])[::-1]


def horizon_labels(unit: np.ndarray, label: np.ndarray, horizon: int) -> np.ndarray:
    """(n,) int8 per row of label (n,) 1/0/-1, rows sorted by unit, time: 1 where a label-1 row of the same unit
    lies within rows [i, i + horizon]; else -1 where an unlabelled (-1) row does; else 0."""
    _, unit_end = _run_bounds(_changes(unit))
    last = np.minimum(np.arange(len(label)) + horizon, unit_end)
    positive = _next_row(label == 1) <= last
    unknown = _next_row(label < 0) <= last
    return np.where(positive, 1, np.where(unknown, -1, 0)).astype(np.int8)


def make_windows(
    df: pd.DataFrame, channels: list[str], window: int, stride: int, horizon: int, splits: np.ndarray
) -> dict[str, Windows]:
    """{'train', 'val', 'test'} -> Windows from a frame sorted by unit, time, with `splits` (n_rows,) per row.

    A window lies inside one segment (consecutive rows of one unit in one split) and its end rows step back by
    `stride` from the segment's last row. Its label looks ahead `horizon` rows in the same unit. A window whose
    look-ahead would cross into the unit's next segment (another split: split=time or column) is purged, so no
    split is labelled by another split's failures.
    """
    unit = df["unit"].to_numpy(dtype=str)
    time = df["time"].to_numpy(dtype=np.int64)
    values = df[channels].to_numpy(dtype=np.float32)
    future = horizon_labels(unit, df["label"].to_numpy(), horizon)

    seg_start, seg_end = _run_bounds(_changes(unit) | _changes(splits))
    _, unit_end = _run_bounds(_changes(unit))
    rows = np.arange(len(df))
    is_end = (rows - seg_start >= window - 1) & ((seg_end - rows) % stride == 0)
    is_end &= (rows + horizon <= seg_end) | (seg_end == unit_end)  # the purge

    if len(values) < window:
        values = np.full((window, len(channels)), np.nan, dtype=np.float32)  # no window ends exist; keeps the view valid
    views = sliding_window_view(values, window, axis=0)  # (n_rows - window + 1, C, window)
    result = {}
    for name in SPLITS:
        ends = np.flatnonzero(is_end & (splits == name))
        result[name] = Windows(
            X=np.ascontiguousarray(views[ends - window + 1]),
            y=future[ends],
            unit=unit[ends],
            time=time[ends],
        )
    return result


def scoring_windows(df: pd.DataFrame, channels: list[str], window: int, stride: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Windows to score from readings sorted by unit, time (no labels): X (n, C, T) float32 with NaN kept, unit (n,)
    str, time (n,) int64 of each window's last row. As in training, a window lies inside one unit and the end rows
    step back by `stride` from the unit's last row, so each unit's latest reading ends a window."""
    unit = df["unit"].to_numpy(dtype=str)
    time = df["time"].to_numpy(dtype=np.int64)
    values = df[channels].to_numpy(dtype=np.float32)
    unit_start, unit_end = _run_bounds(_changes(unit)) if len(df) else (np.empty(0, int), np.empty(0, int))
    rows = np.arange(len(df))
    ends = np.flatnonzero((rows - unit_start >= window - 1) & ((unit_end - rows) % stride == 0))
    if len(values) < window:
        return np.empty((0, len(channels), window), np.float32), unit[:0], time[:0]
    views = sliding_window_view(values, window, axis=0)  # (n_rows - window + 1, C, window)
    return np.ascontiguousarray(views[ends - window + 1]), unit[ends], time[ends]
