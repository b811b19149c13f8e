"""MC-dropout (Gal and Ghahramani, 2016): dropout stays on at prediction, and N stochastic passes of one trained
network give a spread that stands for its uncertainty, next to (or inside) a deep ensemble's spread over members.

Fixed masks (as in Masksembles, Durasov et al., 2021) draw each pass's dropout masks once, per feature: a pass is one
fixed sub-network of the trained one, so an item's answer repeats on every call and does not depend on the other
items of its batch, which a served model needs and ONNX Runtime's sampled Dropout does not give."""

from __future__ import annotations

import copy
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


class FixedMaskDropout(nn.Module):
    """Dropout with its masks drawn once: `masks` (passes, features) of 0 and 1 / (1 - p), features on `axis` of the
    input (-1: (..., features); 1: (B, features, T)) -> the input times masks[index] (every item and position alike),
    in train and eval mode."""

    def __init__(self, masks: torch.Tensor, axis: int = -1):
        super().__init__()
        self.register_buffer("masks", masks)
        self.axis, self.index = axis, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = [1] * x.dim()
        shape[self.axis] = self.masks.shape[-1]
        return x * self.masks[self.index].reshape(shape)


FEATURE_AXIS = "feature_axis"
"""A Dropout module's attribute naming the axis of its input that holds features (default -1, the last); None: no
fixed mask, the module stays off (e.g. dropout on attention weights, whose axes are time steps of any length)."""


def fix_dropout_masks(model: nn.Module, passes: int, seed: int, probe: Callable[[nn.Module], object]) -> nn.Module:
    """A copy of `model` in eval mode whose Dropout modules are FixedMaskDropout with `passes` masks over their
    input's feature axis (the module's FEATURE_AXIS, default the last), drawn by `seed` and the module's place.
    `probe(copy)` runs a forward pass that shows each Dropout's feature size; a Dropout it does not reach, or whose
    FEATURE_AXIS is None, stays (off in eval mode)."""
    if passes < 1:
        raise ValueError(f"fixed masks need at least one pass (got {passes})")
    masked = copy.deepcopy(model).eval()
    dropouts = [(name, m) for name, m in masked.named_modules() if isinstance(m, nn.modules.dropout._DropoutNd)]
    sizes: dict[str, int] = {}

    def record(name: str, axis: int):
        def hook(_, args) -> None:
            sizes.setdefault(name, args[0].shape[axis])
        return hook

    hooks = [m.register_forward_pre_hook(record(name, getattr(m, FEATURE_AXIS, -1))) for name, m in dropouts
             if getattr(m, FEATURE_AXIS, -1) is not None]
    with torch.no_grad():
        probe(masked)
    for hook in hooks:
        hook.remove()
    for index, (name, module) in enumerate(dropouts):
        if name in sizes:  # each module's own generator: one the probe misses shifts no other's masks
            generator = torch.Generator().manual_seed(seed * 10_007 + index)
            keep = torch.rand(passes, sizes[name], generator=generator) >= module.p
            parent, _, child = name.rpartition(".")
            setattr(masked.get_submodule(parent), child,
                    FixedMaskDropout(keep.float() / (1 - module.p), getattr(module, FEATURE_AXIS, -1)))
    return masked


def fixed_mask_members(members: list[nn.Module], passes: int, seed: int,
                       probe: Callable[[nn.Module], object]) -> list[nn.Module]:
    """Each member with `passes` fixed masks (fix_dropout_masks), member i's drawn with seed * 1000 + i."""
    return [fix_dropout_masks(m, passes, seed * 1000 + i, probe) for i, m in enumerate(members)]


def pass_outputs(masked: list[nn.Module], passes: int, predict: Callable[[nn.Module], np.ndarray]) -> np.ndarray:
    """(n, members * passes): `predict(model)` (n,) of every fixed_mask_members member on each of its passes, member
    by member (the order of an exported ensemble of FixedMaskPasses)."""
    return np.stack([predict(set_pass(m, p)) for m in masked for p in range(passes)], axis=1)


def ensemble_outputs(members: list[nn.Module], passes: int, predict: Callable[[nn.Module], np.ndarray],
                     masked: Callable[[], list[nn.Module]]) -> np.ndarray:
    """What calibration fits on, for either family: (n, members) of `predict(member)` (n,), or with `passes` > 0
    (n, members * passes) on each pass of `masked()` (the members with fixed masks: the family's fixed_mask_members),
    member by member."""
    if passes == 0:
        return np.stack([predict(m) for m in members], axis=1)
    return pass_outputs(masked(), passes, predict)


def set_pass(model: nn.Module, index: int) -> nn.Module:
    """`model` with every FixedMaskDropout on its pass `index`."""
    for module in model.modules():
        if isinstance(module, FixedMaskDropout):
            module.index = index
    return model


class FixedMaskPasses(nn.Module):
    """A model with fixed masks (fix_dropout_masks) run on each of its `passes`: (*inputs) -> (B, passes). Exported,
    the passes are part of the graph: one trained network gives `passes` repeatable answers per item."""

    def __init__(self, masked: nn.Module, passes: int):
        super().__init__()
        self.masked, self.passes = masked, passes

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return torch.stack([set_pass(self.masked, index)(*inputs) for index in range(self.passes)], dim=-1)

