"""params.yaml, loaded and validated into pydantic models: the single source of truth.

An unknown key or a wrong type is an error that names the key (e.g. `sensor.data.window`).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from contract.registry import DEFAULT_MODEL_NAMES
from data.config import StrictModel
from flows._environment import workspace
from data.molecules.config import MoleculeDataConfig
from data.sensors.config import SensorDataConfig
from flows.config import (ExportConfig, MonitorConfig, OrchestrationConfig, RegistryConfig, SensorExportConfig,
                          ServingBudget, TrackingConfig, TuneConfig)
from models.molecule.config import (
    MoleculeBaselineConfig,
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
    SensorNoveltyConfig,
    SensorPretrainConfig,
)

DEFAULT_PARAMS = "params.yaml"
SENSOR_TUNE_SPACE = {"finetune.lr": {"low": 0.0003, "high": 0.003, "log": True},
                     "finetune.mixup_alpha": {"choices": [0.0, 0.2]},
                     "finetune.loss.terms": {"choices": [{"bce": 1.0}, {"gce": 1.0}]},
                     "model.dropout": {"choices": [0.0, 0.1, 0.2]}}
MOLECULE_TUNE_SPACE = {"finetune.lr": {"low": 0.0003, "high": 0.003, "log": True},
                       "finetune.regression_loss": {"choices": ["mse", "huber"]},
                       "finetune.warmup_epochs": {"choices": [0, 3]},
                       "model.dropout": {"low": 0.0, "high": 0.3}}


class SensorParams(StrictModel):
    data: SensorDataConfig = Field(default_factory=SensorDataConfig)
    model: SensorModelConfig = Field(default_factory=SensorModelConfig)
    pretrain: SensorPretrainConfig = Field(default_factory=SensorPretrainConfig)
    finetune: SensorFinetuneConfig = Field(default_factory=SensorFinetuneConfig)
    calibrate: SensorCalibrateConfig = Field(default_factory=SensorCalibrateConfig)
    novelty: SensorNoveltyConfig = Field(default_factory=SensorNoveltyConfig)
    baseline: SensorBaselineConfig = Field(default_factory=SensorBaselineConfig)
    tune: TuneConfig = Field(default_factory=lambda: TuneConfig(space=SENSOR_TUNE_SPACE))
    export: SensorExportConfig = Field(default_factory=SensorExportConfig)
    registry: RegistryConfig = Field(
        default_factory=lambda: RegistryConfig(model_name=DEFAULT_MODEL_NAMES["sensor"], max_calibration_error=0.1,
                                               serving_budget_ms=ServingBudget(batch_1=5, batch_64=2))
    )

    @model_validator(mode="after")
    def gate_for_the_task(self) -> SensorParams:
        self.registry.for_task("classification")
        return self


class MoleculeParams(StrictModel):
    data: MoleculeDataConfig = Field(default_factory=MoleculeDataConfig)
    model: MoleculeModelConfig = Field(default_factory=MoleculeModelConfig)
    pretrain: MoleculePretrainConfig = Field(default_factory=MoleculePretrainConfig)
    finetune: MoleculeFinetuneConfig = Field(default_factory=MoleculeFinetuneConfig)
    calibrate: MoleculeCalibrateConfig = Field(default_factory=MoleculeCalibrateConfig)
    baseline: MoleculeBaselineConfig = Field(default_factory=MoleculeBaselineConfig)
    tune: TuneConfig = Field(default_factory=lambda: TuneConfig(space=MOLECULE_TUNE_SPACE))
    export: ExportConfig = Field(default_factory=ExportConfig)
    registry: RegistryConfig = Field(
        default_factory=lambda: RegistryConfig(model_name=DEFAULT_MODEL_NAMES["molecule"], max_calibration_error=0.15,
                                               serving_budget_ms=ServingBudget(batch_1=60, batch_64=30))
    )

    @model_validator(mode="after")
    def gate_for_the_task(self) -> MoleculeParams:
        self.registry.for_task(self.data.task)
        return self


class Params(StrictModel):
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    sensor: SensorParams = Field(default_factory=SensorParams)
    molecule: MoleculeParams = Field(default_factory=MoleculeParams)
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    orchestration: OrchestrationConfig = Field(default_factory=OrchestrationConfig)


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
    return _validated(raw, str(path))


def _validated(raw: dict, where: str) -> Params:
    try:
        return Params.model_validate(raw)
    except ValidationError as error:
        lines = [f"  {'.'.join(str(part) for part in e['loc']) or '(top level)'}: {e['msg']}" for e in error.errors()]
        raise ParamsError(f"{where}: invalid parameters:\n" + "\n".join(lines)) from None


def with_overrides(params: Params, overrides: dict[str, Any]) -> Params:
    """`params` with dotted keys set, e.g. {"sensor.finetune.epochs": 3}; ParamsError names an unknown or
    invalid key."""
    raw = params.model_dump(mode="json")
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = raw
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or leaf not in node:
            raise ParamsError(f"unknown parameter '{key}'")
        node[leaf] = value
    return _validated(raw, "overrides")


def write_overrides(path: str | Path, overrides: dict[str, Any]) -> Params:
    """Set dotted keys in the params file itself, keeping its comments and layout (ruamel.yaml round trip).

    Validated first and written atomically: a bad override raises ParamsError and leaves the file as it was.
    Returns the new parameters.
    """
    path = Path(path)
    params = with_overrides(load_params(path), overrides)
    document = YAML()  # round-trip mode
    document.preserve_quotes, document.width = True, 4096
    document.representer.add_representer(type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null"))
    data = document.load(path.read_text())
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, CommentedMap())
        node[leaf] = value
    buffer = io.StringIO()
    document.dump(data, buffer)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(buffer.getvalue())
    os.replace(tmp, path)
    return params


def tuned_file(family: str, root: Path | None = None) -> Path:
    """Where the `<family>_tune` stage writes its best settings (a DVC output): tuned/<family>.yaml in the workspace."""
    return (root or workspace()) / "tuned" / f"{family}.yaml"


def read_tuned(path: str | Path) -> dict[str, Any]:
    """The dotted keys under the family of a tuned file ({} where it is missing or empty); ParamsError names the
    file where it is not a mapping."""
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ParamsError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: must be a mapping of dotted keys (finetune.lr: 0.001)")
    return raw


def with_tuned(params: Params, family: str, root: Path | None = None) -> tuple[Params, dict[str, Any]]:
    """`params` with tuned/<family>.yaml on top (its keys are under `family`), and those keys; ParamsError names
    the file and a key that is unknown or invalid."""
    path = tuned_file(family, root)
    tuned = read_tuned(path)
    try:
        return with_overrides(params, {f"{family}.{key}": value for key, value in tuned.items()}), tuned
    except ParamsError as error:
        raise ParamsError(f"{path}: {error}") from None
