"""Test and validation metrics (numpy/scikit-learn, torch-free)."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import (
    average_precision_score,
    brier_score_loss,
    fbeta_score,
    mean_absolute_error,
    precision_recall_curve,
    r2_score,
    roc_auc_score,
)


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


def recall_at_precision(y: np.ndarray, p: np.ndarray, min_precision: float) -> float:
    """Highest recall reachable with precision >= min_precision (0 if never reached)."""
    precision, recall, _ = precision_recall_curve(y, p)
    ok = precision >= min_precision
    return float(recall[ok].max()) if ok.any() else 0.0


def classification_metrics(y: np.ndarray, p: np.ndarray, threshold: float = 0.5) -> dict[str, float]:
    """PR-AUC, ROC-AUC, recall at precision 0.9, F2 at `threshold`, Brier score and ECE (15 bins).

    y: (n,) 0/1 labels; p: (n,) calibrated probabilities of class 1.
    """
    y = np.asarray(y).astype(int)
    p = np.asarray(p, dtype=float)
    both = len(np.unique(y)) == 2
    return {
        "pr_auc": float(average_precision_score(y, p)) if both else float("nan"),
        "roc_auc": float(roc_auc_score(y, p)) if both else float("nan"),
        "recall_at_p90": recall_at_precision(y, p, 0.9) if both else float("nan"),
        "f2": float(fbeta_score(y, (p >= threshold).astype(int), beta=2, zero_division=0)),
        "brier": float(brier_score_loss(y, p)),
        "ece": expected_calibration_error(y, p),
    }


def regression_metrics(
    y: np.ndarray, pred: np.ndarray, lower: np.ndarray | None = None, upper: np.ndarray | None = None
) -> dict[str, float]:
    """RMSE, MAE, R2 and, given an interval, its coverage and mean width. All arrays (n,)."""
    y = np.asarray(y, dtype=float)
    pred = np.asarray(pred, dtype=float)
    out = {
        "rmse": float(np.sqrt(np.mean((y - pred) ** 2))),
        "mae": float(mean_absolute_error(y, pred)),
        "r2": float(r2_score(y, pred)) if len(y) > 1 else float("nan"),
    }
    if lower is not None and upper is not None:
        out["coverage"] = float(np.mean((y >= lower) & (y <= upper)))
        out["interval_width"] = float(np.mean(upper - lower))
    return out
