"""Drift and performance statistics of a deployed model against its training reference (numpy, scipy, RDKit;
torch-free, so the service can use them too). The reference arrays are those of contract/reference.py.

Sensor inputs are compared through per-window channel summaries (what the prediction store keeps of a window):
PSI on quantile bins of the training distribution and the two-sample Kolmogorov-Smirnov statistic, per channel.
Molecule inputs: the share of descriptors outside the training range and the Tanimoto similarity to the nearest
training molecule (the applicability domain). Outputs against labelled outcomes: models/metrics.py.
"""

from __future__ import annotations


import numpy as np
from rdkit.Chem import rdFingerprintGenerator
from scipy.stats import ks_2samp

from data.molecules.descriptors import DESCRIPTORS, molecule_descriptors
from data.molecules.standardize import parse_smiles

PSI_BINS = 10
PSI_FLOOR = 1e-4  # bin shares are floored before the log ratio (an empty bin would make PSI infinite)
SUMMARY_SAMPLE = 2000
QUANTILE_LEVELS = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)
FINGERPRINT_RADIUS, FINGERPRINT_BITS = 2, 2048


# ---------------------------------------------------------------- sensor windows

def window_means(windows: np.ndarray) -> np.ndarray:
    """Per-window channel means, NaN gaps ignored: (n, C, T) -> (n, C) (NaN for a channel missing all window)."""
    windows = np.asarray(windows, dtype=np.float64)
    observed = ~np.isnan(windows)
    count = observed.sum(axis=2)
    total = np.where(observed, windows, 0.0).sum(axis=2)
    return np.divide(total, count, out=np.full(count.shape, np.nan), where=count > 0)


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


def bin_shares(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Share of the observed `values` (n,) in each of the len(edges) + 1 bins cut at the inner `edges` (B - 1,)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[~np.isnan(values)]
    counts = np.bincount(np.searchsorted(edges, values, side="right"), minlength=len(edges) + 1)
    return counts / max(len(values), 1)


def psi(expected: np.ndarray, actual: np.ndarray, floor: float = PSI_FLOOR) -> float:
    """Population stability index sum((a - e) * ln(a / e)) of bin shares (B,), each floored at `floor`.
    Rule of thumb: < 0.1 stable, 0.1-0.25 moderate shift, > 0.25 major shift."""
    e, a = np.maximum(expected, floor), np.maximum(actual, floor)
    return float(np.sum((a - e) * np.log(a / e)))


def sensor_drift(reference: dict[str, np.ndarray], means: np.ndarray) -> dict[str, dict[str, float]]:
    """PSI and KS statistic (with its p-value) per channel of recent per-window channel means (m, C) against the
    reference: {channel: {"psi", "ks", "ks_pvalue", "n"}}."""
    out = {}
    for j, channel in enumerate(reference["channels"].tolist()):
        current = means[:, j][~np.isnan(means[:, j])]
        sample = reference["summary_sample"][:, j]
        sample = sample[~np.isnan(sample)]
        if len(current) == 0:
            out[channel] = {"psi": float("nan"), "ks": float("nan"), "ks_pvalue": float("nan"), "n": 0}
            continue
        test = ks_2samp(sample, current)
        out[channel] = {"psi": psi(reference["psi_proportions"][j], bin_shares(current, reference["psi_edges"][j])),
                        "ks": float(test.statistic), "ks_pvalue": float(test.pvalue), "n": int(len(current))}
    return out


# ---------------------------------------------------------------- molecules

def morgan_bits(smiles: list[str], radius: int = FINGERPRINT_RADIUS, n_bits: int = FINGERPRINT_BITS) -> np.ndarray:
    """Packed Morgan bit fingerprints (n, n_bits / 8) uint8 of standardised molecules; InvalidSmilesError on bad SMILES."""
    generator = rdFingerprintGenerator.GetMorganGenerator(radius=radius, fpSize=n_bits)
    return np.stack([np.packbits(generator.GetFingerprintAsNumPy(parse_smiles(s)).astype(bool)) for s in smiles])


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


def out_of_range(reference: dict[str, np.ndarray], descriptors: np.ndarray) -> dict[str, float]:
    """Share of molecules (m, D) outside the training [min, max] per descriptor, and `any`: outside on at least one."""
    outside = (descriptors < reference["descriptor_min"]) | (descriptors > reference["descriptor_max"])
    shares = {name: float(share) for name, share in zip(reference["descriptor_names"].tolist(), outside.mean(axis=0))}
    return {**shares, "any": float(outside.any(axis=1).mean())}


def nearest_similarity(reference_bits: np.ndarray, query_bits: np.ndarray) -> np.ndarray:
    """Tanimoto similarity of each query (m, bytes) to its nearest reference fingerprint (n, bytes), both packed
    bits: |a & b| / |a | b| by popcount, what RDKit's BulkTanimotoSimilarity computes -> (m,) in [0, 1]."""
    reference_bits = np.asarray(reference_bits, dtype=np.uint8)
    reference_count = np.bitwise_count(reference_bits).sum(axis=1, dtype=np.int64)
    best = np.zeros(len(query_bits))
    for i, query in enumerate(np.asarray(query_bits, dtype=np.uint8)):
        common = np.bitwise_count(reference_bits & query).sum(axis=1, dtype=np.int64)
        union = reference_count + int(np.bitwise_count(query).sum()) - common
        similarity = np.divide(common, union, out=np.ones(len(union)), where=union > 0)
        best[i] = similarity.max() if len(similarity) else 0.0
    return best
