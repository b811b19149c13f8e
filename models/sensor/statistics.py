"""Per-channel window statistics computed inside the model (torch, so they export into the ONNX graph).

The same statistics as the HistGradientBoosting baseline's (data/sensors/summary_features.py). They give the head
direct access to levels and spreads that the per-step normalised encoder blurs
(docs/decisions/0003-sensor-window-statistics.md).
"""

from __future__ import annotations

import torch
from torch import nn

STATISTICS = ("last", "mean", "std", "min", "max", "slope")


class WindowStatistics(nn.Module):
    """(B, 2C, T) featurised windows (C standardised channels, 0 where missing, then C observed-masks) ->
    (B, 6C) channel-major: per channel the value at the last step, mean, std (ddof 0), min, max and least-squares
    slope per step, over the observed steps (0 for an all-missing channel)."""

    def __init__(self, n_channels: int):
        super().__init__()
        self.n_channels = n_channels

    @property
    def size(self) -> int:
        return len(STATISTICS) * self.n_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.n_channels
        values, mask = x[:, :c], x[:, c:]
        count = mask.sum(dim=-1)                                                       # (B, C)
        any_observed = (count > 0).to(x.dtype)
        safe = count.clamp(min=1)
        mean = (values * mask).sum(dim=-1) / safe
        deviation = (values - mean.unsqueeze(-1)) * mask
        std = torch.sqrt((deviation ** 2).sum(dim=-1) / safe)
        big = torch.finfo(x.dtype).max
        low = torch.where(mask > 0, values, big).amin(dim=-1) * any_observed
        high = torch.where(mask > 0, values, -big).amax(dim=-1) * any_observed
        steps = torch.arange(x.shape[-1], dtype=x.dtype, device=x.device)
        mean_step = (steps * mask).sum(dim=-1) / safe
        step_deviation = (steps - mean_step.unsqueeze(-1)) * mask
        slope = (step_deviation * deviation).sum(dim=-1) / (step_deviation ** 2).sum(dim=-1).clamp(min=1e-12)
        stats = torch.stack([values[..., -1], mean, std, low, high, slope], dim=-1)    # (B, C, 6)
        return stats.reshape(x.shape[0], self.size)
