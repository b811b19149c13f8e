"""Recurrent sensor encoders for the benchmark's baselines: an Elman RNN, a GRU or an LSTM over the window, in the
place of SensorEncoder (same input, same embedding layout, same statistics branch and head around it).

(B, 2C, T) -> embedding (B, 2H): the mean of the last layer's states over time next to its last state.
"""

from __future__ import annotations

import torch
from torch import nn

RECURRENT_KINDS: dict[str, type[nn.RNNBase]] = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}


class RecurrentEncoder(nn.Module):
    """A `kind` ("rnn" | "gru" | "lstm") of `layers` layers of `hidden` units; dropout between layers."""

    def __init__(self, in_channels: int, kind: str, hidden: int, layers: int = 2, dropout: float = 0.1):
        super().__init__()
        if kind not in RECURRENT_KINDS:
            raise ValueError(f"unknown recurrent kind {kind!r}; choose one of {sorted(RECURRENT_KINDS)}")
        self.recurrent = RECURRENT_KINDS[kind](in_channels, hidden, num_layers=layers, batch_first=True,
                                               dropout=dropout if layers > 1 else 0.0)
        self.norm = nn.LayerNorm(hidden)
        self.embedding_size = 2 * hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        states, _ = self.recurrent(x.transpose(1, 2))  # (B, T, H)
        states = self.norm(states)
        return torch.cat([states.mean(dim=1), states[:, -1]], dim=-1)


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def matched_hidden(kind: str, in_channels: int, target: int, layers: int = 2) -> int:
    """The hidden size whose RecurrentEncoder has the parameter count closest to `target` (the count grows with
    the hidden size, so a bisection finds it)."""
    def size(hidden: int) -> int:
        return parameter_count(RecurrentEncoder(in_channels, kind, hidden, layers))
    low, high = 1, 1024  # size(low) < target <= size(high), or the closest end
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if size(middle) < target else (low, middle)
    return min((low, high), key=lambda hidden: abs(size(hidden) - target))
