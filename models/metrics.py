"""Test and validation metrics (numpy/scikit-learn, torch-free); those the service also computes live in
models/quality.py (numpy alone)."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import fbeta_score, mean_absolute_error, precision_recall_curve, r2_score, roc_auc_score

from models.quality import average_precision, brier_score, expected_calibration_error, interval_coverage, rmse


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
        "pr_auc": average_precision(y, p),
        "roc_auc": float(roc_auc_score(y, p)) if both else float("nan"),
        "recall_at_p90": recall_at_precision(y, p, 0.9) if both else float("nan"),
        "f2": float(fbeta_score(y, (p >= threshold).astype(int), beta=2, zero_division=0)),
        "brier": brier_score(y, p),
        "ece": expected_calibration_error(y, p),
    }


def regression_metrics(
    y: np.ndarray, pred: np.ndarray, lower: np.ndarray | None = None, upper: np.ndarray | None = None
) -> dict[str, float]:
    """RMSE, MAE, R2 and, given an interval, its coverage and mean width. All arrays (n,)."""
    y = np.asarray(y, dtype=float)
    pred = np.asarray(pred, dtype=float)
    out = {
        "rmse": rmse(y, pred),
        "mae": float(mean_absolute_error(y, pred)),
        "r2": float(r2_score(y, pred)) if len(y) > 1 else float("nan"),
    }
    if lower is not None and upper is not None:
        out["coverage"] = interval_coverage(y, lower, upper)
        out["interval_width"] = float(np.mean(upper - lower))
    return out
