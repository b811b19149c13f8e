"""Window featuriser shared by training and serving: per-channel standardisation plus missing-value masks.

Numpy only, so the serving image needs neither torch nor pandas for it.
"""

from __future__ import annotations

import numpy as np

STD_FLOOR = 1e-6


class WindowFeaturizer:
    """Fit per-channel mean/std on (n, C, T) windows; transform to (n, 2C, T): standardised values (NaN -> 0), then masks."""

    def __init__(self, channels: list[str]):
        self.channels = list(channels)
        self.mean: np.ndarray | None = None
        self.std: np.ndarray | None = None

    def _check(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 3 or X.shape[1] != len(self.channels):
            raise ValueError(
                f"expected windows of shape (n, {len(self.channels)} channels, T) for channels {self.channels}, got shape {X.shape}"
            )
        return X

    def fit(self, X: np.ndarray) -> WindowFeaturizer:
        """Per-channel NaN-aware mean and std over (n, T); std floored at 1e-6; an all-NaN channel gets mean 0, std 1."""
        X = self._check(X)
        observed = ~np.isnan(X)
        count = observed.sum(axis=(0, 2))
        filled = np.where(observed, X, 0.0)
        mean = np.divide(filled.sum(axis=(0, 2)), count, out=np.zeros(len(self.channels)), where=count > 0)
        squares = np.where(observed, (X - mean[None, :, None]) ** 2, 0.0).sum(axis=(0, 2))
        std = np.sqrt(np.divide(squares, count, out=np.ones(len(self.channels)), where=count > 0))
        self.mean, self.std = mean, np.maximum(std, STD_FLOOR)
        return self

    def transform(self, X: np.ndarray) -> np.ndarray:
        """(n, C, T) -> (n, 2C, T) float32: [(X - mean) / std with NaN -> 0, 1.0 where observed else 0.0]."""
        if self.mean is None:
            raise ValueError("WindowFeaturizer is not fitted: call fit() or from_dict() first")
        X = self._check(X)
        observed = ~np.isnan(X)
        scaled = np.where(observed, (X - self.mean[None, :, None]) / self.std[None, :, None], 0.0)
        return np.concatenate([scaled, observed], axis=1).astype(np.float32)

    def to_dict(self) -> dict:
        """JSON-serialisable state: channels, mean, std."""
        if self.mean is None:
            raise ValueError("WindowFeaturizer is not fitted: nothing to serialise")
        return {"channels": self.channels, "mean": self.mean.tolist(), "std": self.std.tolist()}

    @classmethod
    def from_dict(cls, state: dict) -> WindowFeaturizer:
        """Inverse of to_dict."""
        if not len(state["channels"]) == len(state["mean"]) == len(state["std"]):
            raise ValueError("featurizer state has different numbers of channels, means and stds")
        featurizer = cls(state["channels"])
        featurizer.mean = np.asarray(state["mean"], dtype=np.float64)
        featurizer.std = np.asarray(state["std"], dtype=np.float64)
        return featurizer
