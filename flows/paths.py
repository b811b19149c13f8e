"""Where each stage reads and writes, per model family (the same paths dvc.yaml declares)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flows._environment import workspace


@dataclass(frozen=True)
class StagePaths:
    """Files of one model family's pipeline, inside the workspace (`root`, default: the current folder)."""

    family: str
    workspace: Path | None = None

    @property
    def root(self) -> Path:
        return self.workspace or workspace()

    @property
    def prepared(self) -> Path:
        return self.root / "data" / "prepared" / self.family

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts" / self.family

    @property
    def pretrained(self) -> Path:
        return self.artifacts / "pretrained.pt"

    @property
    def finetuned(self) -> Path:
        return self.artifacts / "finetuned.pt"

    @property
    def calibration(self) -> Path:
        return self.artifacts / "calibration.json"

    @property
    def novelty(self) -> Path:
        return self.artifacts / "novelty.json"

    @property
    def baseline(self) -> Path:
        return self.artifacts / "baseline.json"

    @property
    def onnx(self) -> Path:
        return self.artifacts / "export" / "model.onnx"

    @property
    def model_card(self) -> Path:
        """Everything serving needs next to the ONNX file: featurisation, calibration, test metrics."""
        return self.artifacts / "export" / "model_card.json"

    @property
    def reference(self) -> Path:
        """Training reference statistics registered with the model (contract/reference.py)."""
        return self.artifacts / "export" / "reference.npz"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics" / f"{self.family}.json"

    @property
    def test_metrics(self) -> Path:
        """A folder of one JSON file of test metrics per model (`ours.json`, `<baseline>.json`): the rows of
        `dvc metrics show`."""
        return self.root / "metrics" / self.family

    @property
    def predictions(self) -> Path:
        return self.root / "metrics" / f"{self.family}_predictions.csv"

    @property
    def plots(self) -> Path:
        return self.root / "metrics" / "plots" / self.family


SENSOR = StagePaths("sensor")
MOLECULE = StagePaths("molecule")
