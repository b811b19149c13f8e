"""Split-conformal interval scale for the molecule regressor (numpy only; the shared helpers are models/calibration.py)."""

from __future__ import annotations

import numpy as np
from scipy.stats import norm


def nominal_coverage(z: float) -> float:
    """Share of a normal distribution within +-z standard deviations."""
    return float(2 * norm.cdf(z) - 1)


def fit_conformal_scale(residuals: np.ndarray, spread: np.ndarray, z: float) -> float:
    """Scale s so that value +- z * s * spread is a split-conformal interval at coverage nominal_coverage(z).

    Scores |residual| / spread on the calibration (validation) set; q is their ceil((n + 1)(1 - alpha)) / n
    empirical quantile, s = q / z. residuals, spread: (n,). Split conformal's finite-sample guarantee needs
    calibration data the model never depended on; the pipeline's validation set also chose each member's epoch, so
    there the coverage is approximate (docs/explanation/molecule.md, Calibration and uncertainty).
    """
    scores = np.abs(np.asarray(residuals, dtype=float)) / np.maximum(np.asarray(spread, dtype=float), 1e-8)
    n = len(scores)
    level = min(1.0, np.ceil((n + 1) * nominal_coverage(z)) / n)
    return float(np.quantile(scores, level, method="higher") / z)
