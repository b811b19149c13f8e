"""Sensor encoder and heads. Input (batch, 2C, time): C standardised channels then C observed-masks
(see data/sensors/featurize.py), so missing values never reach the network as NaN.

One idea per module: norm.py (StepNorm), tcn.py (CausalConvBlock), positional.py, attention.py,
heads.py, encoder.py (SensorEncoder); this module assembles the classifier and the pretraining models.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from models.losses import nt_xent
from models.sensor.config import SensorModelConfig
from models.sensor.encoder import SensorEncoder
from models.sensor.heads import ClassificationHead, ProjectionHead
from models.sensor.norm import StepNorm
from models.piecewise import PiecewiseLinearEncoding
from models.sensor.statistics import WindowStatistics
from models.sensor.tcn import CausalConvBlock

__all__ = ["CausalConvBlock", "StepNorm", "SensorEncoder", "SensorClassifier", "MaskedReconstruction",
           "ContrastiveModel", "random_spans"]


class SensorClassifier(nn.Module):
    """Encoder (+ encoded window statistics) + classification head: (B, 2C, T) -> failure logits (B,).

    With `cfg.statistics_bins` K > 0 the per-channel window statistics (B, 6C) are piecewise-linear encoded over K
    training-quantile bins (B, 6CK), mapped by a linear layer and ReLU to (B, H) and concatenated to the encoder's
    embedding (B, 2H) before the head. `fit_statistics(train_x)` sets the bins; call it before training.
    `encoder`: another module in the place of SensorEncoder ((B, 2C, T) -> (B, E), with `embedding_size` E), e.g.
    the benchmark's recurrent baselines (models/sensor/recurrent.py).
    """

    def __init__(self, in_channels: int, cfg: SensorModelConfig, encoder: nn.Module | None = None):
        super().__init__()
        self.encoder = SensorEncoder(in_channels, cfg) if encoder is None else encoder
        size = self.encoder.embedding_size
        self.statistics = None
        if cfg.statistics_bins:
            statistics = WindowStatistics(in_channels // 2)
            encoding = PiecewiseLinearEncoding(statistics.size, cfg.statistics_bins)
            self.statistics = nn.Sequential(statistics, encoding, nn.Linear(encoding.size, cfg.hidden), nn.ReLU())
            size += cfg.hidden
        self.head = ClassificationHead(size, cfg.dropout)

    @torch.no_grad()
    def fit_statistics(self, x: np.ndarray, batch_size: int = 4096) -> SensorClassifier:
        """Bin edges of the statistics encoding from training features x (n, 2C, T); no-op without statistics."""
        if self.statistics is not None:
            compute = self.statistics[0]
            values = [compute(torch.from_numpy(np.asarray(x[i:i + batch_size], dtype=np.float32)))
                      for i in range(0, len(x), batch_size)]
            self.statistics[1].fit(torch.cat(values).numpy())
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.encoder(x)
        if self.statistics is not None:
            z = torch.cat([z, self.statistics(x)], dim=-1)
        return self.head(z)


class MaskedReconstruction(nn.Module):
    """Pretraining objective: hide spans of time steps and reconstruct their values.

    forward(x (B, 2C, T), hidden (B, T) bool) -> mean squared error on hidden, observed values.
    """

    def __init__(self, encoder: SensorEncoder, n_channels: int, hidden: int):
        super().__init__()
        self.encoder = encoder
        self.n_channels = n_channels
        self.decoder = nn.Conv1d(hidden, n_channels, 1)

    def forward(self, x: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        c = self.n_channels
        keep = (~hidden).unsqueeze(1).to(x.dtype)
        corrupted = torch.cat([x[:, :c] * keep, x[:, c:] * keep], dim=1)
        recon = self.decoder(self.encoder.sequence(corrupted))
        target_mask = hidden.unsqueeze(1) & (x[:, c:] > 0.5)
        err = (recon - x[:, :c]) ** 2
        return (err * target_mask).sum() / target_mask.sum().clamp(min=1)


class ContrastiveModel(nn.Module):
    """SimCLR: encoder + projection head; forward(view_a, view_b (B, 2C, T)) -> NT-Xent loss."""

    def __init__(self, encoder: SensorEncoder, cfg: SensorModelConfig, temperature: float):
        super().__init__()
        self.encoder = encoder
        self.projection = ProjectionHead(encoder.embedding_size, cfg.hidden, cfg.projection)
        self.temperature = temperature

    def forward(self, view_a: torch.Tensor, view_b: torch.Tensor) -> torch.Tensor:
        z = self.projection(self.encoder(torch.cat([view_a, view_b])))
        return nt_xent(z[: len(view_a)], z[len(view_a):], self.temperature)


def random_spans(batch: int, length: int, ratio: float, span: int, generator: torch.Generator) -> torch.Tensor:
    """A (batch, length) bool mask hiding about `ratio` of the steps in spans of `span` steps."""
    n_spans = max(1, round(ratio * length / span))
    starts = torch.randint(0, max(1, length - span + 1), (batch, n_spans), generator=generator)
    steps = torch.arange(length)
    offsets = steps.view(1, 1, -1) - starts.unsqueeze(-1)
    return ((offsets >= 0) & (offsets < span)).any(dim=1)
