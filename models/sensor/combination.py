"""The supervised failure probability and the novelty probability combined into one calibrated probability.

A rule maps the two probabilities to logit features; a monotone logistic regression (weights >= 0) fitted on
validation windows turns them into the combined probability, so every rule's output is calibrated on validation
like the parts. Rules (RULES; add one by registering its feature map):

* supervised: the classifier's logit alone;
* novelty: the novelty logit alone;
* stacker: both logits;
* max: the logit of the larger probability.

`choose_rule` keeps the rule of lowest cross-fitted validation NLL (folds grouped by unit, as the calibration's).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from sklearn.model_selection import GroupKFold

from models.calibration import binary_nll
from models.sensor.novelty import fit_monotone_logistic

CLIP = 1e-6
RULES: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {}


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, np.float64), CLIP, 1 - CLIP)
    return np.log(p / (1 - p))


def rule(name: str):
    def register(features: Callable[[np.ndarray, np.ndarray], np.ndarray]):
        RULES[name] = features
        return features
    return register


@rule("supervised")
def _supervised(p_failure: np.ndarray, p_novel: np.ndarray) -> np.ndarray:
    return logit(p_failure)[:, None]


@rule("novelty")
def _novelty(p_failure: np.ndarray, p_novel: np.ndarray) -> np.ndarray:
    return logit(p_novel)[:, None]


@rule("stacker")
def _stacker(p_failure: np.ndarray, p_novel: np.ndarray) -> np.ndarray:
    return np.stack([logit(p_failure), logit(p_novel)], axis=1)


@rule("max")
def _max(p_failure: np.ndarray, p_novel: np.ndarray) -> np.ndarray:
    return logit(np.maximum(p_failure, p_novel))[:, None]


def fit_rule(name: str, p_failure: np.ndarray, p_novel: np.ndarray, y: np.ndarray) -> dict:
    """{"rule", "weights", "intercept"} of rule `name` fitted on validation probabilities (n,) and labels (n,)."""
    weights, intercept = fit_monotone_logistic(RULES[name](p_failure, p_novel), y)
    return {"rule": name, "weights": [float(w) for w in weights], "intercept": intercept}


def combined_probability(p_failure: np.ndarray, p_novel: np.ndarray, fitted: dict) -> np.ndarray:
    """(n,) the combined probability of a fitted rule."""
    z = RULES[fitted["rule"]](p_failure, p_novel) @ np.asarray(fitted["weights"]) + fitted["intercept"]
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
    scores = {}
    for name in rules:
        p = np.empty(len(y))
        for fit_idx, eval_idx in splits:
            if len(np.unique(y[fit_idx])) < 2:
                p[eval_idx] = y[fit_idx].mean()
                continue
            fitted = fit_rule(name, p_failure[fit_idx], p_novel[fit_idx], y[fit_idx])
            p[eval_idx] = combined_probability(p_failure[eval_idx], p_novel[eval_idx], fitted)
        scores[name] = binary_nll(y, p)
    best = min(scores, key=scores.get)
    return fit_rule(best, p_failure, p_novel, y), scores
