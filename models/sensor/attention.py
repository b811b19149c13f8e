"""Transformer encoder layer over time steps (pre-norm, multi-head self-attention, feed-forward).

Written with plain matmuls and softmax so that the dynamo ONNX exporter keeps batch and time dynamic.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from models.mc_dropout import FEATURE_AXIS


class MultiHeadSelfAttention(nn.Module):
    """(B, T, H) -> (B, T, H): `heads` heads of scaled dot-product attention over all T steps."""

    def __init__(self, hidden: int, heads: int, dropout: float):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not divisible by {heads} attention heads")
        self.heads, self.head_dim = heads, hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.drop = nn.Dropout(dropout)
        setattr(self.drop, FEATURE_AXIS, None)  # on (B, heads, T, T) weights, T of any length: no fixed masks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.head_dim), dim=-1)
        mixed = (self.drop(weights) @ v).transpose(1, 2).reshape(b, t, h)
        return self.out(mixed)


class TransformerLayer(nn.Module):
    """Pre-norm transformer encoder layer: x + attn(norm(x)), then x + ff(norm(x)). (B, T, H) -> (B, T, H)."""

    def __init__(self, hidden: int, heads: int, ff_multiplier: int, dropout: float):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.attention = MultiHeadSelfAttention(hidden, heads, dropout)
        self.feedforward = nn.Sequential(
            nn.Linear(hidden, ff_multiplier * hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(ff_multiplier * hidden, hidden)
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attention(self.norm1(x)))
        return x + self.drop(self.feedforward(self.norm2(x)))
