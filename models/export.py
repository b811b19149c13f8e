"""Deployable wrappers (ensemble + calibration inside the graph) and ONNX export with dynamic shapes."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx_ir as ir
import torch
from onnx_ir.traversal import RecursiveGraphIterator
from torch import nn
from torch.export import Dim


def _mean_and_std(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, S) -> mean (B,), population std (B,) over samples."""
    mean = values.mean(dim=-1)
    return mean, ((values - mean.unsqueeze(-1)) ** 2).mean(dim=-1).sqrt()


def member_samples(members: nn.ModuleList, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """(B, S): every member's outputs side by side, a member answering (B,) or (B, passes) (models/mc_dropout.py:
    FixedMaskPasses)."""
    outputs = [member(*inputs) for member in members]
    return torch.cat([out.unsqueeze(-1) if out.dim() == 1 else out for out in outputs], dim=-1)


class CalibratedClassifierEnsemble(nn.Module):
    """Members' logits / T -> sigmoid -> (probability (B,), uncertainty (B,) = std over members' samples)."""

    def __init__(self, members: list[nn.Module], temperature: float):
        super().__init__()
        self.members = nn.ModuleList(members)
        self.register_buffer("temperature", torch.tensor(float(temperature)))

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _mean_and_std(torch.sigmoid(member_samples(self.members, inputs) / self.temperature))


class CalibratedRegressorEnsemble(nn.Module):
    """Members' standardised outputs -> (value (B,) in target units, uncertainty (B,) = scaled std)."""

    def __init__(self, members: list[nn.Module], target_mean: float, target_std: float, scale: float):
        super().__init__()
        self.members = nn.ModuleList(members)
        self.register_buffer("target_mean", torch.tensor(float(target_mean)))
        self.register_buffer("target_std", torch.tensor(float(target_std)))
        self.register_buffer("scale", torch.tensor(float(scale)))

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, std = _mean_and_std(member_samples(self.members, inputs))
        return self.target_mean + self.target_std * mean, self.target_std * self.scale * std


PARITY_TOLERANCE = 1e-4
"""Absolute part of the parity bound: outputs near 0 (probabilities, uncertainties)."""
PARITY_RELATIVE_TOLERANCE = 1e-4
"""Relative part: outputs of large magnitude (a regression target in the thousands) carry float32 rounding of that
size."""


def check_parity(expected: tuple[torch.Tensor, ...], got: list[np.ndarray], tolerance: float = PARITY_TOLERANCE,
                 relative_tolerance: float = PARITY_RELATIVE_TOLERANCE) -> float:
    """Max |ONNX Runtime - PyTorch| over matching outputs; raises where an element is further apart than
    tolerance + relative_tolerance * |PyTorch's value| (numpy.allclose's rule)."""
    diff, worst = 0.0, None
    for name_index, (g, e) in enumerate(zip(got, expected)):
        reference = e.detach().numpy()
        apart = np.abs(g - reference)
        diff = max(diff, float(apart.max(initial=0.0)))
        excess = apart - (tolerance + relative_tolerance * np.abs(reference))
        if not (excess <= 0).all():  # NaN counts as apart
            at = int(np.argmax(np.where(np.isnan(excess), np.inf, excess)))
            worst = worst or (name_index, float(apart.flat[at]), float(reference.flat[at]))
    if worst is not None:
        output, apart, value = worst
        raise RuntimeError(f"ONNX export differs from PyTorch by {apart:.2e} at a value of {value:.4g} (output "
                           f"{output}; bound {tolerance} + {relative_tolerance} x |value|)")
    return diff


def export_onnx(
    model: nn.Module,
    example_inputs: dict[str, torch.Tensor],
    dynamic_axes: dict[str, dict[int, str]],
    output_names: list[str],
    path: str | Path,
    opset: int = 18,
) -> Path:
    """Export with the dynamo exporter; axes named alike share one dynamic dimension."""
    dims: dict[str, Dim] = {}
    dynamic_shapes = {
        name: {axis: dims.setdefault(label, Dim(label)) for axis, label in axes.items()}
        for name, axes in dynamic_axes.items()
    }
    model = model.eval().cpu()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            model,
            tuple(example_inputs.values()),
            dynamo=True,
            opset_version=opset,
            input_names=list(example_inputs),
            output_names=output_names,
            dynamic_shapes=(tuple(dynamic_shapes.get(name, {}) for name in example_inputs),),
            verbose=False,
        )
    drop_source_locations(program.model)
    program.save(str(path))
    return path


SOURCE_LOCATION = "pkg.torch.onnx.stack_trace"


def drop_source_locations(model: ir.Model) -> None:
    """Remove the exporter's per-node Python stack traces: they name this checkout's files and line numbers, so the
    same weights would give other ONNX bytes (and another DVC hash) in another folder. The other node metadata (module
    names and scopes) stays."""
    for graph in (model.graph, *model.functions.values()):
        for node in RecursiveGraphIterator(graph):
            node.metadata_props.pop(SOURCE_LOCATION, None)
