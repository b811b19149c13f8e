"""A unit's normal and a window's departure from it (numpy only: the service fits references with it).

A window is described by the pretrained encoder's embedding (E) and its channels' means (C, the observed values in
WindowFeaturizer's standardised units): one (E + C,) vector (models/sensor/novelty.py). A unit's reference
(`fit_reference`) is the mean and spread of the descriptions of its healthy windows and the log of their typical
reconstruction error. Its mean is the unit's own (operating points differ between units: a pump at 32 or at 127 L/min
is normal either way); its spread and error are shrunk towards the fleet's by PRIOR_WINDOWS windows' worth, so that
a short reference is not over-trusted, the spread towards how much the fleet's units vary *within* their own
reference periods (`fit_fleet_reference`). A unit without a reference is scored against the fleet's normal, its mean
and its whole spread. A window's departure (`departure`) is three numbers: the log of the mean squared standardised
distance from the reference over the embedding's dimensions, the same over the channel means, and the log of its
reconstruction error over the reference's typical error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PRIOR_WINDOWS = 8.0  # a reference of n windows weighs n / (n + PRIOR_WINDOWS) against the fleet's
EPS = 1e-6


@dataclass(frozen=True)
class Reference:
    """A unit's normal: description mean and spread (D,), the log of its typical reconstruction error, and how many
    windows it was fitted on (0: none, the fleet's normal stands in). The fleet's reference also holds `within` (D,),
    the spread of its units' descriptions within their own reference periods."""

    mean: np.ndarray
    scale: np.ndarray
    log_error: float
    windows: int
    within: np.ndarray | None = None


def fit_reference(descriptions: np.ndarray, errors: np.ndarray, prior: Reference | None = None) -> Reference:
    """The reference of n healthy windows: descriptions (n, D), errors (n,). With a `prior` (the fleet's) the spread is
    shrunk towards its within-unit spread and the error towards its error by PRIOR_WINDOWS; n = 0 gives the prior
    itself (with windows 0)."""
    n = len(descriptions)
    if n == 0:
        if prior is None:
            raise ValueError("a reference needs at least one window, or the fleet's reference to stand in")
        return Reference(prior.mean, prior.scale, prior.log_error, 0)
    mean, variance = descriptions.mean(axis=0), descriptions.var(axis=0)
    log_error = float(np.log(errors + EPS).mean())
    if prior is not None:
        own = n / (n + PRIOR_WINDOWS)
        if prior.within is None:
            raise ValueError("the fleet's reference has no within-unit spread (`within`): export the model again")
        variance = own * variance + (1 - own) * prior.within ** 2
        log_error = own * log_error + (1 - own) * prior.log_error
    return Reference(mean.astype(np.float32), np.sqrt(variance + EPS).astype(np.float32), log_error, n)


def fit_fleet_reference(descriptions: np.ndarray, errors: np.ndarray, units: np.ndarray,
                        reference: np.ndarray) -> Reference:
    """The fleet's normal from its healthy windows: descriptions (n, D), errors (n,), units (n,); `reference` (n,)
    bool marks each unit's reference period, over which `within` (D,) is the root mean squared deviation from that
    unit's own mean."""
    fleet = fit_reference(descriptions, errors)
    deviations = [descriptions[rows] - descriptions[rows].mean(axis=0)
                  for rows in (reference & (units == unit) for unit in np.unique(units[reference]))]
    if not deviations:
        raise ValueError("the fleet's reference needs at least one unit with a marked reference period")
    within = np.sqrt((np.concatenate(deviations) ** 2).mean(axis=0) + EPS).astype(np.float32)
    return Reference(fleet.mean, fleet.scale, fleet.log_error, fleet.windows, within)


def departure(descriptions: np.ndarray, errors: np.ndarray, mean: np.ndarray, scale: np.ndarray,
              log_error: np.ndarray, embedding_size: int) -> np.ndarray:
    """Each window against its unit's reference: descriptions (n, D) whose first `embedding_size` columns are the
    embedding, errors (n,), mean and scale (n, D), log_error (n,) -> (n, 3): [log mean squared standardised distance
    over the embedding, the same over the channel means, log error - the reference's log error]."""
    squared = ((descriptions - mean) / scale) ** 2
    return np.stack([np.log(squared[:, :embedding_size].mean(axis=1) + EPS),
                     np.log(squared[:, embedding_size:].mean(axis=1) + EPS),
                     np.log(errors + EPS) - log_error], axis=1).astype(np.float32)


def against_own_references(descriptions: np.ndarray, errors: np.ndarray, units: np.ndarray, reference: np.ndarray,
                           fleet: Reference, embedding_size: int) -> np.ndarray:
    """Departures (n, 3) of n windows, each against its unit's reference fitted on the windows marked in `reference`
    (n,) bool (shrunk to `fleet`; a unit with none marked gets the fleet's)."""
    mean, scale = np.empty_like(descriptions), np.empty_like(descriptions)
    log_error = np.empty(len(units), np.float32)
    for unit in np.unique(units):
        rows = units == unit
        own = fit_reference(descriptions[rows & reference], errors[rows & reference], fleet)
        mean[rows], scale[rows], log_error[rows] = own.mean, own.scale, own.log_error
    return departure(descriptions, errors, mean, scale, log_error, embedding_size)


def reference_to_dict(reference: Reference) -> dict:
    within = {} if reference.within is None else {"within": reference.within.tolist()}
    return {"mean": reference.mean.tolist(), "scale": reference.scale.tolist(), "log_error": reference.log_error,
            "windows": reference.windows, **within}


def reference_from_dict(data: dict) -> Reference:
    within = data.get("within")
    return Reference(np.asarray(data["mean"], np.float32), np.asarray(data["scale"], np.float32),
                     float(data["log_error"]), int(data["windows"]),
                     None if within is None else np.asarray(within, np.float32))
