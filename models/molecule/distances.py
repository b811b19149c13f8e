"""The structural pretext task's targets: shortest-path distances (in bonds) between sampled atom pairs of each
molecule of a batch, capped at MAX_DISTANCE (atoms farther apart, or in another fragment of a salt, share that
class). numpy/scipy; pretraining only."""

from __future__ import annotations

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import shortest_path

MAX_DISTANCE = 6  # classes 0..6: 1..5 bonds apart, and "6 or more / not connected"


def distance_pairs(edge_index: np.ndarray, batch: np.ndarray, pairs_per_molecule: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Sample `pairs_per_molecule` pairs of distinct atoms in every molecule with at least two atoms.

    edge_index (2, E) batch-global atom indices (both directions of each bond), batch (N,) molecule of each atom
    (non-decreasing) -> pairs (P, 2) int64 atom indices, targets (P,) int64 in 0..MAX_DISTANCE."""
    n_atoms = len(batch)
    sizes = np.bincount(batch)
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    molecules = np.repeat(np.flatnonzero(sizes >= 2), pairs_per_molecule)
    if len(molecules) == 0:
        return np.empty((0, 2), dtype=np.int64), np.empty(0, dtype=np.int64)
    size = sizes[molecules]
    first = rng.integers(0, size)
    second = (first + rng.integers(1, size)) % size  # another atom of the same molecule
    pairs = np.stack([starts[molecules] + first, starts[molecules] + second], axis=1).astype(np.int64)
    adjacency = coo_matrix((np.ones(edge_index.shape[1]), (edge_index[0], edge_index[1])), shape=(n_atoms, n_atoms))
    sources, inverse = np.unique(pairs[:, 0], return_inverse=True)
    hops = shortest_path(adjacency.tocsr(), unweighted=True, directed=False, indices=sources)  # (S, N), inf apart
    distance = hops[inverse, pairs[:, 1]]
    return pairs, np.minimum(np.nan_to_num(distance, posinf=MAX_DISTANCE), MAX_DISTANCE).astype(np.int64)
