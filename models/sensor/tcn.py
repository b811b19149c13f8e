"""Temporal convolution block: dilated causal convolution, per-step norm, residual."""

from __future__ import annotations

import torch
from torch import nn

from models.mc_dropout import FEATURE_AXIS
from models.sensor.norm import StepNorm


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
        setattr(self.drop, FEATURE_AXIS, 1)  # (B, H, T): fixed masks drop channels (models/mc_dropout.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(nn.functional.pad(x, (self.pad, 0)))
        return x + self.drop(torch.relu(self.norm(h)))


class TemporalConvStack(nn.Sequential):
    """`layers` CausalConvBlocks with dilations 1, 2, 4, ...: receptive field 1 + (k - 1)(2^layers - 1) steps."""

    def __init__(self, hidden: int, kernel_size: int, layers: int, dropout: float):
        super().__init__(*[CausalConvBlock(hidden, kernel_size, 2**i, dropout) for i in range(layers)])
