"""Per-window summary statistics for the tabular (HistGradientBoosting) baseline: last, mean, std, min, max, slope."""

from __future__ import annotations

import numpy as np

STATS = ("last", "mean", "std", "min", "max", "slope")


def summary_feature_names(channels: list[str]) -> list[str]:
    """Names of the 6C columns of summary_features, channel-major: "<channel>_<stat>"."""
    return [f"{channel}_{stat}" for channel in channels for stat in STATS]


def summary_features(X: np.ndarray) -> np.ndarray:
    """(n, C, T) windows -> (n, 6C) float32, per channel: last observed value, mean, std (ddof 0), min, max and
    least-squares slope per step, all over the observed (non-NaN) steps; 0 for an all-NaN channel (slope 0 with one point)."""
    X = np.asarray(X, dtype=np.float64)
    n, c, t = X.shape
    observed = ~np.isnan(X)
    count = observed.sum(axis=2)
    any_observed = count > 0
    filled = np.where(observed, X, 0.0)

    last_index = t - 1 - np.argmax(observed[:, :, ::-1], axis=2)
    last = np.where(any_observed, np.take_along_axis(filled, last_index[:, :, None], axis=2)[:, :, 0], 0.0)
    mean = np.divide(filled.sum(axis=2), count, out=np.zeros((n, c)), where=any_observed)
    deviation = np.where(observed, X - mean[:, :, None], 0.0)
    std = np.sqrt(np.divide((deviation**2).sum(axis=2), count, out=np.zeros((n, c)), where=any_observed))
    low = np.where(any_observed, np.where(observed, X, np.inf).min(axis=2), 0.0)
    high = np.where(any_observed, np.where(observed, X, -np.inf).max(axis=2), 0.0)

    steps = np.broadcast_to(np.arange(t, dtype=np.float64), X.shape)
    mean_step = np.divide(np.where(observed, steps, 0.0).sum(axis=2), count, out=np.zeros((n, c)), where=any_observed)
    step_dev = np.where(observed, steps - mean_step[:, :, None], 0.0)
    step_var = (step_dev**2).sum(axis=2)
    slope = np.divide((step_dev * deviation).sum(axis=2), step_var, out=np.zeros((n, c)), where=step_var > 0)

    return np.stack([last, mean, std, low, high, slope], axis=2).reshape(n, 6 * c).astype(np.float32)
