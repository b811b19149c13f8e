"""The supervised failure probability and the novelty probability combined into one calibrated probability.

A rule names the base logits it uses (BASES: the failure logit, the novelty logit, the logit of the larger of the
two probabilities); a monotone logistic regression (weights >= 0) fitted on validation windows turns them into the
combined probability, so every rule's output is calibrated on validation like the parts. Rules (RULES; add one by
registering its bases):

* supervised: the failure logit alone;
* novelty: the novelty logit alone;
* stacker: both;
* max: the logit of the larger probability.

A fitted rule is its weights over all BASES (zero for the unused ones) and an intercept: the exported graph computes
every base and needs nothing else (models/sensor/alert.py). `choose_rule` keeps the rule of lowest cross-fitted
validation NLL (folds grouped by unit, as the calibration's).
"""

from __future__ import annotations

import numpy as np
from sklearn.model_selection import GroupKFold

from models.calibration import cross_fitted_nll
from models.sensor.novelty import fit_monotone_logistic

CLIP = 1e-6
BASES = ("failure", "novelty", "larger")
RULES: dict[str, tuple[str, ...]] = {
    "supervised": ("failure",),
    "novelty": ("novelty",),
    "stacker": ("failure", "novelty"),
    "max": ("larger",),
}


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, np.float64), CLIP, 1 - CLIP)
    return np.log(p / (1 - p))


def base_logits(p_failure: np.ndarray, p_novel: np.ndarray) -> np.ndarray:
    """(n, len(BASES)) the logits every rule chooses from."""
    return np.stack([logit(p_failure), logit(p_novel), logit(np.maximum(p_failure, p_novel))], axis=1)


def fit_rule(name: str, p_failure: np.ndarray, p_novel: np.ndarray, y: np.ndarray) -> dict:
    """{"rule", "weights" (one per BASES), "intercept"} of rule `name` fitted on validation probabilities (n,) and
    labels (n,)."""
    used = [BASES.index(base) for base in RULES[name]]
    fitted, intercept = fit_monotone_logistic(base_logits(p_failure, p_novel)[:, used], y)
    weights = np.zeros(len(BASES))
    weights[used] = fitted
    return {"rule": name, "weights": [float(w) for w in weights], "intercept": intercept}


def combined_probability(p_failure: np.ndarray, p_novel: np.ndarray, fitted: dict) -> np.ndarray:
    """(n,) the combined probability of a fitted rule."""
    z = base_logits(p_failure, p_novel) @ np.asarray(fitted["weights"]) + fitted["intercept"]
    return 1 / (1 + np.exp(-z))


def choose_rule(p_failure: np.ndarray, p_novel: np.ndarray, y: np.ndarray, groups: np.ndarray,
                rules: list[str] | None = None, folds: int = 5) -> tuple[dict, dict[str, float]]:
    """The rule of lowest cross-fitted NLL among `rules` (default: all), refitted on all of validation.
    Returns (fitted rule, {rule: cross-fitted NLL}); with fewer than 2 groups the first rule, unscored."""
    rules = rules or list(RULES)
    y = np.asarray(y).astype(int)
    n_groups = len(np.unique(groups))
    if n_groups < 2 or len(rules) == 1:
        return fit_rule(rules[0], p_failure, p_novel, y), {}
    splits = list(GroupKFold(n_splits=min(folds, n_groups)).split(p_failure, y, groups))
    scores = {name: cross_fitted_nll(y, splits, lambda fit, out: combined_probability(
        p_failure[out], p_novel[out], fit_rule(name, p_failure[fit], p_novel[fit], y[fit]))) for name in rules}
    best = min(scores, key=scores.get)
    return fit_rule(best, p_failure, p_novel, y), scores
