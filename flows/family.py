"""A model family as the pipeline sees it, and the registry of families.

The stages both families have (flows/stages/: prepare, pretrain, finetune, calibrate, baseline, export, register,
tune) are one generic flow each: they load params, open the MLflow run, write the stage's files and print, and ask
the family for what only it knows (its data, featuriser, network, calibrator, baselines, ONNX graph and figures).
A family implements `PipelineFamily` once, in `flows/<family>/family.py` as `FAMILY`, and is one line of
`FAMILIES`. Its methods import their models/ code inside themselves: a stage then loads, and DVC hashes, only the
code of the methods it calls (tests/unit/test_dvc_inputs.py follows them).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.paths import StagePaths

if TYPE_CHECKING:
    import pandas as pd

FAMILIES: dict[str, str] = {
    "sensor": "flows.sensor.family",
    "molecule": "flows.molecule.family",
}
"""Family name -> the module whose `FAMILY` implements it (one line per family)."""


class UnknownFamilyError(KeyError):
    """A family name that `FAMILIES` does not register."""


def pipeline_family(name: str) -> PipelineFamily:
    """The registered family `name`."""
    if name not in FAMILIES:
        raise UnknownFamilyError(f"no model family '{name}' (registered: {', '.join(FAMILIES)})")
    return importlib.import_module(FAMILIES[name]).FAMILY


@dataclass
class Prepared:
    """What prepare made: the family's prepared data (`save_prepared` writes it), its report, metrics for MLflow and
    a line to print."""

    data: Any
    report: dict
    metrics: dict[str, float]
    message: str


@dataclass
class FinetuneData:
    """What every ensemble member (and tuning trial) trains on: the family's featurised splits (`data`), the
    pretrained weights (None: from scratch), what the training loop's validation score is (higher is better) and
    tags for the MLflow run."""

    data: Any
    pretrained: dict | None
    score_name: str
    tags: dict[str, str] = field(default_factory=dict)


@dataclass
class Exported:
    """What export made besides model.onnx: the model card (without `onnx_sha256`), the training reference of the
    monitor (contract/reference.py), the test predictions (one row per item), MLflow metrics besides the card's and
    a line."""

    card: dict
    reference: Any
    predictions: pd.DataFrame
    metrics: dict[str, float]
    message: str


class PipelineFamily(ABC):
    """One model family's parts, called by the generic stages (flows/stages/)."""

    name: str
    summary_metrics: tuple[str, ...] = ()
    """The test metrics `make run`'s summary shows, the headline first (none: every one)."""
    sources_without_files: tuple[str, ...] = ()
    """The `data.source` values that read no file (built-in data: simulated, or shipped with a package)."""

    @property
    def paths(self) -> StagePaths:
        return StagePaths(self.name)

    def settings(self, params) -> Any:
        """The family's section of params.yaml (sections: data, model, pretrain, finetune, calibrate, baseline,
        export, registry, tune)."""
        return getattr(params, self.name)

    # ---------------------------------------------------------------- prepare
    @abstractmethod
    def prepare(self, data) -> Prepared:
        """Load, validate and split the data the family's `data` settings name."""

    @abstractmethod
    def save_prepared(self, prepared: Prepared, folder: Path) -> None:
        """Write the prepared data to `folder` (a DVC output)."""

    @abstractmethod
    def load_prepared(self) -> Any:
        """The prepared data as the later stages read it (no torch)."""

    # ---------------------------------------------------------------- pretrain
    def no_pretraining(self) -> dict:
        """The pretrained file's content where pretraining is off."""
        return {"state": None}

    def pretrain(self, cfg) -> tuple[dict, list[dict], str]:
        """Self-supervised pretraining: the file's content, the loss history and a line saying on what."""
        raise NotImplementedError(f"the {self.name} family has no pretraining: set {self.name}.pretrain.enabled false")

    # ---------------------------------------------------------------- finetune
    @abstractmethod
    def finetune_data(self, cfg, in_flow: bool = True) -> FinetuneData:
        """The featurised splits and the pretrained weights where `cfg.finetune.use_pretrained` (in_flow=False: tasks
        called as plain functions)."""

    @abstractmethod
    def train_member(self, cfg, inputs: FinetuneData, seed: int, checkpoint: Path | None = None, distributed=None,
                     on_epoch=None) -> tuple[Any, Any]:
        """One ensemble member with the settings `cfg`: (network, models.training.TrainResult)."""

    @abstractmethod
    def save_ensemble(self, cfg, inputs: FinetuneData, members: list, histories: list[list[dict]]) -> None:
        """Write the members to `paths.finetuned`."""

    @abstractmethod
    def tune_metric(self, inputs: FinetuneData) -> tuple[str, float]:
        """The tuning objective's name and the sign that turns the validation score into it (e.g. "val_rmse", -1)."""

    def inert_tune_settings(self, params) -> set[str]:
        """Keys of the tuning space that cannot change a trial with these params."""
        return set()

    # ---------------------------------------------------------------- calibrate, baseline
    @abstractmethod
    def calibrate(self, cfg) -> tuple[dict, list[Path], str]:
        """Fit the calibration on validation: calibration.json's content ("method", the fitted values, "mask_passes"
        and "mask_seed" of the members' fixed-mask passes, ...), figures for MLflow and a line."""

    @abstractmethod
    def baselines(self, cfg) -> dict:
        """Fit the baselines: baseline.json's content, {"name", "test" (metrics), ...} of the one the promotion
        gate compares with, every baseline's under "baselines" where there are several."""

    # ---------------------------------------------------------------- export, register
    @abstractmethod
    def export(self, cfg) -> Exported:
        """Write `paths.onnx` (parity-checked against the network) and evaluate it on test."""

    @abstractmethod
    def predictor(self, onnx_path: Path, card: dict, threads: int | None = None):
        """The served model's predictor on the CPU (models/predictors.py), with `featurize(items)` and
        `run_features(features)` (models/serving_cost.py); `threads`: ONNX Runtime's intra-op threads."""

    @abstractmethod
    def serving_items(self, prepared, card: dict) -> Any:
        """Test items as a client sends them to the model of `card` (raw windows (n, C, T), SMILES), to measure the
        serving cost on."""

    @abstractmethod
    def signature(self, card: dict):
        """The registered model's MLflow signature."""

    @abstractmethod
    def champion_metrics(self, prepared, onnx_path: Path, card: dict) -> dict[str, float]:
        """Test metrics of a registered model (the champion) on this run's test split."""

    def test_positives(self, prepared, card: dict) -> int | None:
        """Positive test labels of a classifier (the gate wants enough), None for a regressor."""
        return None

    def test_figures(self, prepared, card: dict, baseline: dict) -> list[Path]:
        """Figures of the test predictions next to the baselines' (a DVC plot among them)."""
        return []

    # ---------------------------------------------------------------- monitor
    def input_drift(self, reference: dict, recent: pd.DataFrame, cfg) -> tuple[dict, list[str], dict[str, float]]:
        """How far the recent served inputs (the prediction store's rows) are from the training reference
        (contract/reference.py), with `monitor` settings `cfg`: a report, its alarms, flat metrics for MLflow."""
        return {"note": f"the {self.name} family reports no input drift"}, [], {}
