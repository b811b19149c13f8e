"""Mini-batch index streams shared by both model families."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def index_batches(n: int, batch_size: int, seed: int | None) -> Iterator[np.ndarray]:
    """Yield index arrays covering range(n): shuffled with `seed`, in order when seed is None."""
    order = np.arange(n) if seed is None else np.random.default_rng(seed).permutation(n)
    for start in range(0, n, batch_size):
        yield order[start : start + batch_size]
