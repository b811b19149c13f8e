"""Post-hoc calibration fitted on the validation split (numpy/scipy, torch-free)."""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import expit
from sklearn.metrics import precision_recall_curve


def ensemble_probability(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Mean over members of sigmoid(logit / T). logits: (n, members) -> (n,)."""
    return expit(np.asarray(logits, dtype=float) / temperature).mean(axis=1)


def fit_temperature(logits: np.ndarray, y: np.ndarray) -> float:
    """Temperature T > 0 minimising the validation NLL of `ensemble_probability(logits, T)`.

    logits: (n, members); y: (n,) 0/1.
    """
    y = np.asarray(y, dtype=float)

    def nll(log_t: float) -> float:
        p = np.clip(ensemble_probability(logits, float(np.exp(log_t))), 1e-7, 1 - 1e-7)
        return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))

    best = minimize_scalar(nll, bounds=(np.log(0.05), np.log(20.0)), method="bounded")
    return float(np.exp(best.x))


def fit_interval_scale(residuals: np.ndarray, spread: np.ndarray) -> float:
    """Scale s so that residual / (s * spread) has unit mean square on validation (scaled variance).

    residuals, spread: (n,), spread > 0 (e.g. the ensemble's standard deviation).
    """
    z = np.asarray(residuals, dtype=float) / np.maximum(np.asarray(spread, dtype=float), 1e-8)
    return float(np.sqrt(np.mean(z**2)))


def choose_threshold(y: np.ndarray, p: np.ndarray, target_precision: float) -> float:
    """The lowest alert threshold whose validation precision reaches `target_precision`
    (the most recall at that precision); if none does, the threshold of best F2."""
    precision, recall, thresholds = precision_recall_curve(y, p)
    precision, recall = precision[:-1], recall[:-1]
    ok = np.flatnonzero(precision >= target_precision)
    if len(ok):
        return float(thresholds[ok[np.argmax(recall[ok])]])
    f2 = 5 * precision * recall / np.maximum(4 * precision + recall, 1e-12)
    return float(thresholds[np.argmax(f2)])
