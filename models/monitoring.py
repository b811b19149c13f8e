"""Drift and performance statistics of a deployed model against its training reference, for the `monitor` flow:
the references (contract/reference.py) built at export, and the statistics of models/drift.py (which the service
shares) with scipy's KS p-value. Outputs against labelled outcomes: models/metrics.py.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import ks_2samp

from data.molecules.descriptors import DESCRIPTORS, molecule_descriptors
from data.molecules.standardize import parse_smiles
from models.drift import (FINGERPRINT_BITS, FINGERPRINT_RADIUS, bin_shares, channel_drift, morgan_fingerprint,
                          window_means)

PSI_BINS = 10
SUMMARY_SAMPLE = 2000
QUANTILE_LEVELS = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)


# ---------------------------------------------------------------- sensor windows

def sensor_reference(windows: np.ndarray, channels: list[str], bins: int = PSI_BINS, sample: int = SUMMARY_SAMPLE,
                     seed: int = 0) -> dict[str, np.ndarray]:
    """The sensor reference of training windows (n, C, T) (see contract/reference.py)."""
    means = window_means(windows)
    levels = np.linspace(0, 1, bins + 1)[1:-1]
    edges = np.stack([np.nanquantile(means[:, j], levels) for j in range(means.shape[1])])
    proportions = np.stack([bin_shares(means[:, j], edges[j]) for j in range(means.shape[1])])
    rows = np.random.default_rng(seed).choice(len(means), size=min(sample, len(means)), replace=False)
    return {"channels": np.array(channels, dtype=str), "psi_edges": edges, "psi_proportions": proportions,
            "summary_sample": means[np.sort(rows)].astype(np.float32)}


def sensor_drift(reference: dict[str, np.ndarray], means: np.ndarray) -> dict[str, dict[str, float]]:
    """models.drift.channel_drift of recent per-window channel means (m, C) with the KS test's p-value:
    {channel: {"psi", "ks", "ks_pvalue", "n"}}."""
    out = channel_drift(reference, means)
    for j, (channel, drift) in enumerate(out.items()):
        current, sample = means[:, j], reference["summary_sample"][:, j]
        current, sample = current[~np.isnan(current)], sample[~np.isnan(sample)]
        drift["ks_pvalue"] = float(ks_2samp(sample, current).pvalue) if len(current) and len(sample) else float("nan")
    return out


# ---------------------------------------------------------------- molecules

def morgan_bits(smiles: list[str]) -> np.ndarray:
    """Packed Morgan bit fingerprints (n, FINGERPRINT_BITS / 8) uint8 of standardised molecules;
    InvalidSmilesError on bad SMILES."""
    return np.stack([morgan_fingerprint(parse_smiles(s)) for s in smiles])


def descriptor_matrix(smiles: list[str]) -> np.ndarray:
    """The model's RDKit descriptors (n, D) of standardised molecules (data/molecules/descriptors.py)."""
    return np.stack([molecule_descriptors(parse_smiles(s)) for s in smiles]).astype(np.float64)


def molecule_reference(smiles: list[str]) -> dict[str, np.ndarray]:
    """The molecule reference of the training SMILES (see contract/reference.py)."""
    descriptors = descriptor_matrix(smiles)
    return {"descriptor_names": np.array(DESCRIPTORS, dtype=str), "descriptor_min": descriptors.min(axis=0),
            "descriptor_max": descriptors.max(axis=0), "quantile_levels": np.array(QUANTILE_LEVELS),
            "descriptor_quantiles": np.quantile(descriptors, QUANTILE_LEVELS, axis=0),
            "fingerprints": morgan_bits(smiles), "fingerprint_radius": np.array(FINGERPRINT_RADIUS),
            "fingerprint_bits": np.array(FINGERPRINT_BITS)}
