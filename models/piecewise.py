"""Piecewise-linear encoding of scalar features (Gorishniy, Rubachev & Babenko 2022, "On Embeddings for Numerical
Features in Tabular Deep Learning"): each feature becomes K values in [0, 1] over bins whose edges are training
quantiles. A linear layer on top can then place a sharp threshold anywhere a tree would split, which a plain
linear layer on standardised values struggles to learn for narrow bands (SKAB's fault moves the flow rate by
about 0.02 sd around each operating level).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class PiecewiseLinearEncoding(nn.Module):
    """(B, F) -> (B, F * K): for bin k of feature f with edges e_k < e_{k+1}, clamp((x - e_k) / (e_{k+1} - e_k), 0, 1).

    The edges (F, K + 1) are a buffer (they travel in checkpoints and into ONNX); `fit` sets them from training
    values. Until fitted they are evenly spaced on [-1, 1].
    """

    def __init__(self, n_features: int, bins: int):
        super().__init__()
        if bins < 1:
            raise ValueError(f"bins must be at least 1, got {bins}")
        self.bins = bins
        self.register_buffer("edges", torch.linspace(-1.0, 1.0, bins + 1).repeat(n_features, 1))

    @property
    def size(self) -> int:
        return self.edges.shape[0] * self.bins

    def fit(self, values: np.ndarray) -> PiecewiseLinearEncoding:
        """Edges at the 0, 1/K, ..., 1 quantiles of each column of `values` (n, F), made strictly increasing."""
        values = np.asarray(values, dtype=np.float64)
        if values.ndim != 2 or values.shape[1] != self.edges.shape[0] or len(values) == 0:
            raise ValueError(f"expected (n >= 1, {self.edges.shape[0]}) values, got {values.shape}")
        edges = np.quantile(values, np.linspace(0.0, 1.0, self.bins + 1), axis=0).T    # (F, K + 1)
        # a tie (e.g. a constant feature) becomes a narrow step, wide enough to stay a step in float32 (relative 1e-5)
        widths = np.maximum(np.diff(edges, axis=1), 1e-5 * np.maximum(1.0, np.abs(edges[:, :-1])))
        edges = edges[:, :1] + np.concatenate([np.zeros((len(edges), 1)), np.cumsum(widths, axis=1)], axis=1)
        self.edges.copy_(torch.from_numpy(edges))
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        low, high = self.edges[:, :-1], self.edges[:, 1:]                               # (F, K)
        encoded = ((x.unsqueeze(-1) - low) / (high - low)).clamp(0.0, 1.0)              # (B, F, K)
        return encoded.flatten(1)
