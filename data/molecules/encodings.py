"""Per-atom structural encodings of a molecular graph (numpy only), computed during featurisation.

- Laplacian eigenvectors: the eigenvectors of the symmetric normalised Laplacian I - D^-1/2 A D^-1/2 for the
  LAPLACIAN_K smallest eigenvalues after the first (the trivial one), in RDKit canonical atom order. Columns a
  small molecule does not have (N - 1 < k) are zero. Inside a repeated eigenvalue (benzene: 0.5 and 1.5 are
  double) any rotation of the eigenvectors is as valid, and which one comes out depends on the LAPACK build, so
  training and serving machines could disagree: those columns are zero too (DEGENERACY_TOLERANCE), which keeps
  the encoding the same under atom reordering and across machines. Each remaining eigenvector's sign is arbitrary:
  it is fixed here (largest-magnitude entry positive) so serving is deterministic, and training flips signs at
  random (`random_sign_flip`) so the model does not rely on it.
- Random-walk landing probabilities: for t = 1..RANDOM_WALK_K, the probability that a random walk from an
  atom is back on it after t steps, the diagonal of (D^-1 A)^t (0 for an isolated atom).
"""

from __future__ import annotations

import numpy as np

LAPLACIAN_K = 8
RANDOM_WALK_K = 8
POSITIONAL_SIZE = LAPLACIAN_K + RANDOM_WALK_K
DEGENERACY_TOLERANCE = 1e-6
"""Eigenvalues closer than this are one repeated eigenvalue."""


def adjacency(edge_index: np.ndarray, n_atoms: int) -> np.ndarray:
    """(N, N) float64 0/1 adjacency from a (2, E) edge list (both directions listed)."""
    a = np.zeros((n_atoms, n_atoms))
    a[edge_index[0], edge_index[1]] = 1.0
    return a


def laplacian_eigenvectors(edge_index: np.ndarray, n_atoms: int, k: int = LAPLACIAN_K) -> np.ndarray:
    """(N, k) float32: eigenvectors 2..k+1 of the normalised Laplacian (ascending eigenvalue), zero-padded; zero
    where the eigenvalue is repeated (also with one outside the k kept)."""
    out = np.zeros((n_atoms, k), dtype=np.float32)
    if n_atoms < 2:
        return out
    a = adjacency(edge_index, n_atoms)
    degree = a.sum(axis=1)
    inv_sqrt = np.where(degree > 0, 1.0 / np.sqrt(np.maximum(degree, 1e-12)), 0.0)
    laplacian = np.eye(n_atoms) - inv_sqrt[:, None] * a * inv_sqrt[None, :]
    values, vectors = np.linalg.eigh(laplacian)
    repeated = np.zeros(n_atoms, dtype=bool)
    close = np.diff(values) < DEGENERACY_TOLERANCE
    repeated[1:] |= close
    repeated[:-1] |= close
    vectors = np.where(repeated[None, :], 0.0, vectors)[:, 1 : k + 1]
    # fix each eigenvector's sign: its largest-magnitude entry (first such atom) positive
    pivot = vectors[np.argmax(np.abs(vectors) - 1e-9 * np.arange(n_atoms)[:, None], axis=0), np.arange(vectors.shape[1])]
    vectors = vectors * np.where(pivot < 0, -1.0, 1.0)
    out[:, : vectors.shape[1]] = vectors
    return out


def random_walk_probabilities(edge_index: np.ndarray, n_atoms: int, k: int = RANDOM_WALK_K) -> np.ndarray:
    """(N, k) float32: diag((D^-1 A)^t) for t = 1..k."""
    a = adjacency(edge_index, n_atoms)
    degree = a.sum(axis=1, keepdims=True)
    walk = np.divide(a, degree, out=np.zeros_like(a), where=degree > 0)
    out = np.zeros((n_atoms, k), dtype=np.float32)
    power = np.eye(n_atoms)
    for t in range(k):
        power = power @ walk
        out[:, t] = np.diag(power)
    return out


def positional_encodings(edge_index: np.ndarray, n_atoms: int) -> np.ndarray:
    """(N, POSITIONAL_SIZE) float32: Laplacian eigenvectors then random-walk landing probabilities."""
    return np.concatenate(
        [laplacian_eigenvectors(edge_index, n_atoms), random_walk_probabilities(edge_index, n_atoms)], axis=1
    )


def random_sign_flip(positional: np.ndarray, batch: np.ndarray, n_graphs: int, rng: np.random.Generator) -> np.ndarray:
    """Training-time augmentation: flip each molecule's Laplacian eigenvectors by an independent random sign.
    positional (N, POSITIONAL_SIZE), batch (N,) molecule index; returns a new array."""
    signs = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=(n_graphs, LAPLACIAN_K))
    out = positional.copy()
    out[:, :LAPLACIAN_K] *= signs[batch]
    return out
