"""A unit's normal and a window's departure from it (numpy only: the service fits references with it).

A unit's reference (`fit_reference`) is the mean and spread of the embeddings of its healthy windows and the log of
their typical reconstruction error (models/sensor/novelty.py scores them), shrunk towards the training fleet's normal
by PRIOR_WINDOWS windows' worth, so that a short reference is not over-trusted; a unit without one is scored against
the fleet's. A window's departure (`departure`) is two numbers: the log of the mean squared standardised distance of
its embedding from the reference over the E embedding dimensions, and the log of its reconstruction error over the
reference's typical error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PRIOR_WINDOWS = 8.0  # a reference of n windows weighs n / (n + PRIOR_WINDOWS) against the fleet's
EPS = 1e-6


def first_windows(units: np.ndarray, times: np.ndarray, count: int) -> np.ndarray:
    """(n,) bool: the `count` earliest windows of each unit (its reference period when it starts healthy)."""
    order = np.lexsort((times, units))
    sorted_units = units[order]
    starts = np.r_[0, np.flatnonzero(sorted_units[1:] != sorted_units[:-1]) + 1]
    rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    chosen = np.zeros(len(units), bool)
    chosen[order] = rank < count
    return chosen


@dataclass(frozen=True)
class Reference:
    """A unit's normal: embedding mean and spread (E,), the log of its typical reconstruction error, and how many
    windows it was fitted on (0: none, the fleet's normal stands in)."""

    mean: np.ndarray
    scale: np.ndarray
    log_error: float
    windows: int


def fit_reference(embeddings: np.ndarray, errors: np.ndarray, prior: Reference | None = None) -> Reference:
    """The reference of n healthy windows: embeddings (n, E), errors (n,). With a `prior` (the fleet's) the moments
    are shrunk towards it by PRIOR_WINDOWS; n = 0 gives the prior itself (with windows 0)."""
    n = len(embeddings)
    if n == 0:
        if prior is None:
            raise ValueError("a reference needs at least one window, or the fleet's reference to stand in")
        return Reference(prior.mean, prior.scale, prior.log_error, 0)
    mean, variance = embeddings.mean(axis=0), embeddings.var(axis=0)
    log_error = float(np.log(errors + EPS).mean())
    if prior is not None:
        own = n / (n + PRIOR_WINDOWS)
        variance = own * variance + (1 - own) * prior.scale ** 2
        mean = own * mean + (1 - own) * prior.mean
        log_error = own * log_error + (1 - own) * prior.log_error
    return Reference(mean.astype(np.float32), np.sqrt(variance + EPS).astype(np.float32), log_error, n)


def departure(embeddings: np.ndarray, errors: np.ndarray, mean: np.ndarray, scale: np.ndarray,
              log_error: np.ndarray) -> np.ndarray:
    """Each window against its unit's reference: embeddings (n, E), errors (n,), mean and scale (n, E), log_error (n,)
    -> (n, 2): [log mean squared standardised distance, log error - the reference's log error]."""
    distance = np.mean(((embeddings - mean) / scale) ** 2, axis=1)
    return np.stack([np.log(distance + EPS), np.log(errors + EPS) - log_error], axis=1).astype(np.float32)


def reference_windows(reference_steps: int, window: int, stride: int) -> int:
    """How many windows of `window` steps, `stride` apart, lie within a unit's first `reference_steps` rows (>= 1)."""
    return max(1, (reference_steps - window) // stride + 1)


def against_own_references(embeddings: np.ndarray, errors: np.ndarray, units: np.ndarray, reference: np.ndarray,
                           fleet: Reference) -> np.ndarray:
    """Departures (n, 2) of n windows, each against its unit's reference fitted on the windows marked in `reference`
    (n,) bool (shrunk to `fleet`; a unit with none marked gets the fleet's)."""
    mean, scale = np.empty_like(embeddings), np.empty_like(embeddings)
    log_error = np.empty(len(units), np.float32)
    for unit in np.unique(units):
        rows = units == unit
        own = fit_reference(embeddings[rows & reference], errors[rows & reference], fleet)
        mean[rows], scale[rows], log_error[rows] = own.mean, own.scale, own.log_error
    return departure(embeddings, errors, mean, scale, log_error)


def reference_to_dict(reference: Reference) -> dict:
    return {"mean": reference.mean.tolist(), "scale": reference.scale.tolist(), "log_error": reference.log_error,
            "windows": reference.windows}


def reference_from_dict(data: dict) -> Reference:
    return Reference(np.asarray(data["mean"], np.float32), np.asarray(data["scale"], np.float32),
                     float(data["log_error"]), int(data["windows"]))
