"""Window featuriser shared by training and serving: per-channel standardisation plus missing-value masks, and
optionally each channel relative to its unit's normal level.

A unit's level is the mean of each channel over the unit's healthy reference windows (in training its earliest
windows, data.reference_steps rows; in serving the windows a user gives as the unit's reference). Two pumps at
different operating points then look alike when both run normally, and a fault shows as a departure from the pump's
own level even when the level itself is common in the fleet. A window whose unit has no level has its relative
channels masked as missing (training masks a share of windows' levels so the network answers those too).

Numpy only, so the serving image needs neither torch nor pandas for it.
"""

from __future__ import annotations

import numpy as np

STD_FLOOR = 1e-6


def channel_levels(X: np.ndarray) -> np.ndarray:
    """(C,) NaN-aware mean of each channel over all windows and steps of X (n, C, T); NaN for a channel never observed."""
    X = np.asarray(X, dtype=np.float64)
    observed = ~np.isnan(X)
    count = observed.sum(axis=(0, 2))
    total = np.where(observed, X, 0.0).sum(axis=(0, 2))
    return np.divide(total, count, out=np.full(X.shape[1], np.nan), where=count > 0)


def reference_windows(reference_steps: int, window: int, stride: int) -> int:
    """How many windows of `window` steps, `stride` apart, lie within a unit's first `reference_steps` rows (>= 1)."""
    return max(1, (reference_steps - window) // stride + 1)


def first_windows(units: np.ndarray, times: np.ndarray, count: int) -> np.ndarray:
    """(n,) bool: the `count` earliest windows of each unit (its reference period when it starts healthy)."""
    order = np.lexsort((times, units))
    sorted_units = units[order]
    starts = np.r_[0, np.flatnonzero(sorted_units[1:] != sorted_units[:-1]) + 1]
    rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    chosen = np.zeros(len(units), bool)
    chosen[order] = rank < count
    return chosen


def reference_levels(X: np.ndarray, units: np.ndarray, times: np.ndarray, count: int) -> np.ndarray:
    """(n, C): each window's unit level, fitted on the unit's `count` earliest windows of X (n, C, T)."""
    marked = first_windows(units, times, count)
    names, unit_of = np.unique(units, return_inverse=True)
    order = np.argsort(unit_of[marked], kind="stable")  # each unit's marked windows together, units in name order
    groups = np.split(X[marked][order], np.cumsum(np.bincount(unit_of[marked], minlength=len(names)))[:-1])
    return np.stack([channel_levels(group) for group in groups])[unit_of]


class WindowFeaturizer:
    """Fit per-channel mean/std on (n, C, T) windows; transform to (n, 2C, T): standardised values (NaN -> 0), then
    masks. With `relative`, (n, 4C, T): standardised values, values relative to the window's unit level (scaled by
    their training RMS), then the masks of both (a relative value is observed where its reading and its unit's level
    are; without a level it is 0 and masked)."""

    def __init__(self, channels: list[str], relative: bool = False):
        self.channels = list(channels)
        self.relative = relative
        self.mean: np.ndarray | None = None
        self.std: np.ndarray | None = None
        self.relative_scale: np.ndarray | None = None  # (C,) RMS of (reading - unit level) over training

    @property
    def width(self) -> int:
        """Channels of the featurised windows: 2C, or 4C with relative channels."""
        return (4 if self.relative else 2) * len(self.channels)

    def _check(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 3 or X.shape[1] != len(self.channels):
            raise ValueError(
                f"expected windows of shape (n, {len(self.channels)} channels, T) for channels {self.channels}, got shape {X.shape}"
            )
        return X

    def _levels(self, levels: np.ndarray | None, n: int) -> np.ndarray:
        """(n, C) levels, NaN where unknown (levels=None: every window's)."""
        if levels is None:
            return np.full((n, len(self.channels)), np.nan)
        levels = np.asarray(levels, dtype=np.float64)
        if levels.shape != (n, len(self.channels)):
            raise ValueError(f"expected unit levels of shape ({n} windows, {len(self.channels)} channels), got "
                             f"shape {levels.shape}")
        return levels

    def fit(self, X: np.ndarray, levels: np.ndarray | None = None) -> WindowFeaturizer:
        """Per-channel NaN-aware mean and std over (n, T); std floored at 1e-6; an all-NaN channel gets mean 0, std 1.
        With `relative`, levels (n, C): each window's unit level (reference_levels), giving the relative scale."""
        X = self._check(X)
        observed = ~np.isnan(X)
        count = observed.sum(axis=(0, 2))
        filled = np.where(observed, X, 0.0)
        mean = np.divide(filled.sum(axis=(0, 2)), count, out=np.zeros(len(self.channels)), where=count > 0)
        squares = np.where(observed, (X - mean[None, :, None]) ** 2, 0.0).sum(axis=(0, 2))
        std = np.sqrt(np.divide(squares, count, out=np.ones(len(self.channels)), where=count > 0))
        self.mean, self.std = mean, np.maximum(std, STD_FLOOR)
        if self.relative:
            if levels is None:
                raise ValueError("a relative featurizer is fitted with each window's unit level: pass levels")
            deviation = X - self._levels(levels, len(X))[:, :, None]
            known = ~np.isnan(deviation)
            squares = np.where(known, deviation, 0.0) ** 2
            known_count = known.sum(axis=(0, 2))
            rms = np.sqrt(np.divide(squares.sum(axis=(0, 2)), known_count, out=np.ones(len(self.channels)),
                                    where=known_count > 0))
            self.relative_scale = np.maximum(rms, STD_FLOOR)
        return self

    def transform(self, X: np.ndarray, levels: np.ndarray | None = None) -> np.ndarray:
        """(n, C, T) -> (n, 2C, T) float32: [(X - mean) / std with NaN -> 0, 1.0 where observed else 0.0]; with
        `relative`, (n, 4C, T): [scaled, (X - level) / relative_scale, observed, observed where the level is known].
        levels (n, C): each window's unit level, NaN where unknown (levels=None: unknown for every window)."""
        if self.mean is None:
            raise ValueError("WindowFeaturizer is not fitted: call fit() or from_dict() first")
        X = self._check(X)
        observed = ~np.isnan(X)
        scaled = np.where(observed, (X - self.mean[None, :, None]) / self.std[None, :, None], 0.0)
        if not self.relative:
            return np.concatenate([scaled, observed], axis=1).astype(np.float32)
        deviation = (X - self._levels(levels, len(X))[:, :, None]) / self.relative_scale[None, :, None]
        known = ~np.isnan(deviation)
        return np.concatenate([scaled, np.where(known, deviation, 0.0), observed, known], axis=1).astype(np.float32)

    def to_dict(self) -> dict:
        """JSON-serialisable state: channels, mean, std (and with `relative` the relative channels' scale)."""
        if self.mean is None:
            raise ValueError("WindowFeaturizer is not fitted: nothing to serialise")
        state = {"channels": self.channels, "mean": self.mean.tolist(), "std": self.std.tolist()}
        if self.relative:
            state["relative"] = {"scale": self.relative_scale.tolist()}
        return state

    @classmethod
    def from_dict(cls, state: dict) -> WindowFeaturizer:
        """Inverse of to_dict (a state without `relative`: a featurizer without relative channels)."""
        relative = state.get("relative")
        sizes = [len(state["channels"]), len(state["mean"]), len(state["std"])]
        if relative is not None:
            sizes.append(len(relative["scale"]))
        if len(set(sizes)) != 1:
            raise ValueError("featurizer state has different numbers of channels, means, stds (and relative scales)")
        featurizer = cls(state["channels"], relative=relative is not None)
        featurizer.mean = np.asarray(state["mean"], dtype=np.float64)
        featurizer.std = np.asarray(state["std"], dtype=np.float64)
        if relative is not None:
            featurizer.relative_scale = np.asarray(relative["scale"], dtype=np.float64)
        return featurizer
