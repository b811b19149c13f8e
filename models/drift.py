"""Input drift and applicability-domain statistics against a training reference (contract/reference.py), in numpy
and RDKit alone: the service computes them live, the `monitor` flow through models/monitoring.py (which builds the
references and adds scipy's KS p-value).

Sensor inputs are compared through per-window channel means: PSI on quantile bins of the training distribution
and the two-sample Kolmogorov-Smirnov statistic, per channel. Molecules: the Tanimoto similarity to the nearest
training molecule (packed Morgan bits) and the descriptors outside the training range.
"""

from __future__ import annotations

import numpy as np
from rdkit import Chem
from rdkit.Chem import rdFingerprintGenerator

PSI_FLOOR = 1e-4  # bin shares are floored before the log ratio (an empty bin would make PSI infinite)
FINGERPRINT_RADIUS, FINGERPRINT_BITS = 2, 2048


# ---------------------------------------------------------------- sensor windows

def window_means(windows: np.ndarray) -> np.ndarray:
    """Per-window channel means, NaN gaps ignored: (n, C, T) -> (n, C) (NaN for a channel missing all window)."""
    windows = np.asarray(windows, dtype=np.float64)
    observed = ~np.isnan(windows)
    count = observed.sum(axis=2)
    total = np.where(observed, windows, 0.0).sum(axis=2)
    return np.divide(total, count, out=np.full(count.shape, np.nan), where=count > 0)


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


def ks_statistic(first: np.ndarray, second: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs of (n,) and (m,)."""
    first, second = np.sort(first), np.sort(second)
    points = np.concatenate([first, second])
    gap = (np.searchsorted(first, points, side="right") / len(first)
           - np.searchsorted(second, points, side="right") / len(second))
    return float(np.abs(gap).max())


def channel_drift(reference: dict[str, np.ndarray], means: np.ndarray) -> dict[str, dict[str, float]]:
    """PSI and KS statistic per channel of recent per-window channel means (m, C), columns in the order of
    reference["channels"], against the reference: {channel: {"psi", "ks", "n"}} (NaN and n 0 without readings)."""
    out = {}
    for j, channel in enumerate(reference["channels"].tolist()):
        current = means[:, j][~np.isnan(means[:, j])]
        sample = reference["summary_sample"][:, j]
        sample = sample[~np.isnan(sample)]
        if len(current) == 0 or len(sample) == 0:
            out[channel] = {"psi": float("nan"), "ks": float("nan"), "n": int(len(current))}
            continue
        out[channel] = {"psi": psi(reference["psi_proportions"][j], bin_shares(current, reference["psi_edges"][j])),
                        "ks": ks_statistic(sample, current), "n": int(len(current))}
    return out


# ---------------------------------------------------------------- molecules

_morgan = rdFingerprintGenerator.GetMorganGenerator(radius=FINGERPRINT_RADIUS, fpSize=FINGERPRINT_BITS)


def morgan_fingerprint(mol: Chem.Mol) -> np.ndarray:
    """Packed Morgan bits (FINGERPRINT_BITS / 8,) uint8 of `mol` (radius FINGERPRINT_RADIUS)."""
    return np.packbits(_morgan.GetFingerprintAsNumPy(mol).astype(bool))


def nearest_similarity(reference_bits: np.ndarray, query_bits: np.ndarray) -> np.ndarray:
    """Tanimoto similarity of each query (m, bytes) to its nearest reference fingerprint (n, bytes), both packed
    bits: |a & b| / |a | b| by popcount, what RDKit's BulkTanimotoSimilarity computes -> (m,) in [0, 1]
    (0 against an empty reference; two empty fingerprints count as identical)."""
    reference_bits, query_bits = _words(reference_bits), _words(query_bits)
    reference_count = np.bitwise_count(reference_bits).sum(axis=1, dtype=np.int64)
    best = np.zeros(len(query_bits))
    if len(reference_bits) == 0:
        return best
    for i, query in enumerate(query_bits):
        common = np.bitwise_count(reference_bits & query).sum(axis=1, dtype=np.int64)
        union = reference_count + int(np.bitwise_count(query).sum()) - common
        best[i] = np.divide(common, union, out=np.ones(len(union)), where=union > 0).max()
    return best


def _words(bits: np.ndarray) -> np.ndarray:
    """Packed bits (n, bytes) uint8 as 64-bit words when the width allows (8 times fewer popcounts)."""
    bits = np.ascontiguousarray(bits, dtype=np.uint8).reshape(len(bits), -1)
    return bits.view(np.uint64) if bits.shape[1] % 8 == 0 else bits


def outside_range(reference: dict[str, np.ndarray], descriptors: np.ndarray) -> np.ndarray:
    """Per molecule (m, D), which descriptors lie outside the training [min, max]: (m, D) bool."""
    return (descriptors < reference["descriptor_min"]) | (descriptors > reference["descriptor_max"])


def out_of_range(reference: dict[str, np.ndarray], descriptors: np.ndarray) -> dict[str, float]:
    """Share of molecules (m, D) outside the training [min, max] per descriptor, and `any`: outside on at least one."""
    outside = outside_range(reference, descriptors)
    shares = {name: float(share) for name, share in zip(reference["descriptor_names"].tolist(), outside.mean(axis=0))}
    return {**shares, "any": float(outside.any(axis=1).mean())}
