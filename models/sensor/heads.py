"""Heads on the pooled embedding: failure logit (classification) and contrastive projection."""

from __future__ import annotations

import torch
from torch import nn


class ClassificationHead(nn.Module):
    """(B, E) -> logits (B,)."""

    def __init__(self, embedding: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(nn.Dropout(dropout), nn.Linear(embedding, 1))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z).squeeze(-1)


class ProjectionHead(nn.Module):
    """SimCLR projection MLP: (B, E) -> (B, P), used only by contrastive pretraining."""

    def __init__(self, embedding: int, hidden: int, projection: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(embedding, hidden), nn.ReLU(), nn.Linear(hidden, projection))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)
