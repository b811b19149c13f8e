"""Sensor encoder and heads. Input (batch, 2C, time): C standardised channels then C observed-masks
(see data/sensors/featurize.py), so missing values never reach the network as NaN."""

from __future__ import annotations

import torch
from torch import nn

from models.sensor.config import SensorModelConfig


class StepNorm(nn.Module):
    """LayerNorm over channels at each time step: independent of the batch and of other steps.

    (B, H, T) -> (B, H, T)
    """

    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.transpose(1, 2)).transpose(1, 2)


class CausalConvBlock(nn.Module):
    """Dilated causal convolution with a residual connection and per-step normalisation.

    (B, H, T) -> (B, H, T); step t sees only steps <= t.
    """

    def __init__(self, hidden: int, kernel_size: int, dilation: int, dropout: float):
        super().__init__()
        self.pad = (kernel_size - 1) * dilation
        self.conv = nn.Conv1d(hidden, hidden, kernel_size, dilation=dilation)
        self.norm = StepNorm(hidden)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(nn.functional.pad(x, (self.pad, 0)))
        return x + self.drop(torch.relu(self.norm(h)))


class SensorEncoder(nn.Module):
    """(B, 2C, T) -> per-step features (B, H, T) via `sequence`; embedding (B, 2H) via `forward`:
    the mean over time next to the last (most recent) step."""

    def __init__(self, in_channels: int, cfg: SensorModelConfig):
        super().__init__()
        self.stem = nn.Conv1d(in_channels, cfg.hidden, cfg.kernel_size, padding="same")
        self.blocks = nn.Sequential(
            *[CausalConvBlock(cfg.hidden, cfg.kernel_size, 2**i, cfg.dropout) for i in range(cfg.layers)]
        )

    def sequence(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(torch.relu(self.stem(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.sequence(x)
        return torch.cat([h.mean(dim=-1), h[..., -1]], dim=-1)


class SensorClassifier(nn.Module):
    """Encoder + linear head: (B, 2C, T) -> failure logits (B,)."""

    def __init__(self, in_channels: int, cfg: SensorModelConfig):
        super().__init__()
        self.encoder = SensorEncoder(in_channels, cfg)
        self.head = nn.Sequential(nn.Dropout(cfg.dropout), nn.Linear(2 * cfg.hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x)).squeeze(-1)


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


def random_spans(batch: int, length: int, ratio: float, span: int, generator: torch.Generator) -> torch.Tensor:
    """A (batch, length) bool mask hiding about `ratio` of the steps in spans of `span` steps."""
    n_spans = max(1, round(ratio * length / span))
    starts = torch.randint(0, max(1, length - span + 1), (batch, n_spans), generator=generator)
    steps = torch.arange(length)
    offsets = steps.view(1, 1, -1) - starts.unsqueeze(-1)
    return ((offsets >= 0) & (offsets < span)).any(dim=1)
