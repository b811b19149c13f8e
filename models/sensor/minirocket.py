"""MiniRocket (Dempster, Schmidt & Webb 2021), multivariate, in vectorised numpy.

A port of the reference algorithm (as in `aeon`/`sktime` MiniRocket): 84 fixed kernels of length 9
(weights -1, with 2 at three positions), dilations spread exponentially up to (T - 1) / 8, each
kernel-dilation pair over a random subset of channels, biases from quantiles of the convolution of a
random training window, features = proportion of positive values (PPV). `aeon` itself is not used:
its numba pin needs numpy < 2.4 and would downgrade this project's numpy and pandas.
NaN must be filled before (the baseline uses the featuriser's standardised, NaN -> 0 values).
"""

from __future__ import annotations

from itertools import combinations

import numpy as np

KERNEL_LENGTH = 9
KERNELS = np.array(list(combinations(range(KERNEL_LENGTH), 3)), dtype=np.int64)  # (84, 3) positions of weight 2
N_KERNELS = len(KERNELS)


def _fit_dilations(length: int, n_features: int, max_dilations_per_kernel: int) -> tuple[np.ndarray, np.ndarray]:
    per_kernel = max(1, n_features // N_KERNELS)
    true_max = min(per_kernel, max_dilations_per_kernel)
    multiplier = per_kernel / true_max
    max_exponent = np.log2(max(length - 1, 1) / (KERNEL_LENGTH - 1))
    dilations, counts = np.unique(
        np.logspace(0, max(max_exponent, 0.0), true_max, base=2).astype(np.int64), return_counts=True)
    counts = (counts * multiplier).astype(np.int64)
    remainder = per_kernel - counts.sum()
    i = 0
    while remainder > 0:
        counts[i] += 1
        remainder -= 1
        i = (i + 1) % len(counts)
    return dilations, counts


def _quantiles(n: int) -> np.ndarray:
    return ((np.arange(1, n + 1) * ((np.sqrt(5) + 1) / 2)) % 1).astype(np.float32)


def _shifted(X: np.ndarray, dilation: int) -> np.ndarray:
    """(9, n, C, T): X read at t + (j - 4) * dilation, zero outside (the 'same'-padded convolution taps)."""
    n, c, t = X.shape
    out = np.zeros((KERNEL_LENGTH, n, c, t), dtype=np.float32)
    for j in range(KERNEL_LENGTH):
        offset = (j - KERNEL_LENGTH // 2) * dilation
        if offset >= 0 and offset < t:
            out[j, :, :, : t - offset] = X[:, :, offset:]
        elif offset < 0 and -offset < t:
            out[j, :, :, -offset:] = X[:, :, : t + offset]
    return out


class MiniRocket:
    """fit(X (n, C, T)) then transform(X) -> (n, F) float32 features, F = 84 * (n_features // 84)."""

    def __init__(self, n_features: int = 10_000, max_dilations_per_kernel: int = 32, seed: int = 0):
        self.n_features, self.max_dilations, self.seed = n_features, max_dilations_per_kernel, seed

    def fit(self, X: np.ndarray) -> MiniRocket:
        X = np.asarray(X, dtype=np.float32)
        n, c, t = X.shape
        if t < KERNEL_LENGTH:
            raise ValueError(f"MiniRocket needs windows of at least {KERNEL_LENGTH} steps, got {t}")
        rng = np.random.default_rng(self.seed)
        self.dilations, self.per_dilation = _fit_dilations(t, self.n_features, self.max_dilations)
        per_kernel = int(self.per_dilation.sum())
        quantiles = _quantiles(N_KERNELS * per_kernel)
        n_combinations = N_KERNELS * len(self.dilations)
        max_exponent = np.log2(min(c, KERNEL_LENGTH) + 1)
        sizes = (2 ** rng.uniform(0, max_exponent, n_combinations)).astype(np.int64)
        self.channels = [rng.choice(c, size, replace=False) for size in sizes]
        self.biases = []
        feature, combination = 0, 0
        for d_index, dilation in enumerate(self.dilations):
            count = int(self.per_dilation[d_index])
            examples = rng.integers(n, size=N_KERNELS)
            taps = _shifted(X[examples], int(dilation))  # (9, 84, C, T): one random window per kernel
            for k in range(N_KERNELS):
                conv = self._convolve(taps[:, k:k + 1], k, self.channels[combination])[0]
                self.biases.append(np.quantile(conv, quantiles[feature:feature + count]).astype(np.float32))
                feature += count
                combination += 1
        return self

    @staticmethod
    def _convolve(taps: np.ndarray, kernel: int, channels: np.ndarray) -> np.ndarray:
        """taps (9, n, C, T) -> (n, T): kernel `kernel` summed over `channels`."""
        sel = taps[:, :, channels]
        a, b, g = KERNELS[kernel]
        return (3 * (sel[a] + sel[b] + sel[g]) - sel.sum(axis=0)).sum(axis=1)

    def transform(self, X: np.ndarray, chunk: int = 512) -> np.ndarray:
        X = np.asarray(X, dtype=np.float32)
        n, _, t = X.shape
        out = np.empty((n, sum(len(b) for b in self.biases)), dtype=np.float32)
        for start in range(0, n, chunk):
            block = X[start:start + chunk]
            feature, combination = 0, 0
            for d_index, dilation in enumerate(self.dilations):
                padding = ((KERNEL_LENGTH - 1) * int(dilation)) // 2
                taps = _shifted(block, int(dilation))
                for k in range(N_KERNELS):
                    conv = self._convolve(taps, k, self.channels[combination])
                    if (d_index + k) % 2 == 1 and padding > 0 and 2 * padding < t:
                        conv = conv[:, padding:t - padding]  # the reference alternates full and 'valid' outputs
                    bias = self.biases[combination]
                    out[start:start + len(block), feature:feature + len(bias)] = (conv[:, :, None] > bias).mean(axis=1)
                    feature += len(bias)
                    combination += 1
        return out
