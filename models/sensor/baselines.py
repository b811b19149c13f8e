"""The sensor baselines, torch-free: HistGradientBoosting on window summaries and MiniRocket with a
logistic regression whose C is chosen by grouped cross-validation over units (PR-AUC)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import average_precision_score
from sklearn.model_selection import GroupKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from data.sensors.featurize import WindowFeaturizer
from data.sensors.summary_features import summary_features
from models.sensor.minirocket import MiniRocket

Scorer = Callable[[np.ndarray], np.ndarray]  # raw windows (n, C, T) -> probability (n,)


def fit_hist_gradient_boosting(X: np.ndarray, y: np.ndarray, seed: int) -> Scorer:
    model = HistGradientBoostingClassifier(random_state=seed).fit(summary_features(X), y)
    return lambda windows: model.predict_proba(summary_features(windows))[:, 1]


def fit_minirocket(X: np.ndarray, y: np.ndarray, groups: np.ndarray, *, n_features: int = 10_000,
                   c_grid: list[float] = (1e-4, 1e-3, 1e-2, 1e-1, 1.0), folds: int = 3, seed: int = 0
                   ) -> tuple[Scorer, dict]:
    """MiniRocket features of the standardised windows (NaN -> 0), then StandardScaler + logistic
    regression; C = the grid value with the best mean PR-AUC over GroupKFold folds of `groups` (units).
    Returns the scorer and {"C": chosen, "cv_pr_auc": {C: score}}."""
    featurizer = WindowFeaturizer([str(i) for i in range(X.shape[1])]).fit(X)
    values = lambda windows: featurizer.transform(windows)[:, : X.shape[1]]  # noqa: E731
    rocket = MiniRocket(n_features, seed=seed).fit(values(X))
    F = rocket.transform(values(X))
    y = np.asarray(y).astype(int)

    def model(c: float):
        return make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=300))

    scores: dict[float, float] = {}
    n_groups = len(np.unique(groups))
    if len(c_grid) > 1 and n_groups >= 2:
        splits = list(GroupKFold(n_splits=min(folds, n_groups)).split(F, y, groups))
        for c in c_grid:
            fold_scores = [average_precision_score(y[ev], model(c).fit(F[fit], y[fit]).predict_proba(F[ev])[:, 1])
                           for fit, ev in splits if len(np.unique(y[fit])) == 2 and len(np.unique(y[ev])) == 2]
            scores[c] = float(np.mean(fold_scores)) if fold_scores else float("-inf")
        best = max(scores, key=scores.get)
    else:
        best = c_grid[0]
    final = model(best).fit(F, y)
    return (lambda windows: final.predict_proba(rocket.transform(values(windows)))[:, 1]), {
        "C": best, "cv_pr_auc": {str(k): v for k, v in scores.items()}}
