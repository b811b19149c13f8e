"""Sections of params.yaml owned by the flows layer: tracking and the promotion gate."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from data.config import StrictModel


class TrackingConfig(StrictModel):
    """Where MLflow keeps runs and artifacts (relative paths are inside the project).

    The environment variable MLFLOW_TRACKING_URI, when set, wins over `uri`.
    """

    uri: str = "sqlite:///mlflow/mlflow.db"
    artifact_root: str = "mlflow/artifacts"


class ExportConfig(StrictModel):
    """ONNX export."""

    opset: int = Field(18, ge=18)


class RegistryConfig(StrictModel):
    """The registered model and the gate a new version passes to become `champion`."""

    model_name: str
    primary_metric: str
    mode: Literal["max", "min"] = Field(description="max: higher primary metric is better")
    tolerance: float = Field(0.0, ge=0, description="a challenger may be this much worse and still be promoted")
    max_calibration_error: float = Field(0.1, gt=0, description="ECE (classification) or |coverage - nominal| (regression) bound")
