"""Output quality on labelled outcomes in numpy alone, shared by models/metrics.py (the pipeline) and the service:
Brier score, expected calibration error, PR-AUC (average precision), RMSE and interval coverage. All arrays (n,)."""

from __future__ import annotations

import numpy as np


def brier_score(y: np.ndarray, p: np.ndarray) -> float:
    """Mean squared gap between 0/1 labels `y` and probabilities `p` of class 1."""
    return float(np.mean((np.asarray(p, dtype=float) - np.asarray(y, dtype=float)) ** 2))


def expected_calibration_error(y: np.ndarray, p: np.ndarray, n_bins: int = 15) -> float:
    """ECE with equal-width bins: sum over bins of |accuracy - confidence| weighted by bin share.

    y: (n,) 0/1 labels; p: (n,) probabilities of class 1.
    """
    y = np.asarray(y, dtype=float)
    p = np.asarray(p, dtype=float)
    bins = np.minimum((p * n_bins).astype(int), n_bins - 1)
    ece = 0.0
    for b in range(n_bins):
        in_bin = bins == b
        if in_bin.any():
            ece += in_bin.mean() * abs(y[in_bin].mean() - p[in_bin].mean())
    return float(ece)


def average_precision(y: np.ndarray, p: np.ndarray) -> float:
    """PR-AUC as average precision: sum over thresholds of (recall step) * precision, tied scores taken together
    (scikit-learn's average_precision_score). NaN unless `y` holds both classes."""
    y = np.asarray(y, dtype=float)
    p = np.asarray(p, dtype=float)
    if len(np.unique(y)) != 2:
        return float("nan")
    order = np.argsort(-p, kind="mergesort")
    p, y = p[order], y[order]
    last_of_tie = np.r_[np.flatnonzero(np.diff(p)), len(p) - 1]
    true_positives = np.cumsum(y)[last_of_tie]
    precision = true_positives / (last_of_tie + 1)
    recall = true_positives / true_positives[-1]
    return float(np.sum(np.diff(recall, prepend=0.0) * precision))


def rmse(y: np.ndarray, predicted: np.ndarray) -> float:
    return float(np.sqrt(np.mean((np.asarray(y, dtype=float) - np.asarray(predicted, dtype=float)) ** 2)))


def interval_coverage(y: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> float:
    """Share of `y` inside [lower, upper]."""
    y = np.asarray(y, dtype=float)
    return float(np.mean((y >= lower) & (y <= upper)))
