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


# ---------------------------------------------------------------- isotonic calibration and the choice of method

ISOTONIC_FLOOR = 1e-3  # isotonic probabilities are kept in [1e-3, 1 - 1e-3] (finite NLL, no certain alerts)


def fit_isotonic(p: np.ndarray, y: np.ndarray) -> tuple[list[float], list[float]]:
    """Isotonic regression of y on p (both (n,)): knots (x, y) of the increasing piecewise-linear map,
    constant beyond the ends (np.interp semantics), outputs in [ISOTONIC_FLOOR, 1 - ISOTONIC_FLOOR]."""
    from sklearn.isotonic import IsotonicRegression

    iso = IsotonicRegression(y_min=ISOTONIC_FLOOR, y_max=1 - ISOTONIC_FLOOR, out_of_bounds="clip")
    iso.fit(np.asarray(p, dtype=float), np.asarray(y, dtype=float))
    return [float(v) for v in iso.X_thresholds_], [float(v) for v in iso.y_thresholds_]


def piecewise_linear(p: np.ndarray, knots_x: list[float], knots_y: list[float]) -> np.ndarray:
    """The isotonic map: linear between knots, constant outside."""
    return np.interp(np.asarray(p, dtype=float), knots_x, knots_y)


def calibrated_probability(logits: np.ndarray, calibration: dict) -> np.ndarray:
    """Ensemble probability (n,) from member logits (n, members) under a calibration dict
    ({"method": "temperature", "temperature": T} or {"method": "isotonic", "knots_x", "knots_y"}).
    The same arithmetic runs inside the exported ONNX graph (models/sensor/calibrated.py)."""
    if calibration["method"] == "isotonic":
        return piecewise_linear(ensemble_probability(logits), calibration["knots_x"], calibration["knots_y"])
    return ensemble_probability(logits, calibration["temperature"])


def fit_calibration(logits: np.ndarray, y: np.ndarray, method: str) -> dict:
    """Fit one method on (logits (n, members), y (n,)) -> calibration dict."""
    if method == "temperature":
        return {"method": "temperature", "temperature": fit_temperature(logits, y)}
    if method == "isotonic":
        knots_x, knots_y = fit_isotonic(ensemble_probability(logits), y)
        return {"method": "isotonic", "temperature": 1.0, "knots_x": knots_x, "knots_y": knots_y}
    raise ValueError(f"unknown calibration method '{method}' (temperature | isotonic)")


def binary_nll(y: np.ndarray, p: np.ndarray, eps: float = 1e-7) -> float:
    p = np.clip(np.asarray(p, dtype=float), eps, 1 - eps)
    y = np.asarray(y, dtype=float)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def select_calibration(logits: np.ndarray, y: np.ndarray, groups: np.ndarray | None, methods: list[str],
                       folds: int = 5) -> tuple[dict, dict[str, float]]:
    """Choose among `methods` by cross-fitted validation NLL (grouped folds, e.g. by unit, so the score is
    not measured on what the map was fitted to), then refit the winner on all of validation.

    Returns (calibration dict of the winner, {method: cross-fitted NLL}).
    """
    from sklearn.model_selection import GroupKFold, StratifiedKFold

    y = np.asarray(y).astype(int)
    groups = np.arange(len(y)) if groups is None else np.asarray(groups)
    n_groups = len(np.unique(groups))
    if len(methods) == 1 or n_groups < 2 or len(np.unique(y)) < 2:
        return fit_calibration(logits, y, methods[0]), {}
    if n_groups >= 2 and n_groups < len(y):
        splits = list(GroupKFold(n_splits=min(folds, n_groups)).split(logits, y, groups))
    else:
        splits = list(StratifiedKFold(n_splits=min(folds, int(np.bincount(y).min()) or 2), shuffle=True,
                                      random_state=0).split(logits, y))
    scores = {}
    for method in methods:
        p = np.empty(len(y))
        for fit_idx, eval_idx in splits:
            if len(np.unique(y[fit_idx])) < 2:
                p[eval_idx] = y[fit_idx].mean()
                continue
            p[eval_idx] = calibrated_probability(logits[eval_idx], fit_calibration(logits[fit_idx], y[fit_idx], method))
        scores[method] = binary_nll(y, p)
    best = min(scores, key=scores.get)
    return fit_calibration(logits, y, best), scores
