"""MC-dropout (Gal and Ghahramani, 2016): dropout stays on at prediction, and N stochastic passes of one trained
network give a spread that stands for its uncertainty, next to (or inside) a deep ensemble's spread over members."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch import nn


def sample_dropout(model: nn.Module) -> nn.Module:
    """`model` in eval mode except its Dropout modules (normalisation keeps its inference statistics)."""
    model.eval()
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.train()
    return model


def mc_dropout_passes(predict: Callable[[], np.ndarray], passes: int, seed: int) -> np.ndarray:
    """(passes, n): `passes` calls of `predict` (a prediction with dropout sampled, e.g. predict_logits(...,
    dropout=True)), torch's RNG seeded once so the passes are repeatable."""
    if passes < 1:
        raise ValueError(f"MC-dropout needs at least one pass (got {passes})")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return np.stack([predict() for _ in range(passes)])
