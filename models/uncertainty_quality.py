"""How well an uncertainty tells the errors apart, in numpy and scipy (the export stages' model cards and
bench/uncertainty.py). All arrays (n,).

- `spearman`: rank correlation of the uncertainty with the item's loss (higher: larger errors are flagged).
- Risk-coverage (selective prediction): keep the share c of the items with the lowest uncertainty; risk(c) is their
  mean loss. `aurc` is the mean of risk(c) over c = 1/n, 2/n, ..., 1 (lower is better). `aurc_oracle` orders the
  items by their loss itself (the best any uncertainty can do) and `aurc_random` is the mean loss (an uncertainty
  that knows nothing), so `aurc_gain` = (random - aurc) / (random - oracle) reads as a share: 1 orders as the
  oracle does, 0 no better than chance, below 0 worse.
- `coverage`: regression intervals value +- z_level * uncertainty at nominal levels, z_level the normal quantile
  (the uncertainty is the calibrated standard deviation the model card's intervals use).
"""

from __future__ import annotations

import numpy as np
from scipy.stats import norm, spearmanr

COVERAGE_LEVELS = (0.5, 0.8, 0.9, 0.95)


def risk_curve(loss: np.ndarray, uncertainty: np.ndarray) -> np.ndarray:
    """risk(c) for c = k / n, k = 1..n: mean loss of the k items of lowest uncertainty (n,). Items of equal
    uncertainty enter together: each stands for their mean loss (the expectation over orders of the tie)."""
    loss, uncertainty = np.asarray(loss, dtype=float), np.asarray(uncertainty, dtype=float)
    order = np.argsort(uncertainty, kind="stable")
    loss, uncertainty = loss[order], uncertainty[order]
    starts = np.flatnonzero(np.r_[True, np.diff(uncertainty) != 0])
    sizes = np.diff(np.r_[starts, len(loss)])
    tied_mean = np.add.reduceat(loss, starts) / sizes if len(loss) else loss
    return np.cumsum(np.repeat(tied_mean, sizes)) / np.arange(1, len(loss) + 1)


def uncertainty_quality(loss: np.ndarray, uncertainty: np.ndarray) -> dict[str, float]:
    """Spearman correlation, AURC with its oracle and random references, and the AURC gain (module docstring).
    `loss` per item: squared error for probabilities (Brier), absolute error for values."""
    loss, uncertainty = np.asarray(loss, dtype=float), np.asarray(uncertainty, dtype=float)
    if len(loss) != len(uncertainty) or len(loss) < 2:
        raise ValueError(f"uncertainty quality needs as many losses as uncertainties, at least 2 "
                         f"(got {len(loss)} and {len(uncertainty)})")
    aurc, oracle, random = float(risk_curve(loss, uncertainty).mean()), float(risk_curve(loss, loss).mean()), float(loss.mean())
    constant = np.ptp(uncertainty) == 0 or np.ptp(loss) == 0
    return {"spearman": float("nan") if constant else float(spearmanr(uncertainty, loss).statistic),
            "aurc": aurc, "aurc_oracle": oracle, "aurc_random": random,
            "aurc_gain": (random - aurc) / (random - oracle) if random > oracle else float("nan")}


def coverage_at_levels(y: np.ndarray, value: np.ndarray, uncertainty: np.ndarray,
                       levels: tuple[float, ...] = COVERAGE_LEVELS) -> dict[str, float]:
    """Nominal level -> share of `y` inside value +- z_level * uncertainty (keys like "0.9")."""
    gap = np.abs(np.asarray(y, dtype=float) - np.asarray(value, dtype=float))
    uncertainty = np.asarray(uncertainty, dtype=float)
    return {f"{level:g}": float(np.mean(gap <= norm.ppf(0.5 + level / 2) * uncertainty)) for level in levels}


def classification_uncertainty_quality(y: np.ndarray, probability: np.ndarray, uncertainty: np.ndarray) -> dict:
    """uncertainty_quality with the Brier loss of each probability."""
    return uncertainty_quality((np.asarray(probability, dtype=float) - np.asarray(y, dtype=float)) ** 2, uncertainty)


def regression_uncertainty_quality(y: np.ndarray, value: np.ndarray, uncertainty: np.ndarray) -> dict:
    """uncertainty_quality with the absolute error of each value, and `coverage` at the nominal levels."""
    error = np.abs(np.asarray(value, dtype=float) - np.asarray(y, dtype=float))
    return {**uncertainty_quality(error, uncertainty), "coverage": coverage_at_levels(y, value, uncertainty)}


def uncertainty_metrics(quality: dict) -> dict[str, float]:
    """The two headline figures as flat tracking metrics: test_uncertainty_spearman, test_uncertainty_aurc_gain."""
    return {f"test_uncertainty_{key}": quality[key] for key in ("spearman", "aurc_gain")}
