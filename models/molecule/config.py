"""The `molecule.model` and `molecule.calibrate` sections of params.yaml."""

from __future__ import annotations

from pydantic import Field

from data.config import StrictModel


class MoleculeModelConfig(StrictModel):
    """Sizes of the molecular graph encoder."""

    hidden: int = Field(64, ge=4)
    layers: int = Field(3, ge=1, description="GINE message-passing layers")
    dropout: float = Field(0.1, ge=0, lt=1)


class MoleculeCalibrateConfig(StrictModel):
    """Uncertainty calibration on validation."""

    interval_z: float = Field(1.96, gt=0, description="regression: interval = value +- z * uncertainty (1.96: 95 %)")
