"""Sinusoidal positional encoding computed from the sequence length (no maximum length; ONNX-dynamic in time)."""

from __future__ import annotations

import math

import torch
from torch import nn


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the Transformer sine/cosine encoding to (B, T, H); H must be even.

    Built from `torch.arange(T)` at run time, so any length works and the ONNX graph keeps `time` dynamic.
    Position 0 is the most recent step (positions count backwards from the end of the window), so a
    step keeps its code when the window gets longer at the far end.
    """

    def __init__(self, hidden: int, base: float = 10_000.0):
        super().__init__()
        if hidden % 2:
            raise ValueError(f"sinusoidal positional encoding needs an even hidden size, got {hidden}")
        frequencies = torch.exp(torch.arange(0, hidden, 2, dtype=torch.float32) * (-math.log(base) / hidden))
        self.register_buffer("frequencies", frequencies, persistent=False)

    def encoding(self, length: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(T, H): [sin(p * f_0), cos(p * f_0), sin(p * f_1), ...] for p = T-1, ..., 0."""
        position = torch.arange(length, dtype=torch.float32, device=self.frequencies.device).flip(0)
        angles = position.unsqueeze(1) * self.frequencies.unsqueeze(0)
        return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.encoding(x.shape[1], x.dtype).unsqueeze(0)
