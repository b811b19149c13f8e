"""The applicability domain of each answered molecule against the served version's training molecules (its
reference, contract/reference.py): the Tanimoto similarity to the nearest training molecule, `in_domain` when
that reaches SERVING_MONITOR_MIN_SIMILARITY, and the share of its descriptors outside the training range.

The fingerprints are made with the graphs in the featurisation workers (serving/families/molecule/featurizing.py); the comparison
runs in the model thread, after the model call (models/drift.py)."""

from __future__ import annotations

import numpy as np

from data.molecules.descriptors import DESCRIPTORS
from models.drift import FINGERPRINT_BITS, FINGERPRINT_RADIUS, nearest_similarity, outside_range



def unusable(reference: dict | None) -> str | None:
    """Why `reference` cannot judge this service's molecules (None: it can)."""
    if reference is None:
        return "this version has no training reference (registered before references)"
    if "fingerprints" not in reference:
        return "its training reference has no molecule fingerprints"
    shape = (int(reference["fingerprint_radius"]), int(reference["fingerprint_bits"]))
    if shape != (FINGERPRINT_RADIUS, FINGERPRINT_BITS):
        return (f"its reference fingerprints are Morgan radius {shape[0]}, {shape[1]} bits; this service makes "
                f"radius {FINGERPRINT_RADIUS}, {FINGERPRINT_BITS} bits")
    if reference["descriptor_names"].tolist() != DESCRIPTORS:
        return "its reference descriptors are not the ones this service computes"
    return None


def assess(reference: dict, fingerprints: np.ndarray, descriptors: np.ndarray, min_similarity: float) -> list[dict]:
    """Per molecule, fingerprints (m, FINGERPRINT_BITS / 8) uint8 and descriptors (m, D): {"nearest_similarity",
    "in_domain", "descriptors_out_of_range"} against a usable `reference`."""
    similarity = nearest_similarity(reference["fingerprints"], fingerprints)
    outside = outside_range(reference, descriptors.astype(np.float64)).mean(axis=1)
    return [{"nearest_similarity": s, "in_domain": s >= min_similarity, "descriptors_out_of_range": o}
            for s, o in zip(similarity.tolist(), outside.tolist())]
