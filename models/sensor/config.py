"""The `sensor.model` and `sensor.calibrate` sections of params.yaml."""

from __future__ import annotations

from pydantic import Field

from data.config import StrictModel


class SensorModelConfig(StrictModel):
    """Sizes of the sensor encoder."""

    hidden: int = Field(32, ge=4)
    layers: int = Field(3, ge=1, description="dilated convolution blocks")
    kernel_size: int = Field(3, ge=2)
    dropout: float = Field(0.1, ge=0, lt=1)


class SensorCalibrateConfig(StrictModel):
    """Calibration and the alert operating point, both fitted on validation."""

    target_precision: float = Field(0.8, gt=0, le=1, description="alert threshold: lowest with this validation precision")
