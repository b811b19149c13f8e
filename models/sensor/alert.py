"""The deployable sensor graph with the novelty score: the calibrated ensemble and the pretrained scorer side by side.

Inputs: features (B, 2C, T) from WindowFeaturizer, and each window's unit reference (models/sensor/departure.py):
reference_mean and reference_scale (B, D) over the window's description (D = E embedding dimensions + C channel
means), reference_log_error (B,). Outputs, each (B,) unless said:

* probability, uncertainty: the calibrated ensemble's (models/sensor/calibrated.py);
* novelty: the calibrated probability of "abnormal" from the window's departure from its reference;
* combined: the fitted combination rule over the base logits (models/sensor/combination.py);
* description (B, D), reconstruction_error: what a unit's reference is fitted on (the service fits one from a
  unit's healthy windows with this same graph).
"""

from __future__ import annotations

import torch
from torch import nn

from models.sensor.combination import CLIP
from models.sensor.departure import EPS
from models.sensor.novelty import NoveltyScorer

INPUT_AXES = {"features": {0: "batch", 2: "time"}, "reference_mean": {0: "batch"}, "reference_scale": {0: "batch"},
              "reference_log_error": {0: "batch"}}  # the dynamic axes of export_onnx
OUTPUTS = ["probability", "uncertainty", "novelty", "combined", "description", "reconstruction_error"]


def _logit(p: torch.Tensor) -> torch.Tensor:
    p = p.clamp(CLIP, 1 - CLIP)
    return torch.log(p / (1 - p))


class AlertModel(nn.Module):
    """forward(features, reference_mean, reference_scale, reference_log_error) -> OUTPUTS (see the module)."""

    def __init__(self, ensemble: nn.Module, scorer: NoveltyScorer, novelty: dict, combination: dict):
        super().__init__()
        self.ensemble, self.scorer = ensemble, scorer
        self.register_buffer("novelty_weights", torch.tensor(novelty["weights"], dtype=torch.float32))
        self.register_buffer("novelty_intercept", torch.tensor(novelty["intercept"], dtype=torch.float32))
        self.register_buffer("rule_weights", torch.tensor(combination["weights"], dtype=torch.float32))
        self.register_buffer("rule_intercept", torch.tensor(combination["intercept"], dtype=torch.float32))

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """inputs: features, reference_mean, reference_scale, reference_log_error (as export_onnx passes them)."""
        features, reference_mean, reference_scale, reference_log_error = inputs
        probability, uncertainty = self.ensemble(features)
        description, error = self.scorer(features)
        squared = ((description - reference_mean) / reference_scale) ** 2
        size = self.scorer.encoder.embedding_size
        departure = torch.stack([torch.log(squared[:, :size].mean(dim=-1) + EPS),
                                 torch.log(squared[:, size:].mean(dim=-1) + EPS),
                                 torch.log(error + EPS) - reference_log_error], dim=-1)
        # weighted sums written elementwise: a MatMul with a vector of weights breaks int8 quantisation's MatMul pass
        novelty = torch.sigmoid((departure * self.novelty_weights).sum(dim=-1) + self.novelty_intercept)
        bases = torch.stack([_logit(probability), _logit(novelty), _logit(torch.maximum(probability, novelty))], dim=-1)
        combined = torch.sigmoid((bases * self.rule_weights).sum(dim=-1) + self.rule_intercept)
        return probability, uncertainty, novelty, combined, description, error
