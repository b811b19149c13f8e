"""Load one registered model version: download it, verify its signed manifest, open an ONNX Runtime session."""

from __future__ import annotations

import math
import os
import tempfile
from typing import Any
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from mlflow import MlflowClient

from contract.card import ModelCard, parse_card
from contract.reference import read_reference
from contract.registry import download_verified
from serving.family import family_class

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


@dataclass(frozen=True)
class LoadedModel:
    """A model version ready to answer, and what /v1/models says about it."""

    family: str
    name: str
    version: str
    alias: str
    sha256: str
    card: ModelCard  # validated by its family's card model (contract/card.py)
    predictor: Any  # the family's predictor (models/predictors.py)
    reference: dict | None = None  # training reference arrays (contract/reference.py); None for older versions
    details: dict = field(default_factory=dict)  # the family's own /v1/models fields (ServedFamily.details)

    def describe(self) -> dict:
        """serving.schemas.ModelInfo's fields: `interval` when the card has one, and the family's own details."""
        metrics = {k: v if math.isfinite(v) else None for k, v in self.card.test_metrics.items()}
        info = {
            "family": self.family, "name": self.name, "version": self.version, "alias": self.alias,
            "provider": self.predictor.provider, "sha256": self.sha256, "task": self.card.task,
            "target": self.card.target, "metrics": metrics,
        }
        calibration = self.card.calibration
        if "interval_z" in calibration and "nominal_coverage" in calibration:
            info["interval"] = {"z": calibration["interval_z"], "coverage": calibration["nominal_coverage"]}
        return {**info, **self.details}


def load_version(client: MlflowClient, family: str, name: str, version: str, alias: str,
                 public_key: Ed25519PublicKey, prefer_cuda: bool) -> LoadedModel:
    """Download `name` version `version`, verify every file against its manifest signed by the pipeline's key,
    and build its predictor. Raises ManifestError or CardError (one line naming the version) when it must not
    be served."""
    served = family_class(family)
    with tempfile.TemporaryDirectory(prefix="serving-") as scratch:
        verified = download_verified(client, name, version, Path(scratch), public_key)
        predictor = served.predictor(verified.onnx, verified.card, prefer_cuda=prefer_cuda)
        reference = read_reference(verified.directory)
    card = parse_card(verified.card)
    return LoadedModel(family, name, str(version), alias, verified.manifest["files"]["model.onnx"], card, predictor,
                       reference, served.details(card))
