"""What the molecule model card says of the exported model's outputs: their names and the test metrics of its
predictions (the export stage writes them, the register stage recomputes them for the champion)."""

from __future__ import annotations

import numpy as np

from models.metrics import classification_metrics, regression_metrics
from models.uncertainty_quality import classification_uncertainty_quality, regression_uncertainty_quality


def outputs(task: str) -> list[str]:
    """The ONNX graph's output names."""
    return ["value" if task == "regression" else "probability", "uncertainty"]


def test_metrics(task: str, y: np.ndarray, prediction: np.ndarray, uncertainty: np.ndarray, card: dict) -> dict:
    """Regression: RMSE, MAE, R2 and coverage of value +- z * uncertainty; classification: classification_metrics."""
    if task == "regression":
        half = card["calibration"]["interval_z"] * uncertainty
        return regression_metrics(y, prediction, prediction - half, prediction + half)
    return classification_metrics(y, prediction)


def calibration_error(task: str, metrics: dict, card: dict) -> float:
    """Regression: |test coverage - nominal coverage|; classification: test ECE."""
    if task == "regression":
        return abs(metrics["coverage"] - card["calibration"]["nominal_coverage"])
    return metrics["ece"]


def uncertainty_figures(task: str, y: np.ndarray, prediction: np.ndarray, uncertainty: np.ndarray) -> dict:
    """How well the uncertainty flags the larger errors (models/uncertainty_quality.py): Spearman, AURC and its
    gain; regression also interval coverage at 50/80/90/95 %."""
    if task == "regression":
        return regression_uncertainty_quality(y, prediction, uncertainty)
    return classification_uncertainty_quality(y, prediction, uncertainty)
