"""The deployable sensor ensemble with its calibration inside the ONNX graph.

Temperature: members' sigmoid(logit / T), mean and std over members (as models/export.py).
Isotonic: the piecewise-linear map g (knots from models/calibration.fit_isotonic: centred isotonic
regression, strictly increasing knots on [0, 1], so the ranking of windows is kept) applied to the
members' mean probability; uncertainty = std over members of g(member probability). g is written as
y0 + sum_i slope_i * clamp(p - x_i, 0, x_{i+1} - x_i): elementwise ops only, exact np.interp semantics.
"""

from __future__ import annotations

import torch
from torch import nn

from models.calibration import IsotonicCalibration, ProbabilityCalibrator, TemperatureCalibration, parse_calibration
from models.export import CalibratedClassifierEnsemble, member_samples


class PiecewiseLinear(nn.Module):
    """Increasing piecewise-linear map through knots (x_i, y_i), constant outside [x_0, x_last]; any shape."""

    def __init__(self, knots_x: list[float], knots_y: list[float]):
        super().__init__()
        x = torch.tensor(knots_x, dtype=torch.float64)
        y = torch.tensor(knots_y, dtype=torch.float64)
        if len(x) != len(y) or len(x) < 1:
            raise ValueError("piecewise-linear map needs as many y as x knots, at least one")
        width = x[1:] - x[:-1]
        slope = torch.where(width > 0, (y[1:] - y[:-1]) / width.clamp(min=1e-12), torch.zeros_like(width))
        self.register_buffer("start", x[:-1].float())
        self.register_buffer("width", width.float())
        self.register_buffer("slope", slope.float())
        self.register_buffer("y0", y[0].float())

    def forward(self, p: torch.Tensor) -> torch.Tensor:
        steps = torch.minimum(torch.relu(p.unsqueeze(-1) - self.start), self.width)
        return self.y0 + (steps * self.slope).sum(dim=-1)


class IsotonicCalibratedEnsemble(nn.Module):
    """Members -> (probability (B,) = g(mean_s sigmoid(logit_s)), uncertainty (B,) = std_s g(sigmoid(logit_s))) over the
    members' samples s (one per member, or its fixed-mask passes: models/mc_dropout.py FixedMaskPasses)."""

    def __init__(self, members: list[nn.Module], knots_x: list[float], knots_y: list[float]):
        super().__init__()
        self.members = nn.ModuleList(members)
        self.calibrate = PiecewiseLinear(knots_x, knots_y)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probabilities = torch.sigmoid(member_samples(self.members, inputs))
        calibrated = self.calibrate(probabilities)
        spread = ((calibrated - calibrated.mean(dim=-1, keepdim=True)) ** 2).mean(dim=-1).sqrt()
        return self.calibrate(probabilities.mean(dim=-1)), spread


EXPORT_WRAPPERS = {  # each probability calibration's wrapper: (members, calibration) -> module
    TemperatureCalibration: lambda members, c: CalibratedClassifierEnsemble(members, c.temperature),
    IsotonicCalibration: lambda members, c: IsotonicCalibratedEnsemble(members, c.knots_x, c.knots_y),
}


def calibrated_ensemble(members: list[nn.Module], calibration: ProbabilityCalibrator | dict) -> nn.Module:
    """The export wrapper for a probability calibration (or its JSON form, as the calibrate stage writes it)."""
    chosen = parse_calibration(calibration)
    if type(chosen) not in EXPORT_WRAPPERS:
        raise ValueError(f"calibration method '{chosen.method}' has no sensor export wrapper")
    return EXPORT_WRAPPERS[type(chosen)](members, chosen)
