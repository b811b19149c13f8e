"""Load one registered model version: download, check its sha256 against the registry, open an ONNX session."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import mlflow
from mlflow import MlflowClient

from flows.registry import read_card, sha256_file
from models.predictors import MoleculePredictor, SensorPredictor

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

PREDICTORS = {"sensor": SensorPredictor, "molecule": MoleculePredictor}


class IntegrityError(RuntimeError):
    """The downloaded ONNX file is not the one the registry recorded."""


@dataclass(frozen=True)
class LoadedModel:
    """A model version ready to answer, and what /v1/models says about it."""

    family: str
    name: str
    version: str
    alias: str
    sha256: str
    card: dict
    predictor: SensorPredictor | MoleculePredictor

    def describe(self) -> dict:
        info = {
            "family": self.family, "name": self.name, "version": self.version, "alias": self.alias,
            "provider": self.predictor.provider, "sha256": self.sha256, "task": self.card["task"],
            "metrics": self.card.get("test_metrics", {}),
        }
        if self.family == "sensor":
            info.update(channels=self.card["channels"], window=int(self.card["window"]),
                        threshold=float(self.card["threshold"]))
        return info


def load_version(client: MlflowClient, family: str, name: str, version: str, alias: str,
                 prefer_cuda: bool) -> LoadedModel:
    """Download `name` version `version`, verify the ONNX file's sha256 against the version's
    `onnx_sha256` tag, and build its predictor. Raises IntegrityError on a missing tag or a mismatch."""
    expected = client.get_model_version(name, version).tags.get("onnx_sha256")
    if not expected:
        raise IntegrityError(f"{name} version {version} has no onnx_sha256 tag; refusing to serve it")
    source = client.get_model_version_download_uri(name, version)
    with tempfile.TemporaryDirectory(prefix="serving-") as scratch:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=scratch))
        onnx_path = local / "model.onnx"
        actual = sha256_file(onnx_path)
        if actual != expected:
            raise IntegrityError(f"{name} version {version}: model.onnx has sha256 {actual}, "
                                 f"the registry recorded {expected}; refusing to serve it")
        card = read_card(local)
        predictor = PREDICTORS[family](onnx_path, card, prefer_cuda=prefer_cuda)
    return LoadedModel(family, name, str(version), alias, actual, card, predictor)
