"""How an epoch draws its training windows and weighs their losses: `sensor.finetune.sampling`, a registry.

A sampling takes the labels y (n,), the epoch's generator and `uncertainty` (a function giving each training
window's uncertainty (n,) under the model as it stands, or None in the first epoch, before there is one) and returns
the epoch's order (n,) of window indices and per-window loss weights (n,). Add one by registering it in SAMPLINGS.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Uncertainty = Callable[[], np.ndarray] | None


def inverse_frequency(y: np.ndarray) -> np.ndarray:
    """(n,) weights 1 / (2 * class share), mean 1; ones when y holds one class."""
    positive = np.asarray(y) > 0.5
    if positive.all() or not positive.any():
        return np.ones(len(positive), np.float32)
    return np.where(positive, len(y) / (2 * positive.sum()), len(y) / (2 * (~positive).sum())).astype(np.float32)


def confidence_factors(y: np.ndarray, uncertainty: np.ndarray) -> np.ndarray:
    """(n,) factors: on the minority class 1 / (1 + u_i / mean u), rescaled to mean 1 there (a minority window the
    model is sure of counts more than one it is unsure of, likely mislabelled); 1 on the majority class."""
    positive = np.asarray(y) > 0.5
    minority = positive if positive.sum() <= (~positive).sum() else ~positive
    factors = np.ones(len(y), np.float32)
    u = np.asarray(uncertainty, np.float64)[minority]
    if minority.any() and u.mean() > 0:
        raw = 1.0 / (1.0 + u / u.mean())
        factors[minority] = raw / raw.mean()
    return factors


def _none(y, rng, uncertainty):
    return rng.permutation(len(y)), np.ones(len(y), np.float32)


def _uncertainty(y, rng, uncertainty):
    weights = inverse_frequency(y)
    if uncertainty is not None:
        weights = weights * confidence_factors(y, uncertainty())
    return rng.permutation(len(y)), weights.astype(np.float32)


SAMPLINGS: dict[str, Callable[[np.ndarray, np.random.Generator, Uncertainty], tuple[np.ndarray, np.ndarray]]] = {
    "none": _none,            # a permutation, equal weights
    "uncertainty": _uncertainty,  # inverse-frequency weights, minority windows weighed by the model's confidence
}
