"""params.yaml, loaded and validated into pydantic models: the single source of truth.

An unknown key or a wrong type is an error that names the key (e.g. `sensor.data.window`).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import Field, ValidationError

from data.config import StrictModel
from data.molecules.config import MoleculeDataConfig
from data.sensors.config import SensorDataConfig
from flows.config import ExportConfig, RegistryConfig, TrackingConfig
from models.molecule.config import (
    MoleculeCalibrateConfig,
    MoleculeFinetuneConfig,
    MoleculeModelConfig,
    MoleculePretrainConfig,
)
from models.sensor.config import (
    SensorBaselineConfig,
    SensorCalibrateConfig,
    SensorFinetuneConfig,
    SensorModelConfig,
    SensorPretrainConfig,
)

DEFAULT_PARAMS = "params.yaml"


class SensorParams(StrictModel):
    data: SensorDataConfig = Field(default_factory=SensorDataConfig)
    model: SensorModelConfig = Field(default_factory=SensorModelConfig)
    pretrain: SensorPretrainConfig = Field(default_factory=SensorPretrainConfig)
    finetune: SensorFinetuneConfig = Field(default_factory=SensorFinetuneConfig)
    calibrate: SensorCalibrateConfig = Field(default_factory=SensorCalibrateConfig)
    baseline: SensorBaselineConfig = Field(default_factory=SensorBaselineConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)
    registry: RegistryConfig = Field(
        default_factory=lambda: RegistryConfig(
            model_name="sensor-failure-detector", primary_metric="pr_auc", mode="max", max_calibration_error=0.1
        )
    )


class MoleculeParams(StrictModel):
    data: MoleculeDataConfig = Field(default_factory=MoleculeDataConfig)
    model: MoleculeModelConfig = Field(default_factory=MoleculeModelConfig)
    pretrain: MoleculePretrainConfig = Field(default_factory=MoleculePretrainConfig)
    finetune: MoleculeFinetuneConfig = Field(default_factory=MoleculeFinetuneConfig)
    calibrate: MoleculeCalibrateConfig = Field(default_factory=MoleculeCalibrateConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)
    registry: RegistryConfig = Field(
        default_factory=lambda: RegistryConfig(
            model_name="molecular-property", primary_metric="rmse", mode="min", max_calibration_error=0.15
        )
    )


class Params(StrictModel):
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    sensor: SensorParams = Field(default_factory=SensorParams)
    molecule: MoleculeParams = Field(default_factory=MoleculeParams)


class ParamsError(ValueError):
    """params.yaml is unreadable or invalid; the message lists each bad key."""


def load_params(path: str | Path = DEFAULT_PARAMS) -> Params:
    """Read and validate params.yaml; raises ParamsError naming the file and every bad key."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ParamsError(f"{path}: file not found") from None
    except yaml.YAMLError as error:
        raise ParamsError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: the top level must be a mapping of sections")
    try:
        return Params.model_validate(raw)
    except ValidationError as error:
        lines = [f"  {'.'.join(str(part) for part in e['loc']) or '(top level)'}: {e['msg']}" for e in error.errors()]
        raise ParamsError(f"{path}: invalid parameters:\n" + "\n".join(lines)) from None
