"""Sensor encoder: 1D-conv stem -> TCN blocks -> transformer layers -> pooled embedding."""

from __future__ import annotations

import torch
from torch import nn

from models.sensor.attention import TransformerLayer
from models.sensor.config import SensorModelConfig
from models.sensor.positional import SinusoidalPositionalEncoding
from models.sensor.tcn import TemporalConvStack


class SensorEncoder(nn.Module):
    """(B, 2C, T) -> per-step features (B, H, T) via `sequence`; embedding (B, 2H) via `forward`:
    the mean over time next to the last (most recent) step.

    The conv stem and TCN are causal-friendly local feature extractors (missing values arrive as the
    mask channels); the transformer layers then mix information across the whole window.
    """

    def __init__(self, in_channels: int, cfg: SensorModelConfig):
        super().__init__()
        self.stem = nn.Conv1d(in_channels, cfg.hidden, cfg.kernel_size, padding="same")
        self.blocks = TemporalConvStack(cfg.hidden, cfg.kernel_size, cfg.layers, cfg.dropout)
        self.position = SinusoidalPositionalEncoding(cfg.hidden) if cfg.attention_layers else None
        self.attention = nn.ModuleList(
            [TransformerLayer(cfg.hidden, cfg.heads, cfg.ff_multiplier, cfg.dropout) for _ in range(cfg.attention_layers)]
        )
        self.embedding_size = 2 * cfg.hidden

    def sequence(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks(torch.relu(self.stem(x)))
        if self.position is not None:
            s = self.position(h.transpose(1, 2))
            for layer in self.attention:
                s = layer(s)
            h = s.transpose(1, 2)
        return h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.sequence(x)
        return torch.cat([h.mean(dim=-1), h[..., -1]], dim=-1)
