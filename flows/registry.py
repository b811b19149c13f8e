"""The MLflow model registry: ONNX versions, the promotion gate, `challenger`/`champion` aliases."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import mlflow
import onnx
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.models import Model, ModelSignature

from flows.config import RegistryConfig
from models.predictors import IncompatibleModelError

CHAMPION, CHALLENGER = "champion", "challenger"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass
class Decision:
    """Whether a challenger becomes champion, and why."""

    promote: bool
    reasons: list[str] = field(default_factory=list)


def decide(
    cfg: RegistryConfig, challenger: dict[str, float], champion: dict[str, float] | None, calibration_error: float
) -> Decision:
    """The promotion gate: calibration within bounds and primary metric at least as good as the
    champion's on the same test split (within `cfg.tolerance`)."""
    metric = cfg.primary_metric
    value = challenger.get(metric, float("nan"))
    reasons: list[str] = []
    promote = True
    if not math.isfinite(value):
        return Decision(False, [f"challenger {metric} is {value}"])
    if not calibration_error <= cfg.max_calibration_error:
        promote = False
        reasons.append(f"calibration error {calibration_error:.4f} exceeds {cfg.max_calibration_error}")
    if champion is None:
        reasons.append("no champion to compare with")
    else:
        best = champion[metric]
        ok = value >= best - cfg.tolerance if cfg.mode == "max" else value <= best + cfg.tolerance
        relation = "at least as good as" if ok else "worse than"
        reasons.append(f"{metric} {value:.4f} is {relation} champion's {best:.4f} (tolerance {cfg.tolerance})")
        promote = promote and ok
    return Decision(promote, reasons)


def champion_files(name: str, destination: Path) -> tuple[Path, dict, str] | None:
    """Download the current champion's ONNX file and model card; None when there is no champion."""
    client = MlflowClient()
    try:
        version = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return None
    local = Path(mlflow.artifacts.download_artifacts(f"models:/{name}@{CHAMPION}", dst_path=str(destination)))
    return local / "model.onnx", read_card(local), version.version


def read_card(model_dir: Path) -> dict:
    """The model card stored as metadata in a downloaded model's MLmodel file."""
    return Model.load(str(model_dir)).metadata["card"]


def register_version(
    cfg: RegistryConfig,
    onnx_path: Path,
    card: dict,
    signature: ModelSignature,
    tags: dict[str, str],
) -> str:
    """Log the ONNX file (its model card in the MLmodel metadata) as a new registered version."""
    info = mlflow.onnx.log_model(
        onnx.load(str(onnx_path)),
        name="model",
        signature=signature,
        registered_model_name=cfg.model_name,
        save_as_external_data=False,
        metadata={"card": json.loads(json.dumps(card, default=str))},
    )
    version = str(info.registered_model_version)
    client = MlflowClient()
    for key, value in {**tags, "onnx_sha256": sha256_file(onnx_path)}.items():
        client.set_model_version_tag(cfg.model_name, version, key, str(value))
    return version


def apply_decision(cfg: RegistryConfig, version: str, decision: Decision) -> None:
    """New versions get `challenger`; a passed gate moves `champion` (the previous one is remembered)."""
    client = MlflowClient()
    client.set_registered_model_alias(cfg.model_name, CHALLENGER, version)
    client.set_model_version_tag(cfg.model_name, version, "promotion", "promoted" if decision.promote else "refused")
    client.set_model_version_tag(cfg.model_name, version, "promotion_reasons", "; ".join(decision.reasons))
    if decision.promote:
        try:
            previous = client.get_model_version_by_alias(cfg.model_name, CHAMPION).version
            client.set_model_version_tag(cfg.model_name, version, "previous_champion", previous)
        except MlflowException:
            pass
        client.set_registered_model_alias(cfg.model_name, CHAMPION, version)


def register_and_gate(
    cfg: RegistryConfig,
    card: dict,
    onnx_path: Path,
    signature: ModelSignature,
    champion_metrics: Callable[[Path, dict], dict[str, float]],
    scratch: Path,
) -> dict:
    """Inside an active MLflow run: register a new version, evaluate the current champion on the
    same test split with `champion_metrics(onnx_path, card)`, and apply the promotion gate."""
    existing = champion_files(cfg.model_name, scratch)
    champion, champion_version, notes = None, None, []
    if existing is not None:
        champion_onnx, champion_card, champion_version = existing
        try:
            champion = champion_metrics(champion_onnx, champion_card)
        except IncompatibleModelError as error:
            notes.append(f"champion v{champion_version} cannot run on this code ({error}): no comparison")
    tags = {f"metric.{k}": f"{v:.6g}" for k, v in card["test_metrics"].items()}
    tags.update({k: v for k, v in mlflow.active_run().data.tags.items() if k.startswith(("data.", "git_commit"))})
    tags["featurizer_version"] = str(card.get("featurizer_version", "n/a"))
    version = register_version(cfg, onnx_path, card, signature, tags)
    decision = decide(cfg, card["test_metrics"], champion, card["calibration_error"])
    decision.reasons[:0] = notes
    apply_decision(cfg, version, decision)
    mlflow.log_dict({"promoted": decision.promote, "reasons": decision.reasons}, "promotion.json")
    return {
        "model_name": cfg.model_name,
        "registered_version": int(version),
        "promoted": decision.promote,
        "reasons": decision.reasons,
        "champion_before": champion_version,
        "champion_before_metrics": champion,
    }
