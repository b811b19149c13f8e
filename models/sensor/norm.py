"""Per-step normalisation: statistics over channels at one time step, never over the batch or other steps."""

from __future__ import annotations

import torch
from torch import nn


class StepNorm(nn.Module):
    """LayerNorm over channels at each time step: independent of the batch and of other steps.

    (B, H, T) -> (B, H, T)
    """

    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.transpose(1, 2)).transpose(1, 2)
