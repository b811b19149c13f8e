"""The MLflow model registry: signed ONNX versions, the promotion gate, `challenger`/`champion` aliases.

Each version is a folder logged with its run: `model.onnx`, `card.json` (the model card), `reference.npz` (the
training reference the monitor compares with, contract/reference.py), MLflow's `MLmodel` and environment files, and
a manifest of their sha256 signed with the pipeline's key (contract/manifest.py).
The gate compares a challenger only with a champion of the same task identity (contract/card.py)."""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import mlflow
import numpy as np
import onnx
from mlflow import MlflowClient
from mlflow.models import ModelSignature

from contract.card import CardError, describe_identity, task_identity, write_card
from contract.manifest import MANIFEST, ManifestError, key_id, load_signing_key, sha256_file, sign_directory
from contract.registry import CHALLENGER, CHAMPION, actor, alias_version, download_verified, move_alias
from flows.config import RegistryConfig
from models.predictors import IncompatibleModelError


@dataclass
class Decision:
    """Whether a challenger becomes champion, and why."""

    promote: bool
    reasons: list[str] = field(default_factory=list)


def _at_least_as_good(cfg: RegistryConfig, value: float, other: float) -> bool:
    return value >= other - cfg.tolerance if cfg.direction == "max" else value <= other + cfg.tolerance


def decide(
    cfg: RegistryConfig, challenger: dict[str, float], champion: dict[str, float] | None, calibration_error: float,
    compare_calibration: bool = False, baseline: dict[str, float] | None = None, test_positives: int | None = None,
    serving_cost: dict | None = None,
) -> Decision:
    """The promotion gate: calibration within bounds and primary metric at least as good as the
    champion's on the same test split (within `cfg.tolerance`). `compare_calibration` (a recalibration): the
    calibration error must also be lower than the champion's `calibration_error` on the same data.

    baseline: the test metrics of the same run's baseline; with `cfg.must_beat_baseline` the primary metric must be
    at least as good as its. test_positives (classification): fewer than `cfg.min_positives` and nothing is judged.
    serving_cost (the card's): over `cfg.serving_budget_ms` and nothing else is judged."""
    metric = cfg.metric
    value = challenger.get(metric, float("nan"))
    reasons: list[str] = []
    promote = True
    if (over_budget := cfg.serving_budget_ms.exceeded(serving_cost)) is not None:
        return Decision(False, [over_budget])
    if not math.isfinite(value):
        return Decision(False, [f"challenger {metric} is {value}"])
    if test_positives is not None and test_positives < cfg.min_positives:
        return Decision(False, [f"the test split holds {test_positives} positives, fewer than min_positives = "
                                f"{cfg.min_positives}: too few to judge the model"])
    if not calibration_error <= cfg.max_calibration_error:
        promote = False
        reasons.append(f"calibration error {calibration_error:.4f} exceeds {cfg.max_calibration_error}")
    if cfg.must_beat_baseline and baseline is not None and metric in baseline:
        ok = _at_least_as_good(cfg, value, baseline[metric])
        reasons.append(f"{metric} {value:.4f} is {'at least as good as' if ok else 'worse than'} the baseline's "
                       f"{baseline[metric]:.4f}")
        promote = promote and ok
    if champion is None:
        reasons.append("no champion to compare with")
    else:
        best = champion[metric]
        ok = _at_least_as_good(cfg, value, best)
        relation = "at least as good as" if ok else "worse than"
        reasons.append(f"{metric} {value:.4f} is {relation} champion's {best:.4f} (tolerance {cfg.tolerance})")
        promote = promote and ok
        if compare_calibration:
            better = calibration_error < champion["calibration_error"]
            reasons.append(f"calibration error {calibration_error:.4f} is {'lower' if better else 'not lower'} than "
                           f"champion's {champion['calibration_error']:.4f}")
            promote = promote and better
    return Decision(promote, reasons)


def model_requirements() -> list[str]:
    """What loads a registered folder as an MLflow model: the ONNX flavour's packages and NumPy, as installed."""
    return [*mlflow.onnx.get_default_pip_requirements(), f"numpy=={np.__version__}"]


def register_version(cfg: RegistryConfig, onnx_path: Path, card: dict, signature: ModelSignature,
                     tags: dict[str, str], signing_key: Path, extra_files: dict[str, Path] | None = None) -> str:
    """Inside an active MLflow run: log the ONNX file, its model card, `extra_files` ({name in the folder: file},
    e.g. the training reference) and their signed manifest as the run's `model` folder and register it as a new
    version of `cfg.model_name`."""
    key = load_signing_key(signing_key)
    with tempfile.TemporaryDirectory(prefix="register-") as scratch:
        folder = Path(scratch) / "model"
        # the requirements named, not inferred: inferring loads the model in a subprocess (about 1.5 s of CPU)
        mlflow.onnx.save_model(onnx.load(str(onnx_path)), str(folder), signature=signature, save_as_external_data=False,
                               pip_requirements=model_requirements())
        write_card(folder, card)
        for name, source in (extra_files or {}).items():
            if (folder / name).exists():
                raise ValueError(f"extra file {name} would replace a file of the model folder")
            shutil.copyfile(source, folder / name)
        manifest = sign_directory(folder, key)
        mlflow.log_artifacts(str(folder), artifact_path="model")
        manifest_sha256 = sha256_file(folder / MANIFEST)
    run_id = mlflow.active_run().info.run_id
    version = str(mlflow.register_model(f"runs:/{run_id}/model", cfg.model_name).version)
    client = MlflowClient()
    signed = {"onnx_sha256": manifest["files"]["model.onnx"], "manifest_sha256": manifest_sha256,
              "signed_by": key_id(key.public_key())}
    for name, value in {**tags, **signed}.items():
        client.set_model_version_tag(cfg.model_name, version, name, str(value))
    return version


def apply_decision(cfg: RegistryConfig, version: str, decision: Decision, by: str) -> None:
    """New versions get `challenger`; a passed gate moves `champion` (the previous one is remembered)."""
    client = MlflowClient()
    move_alias(client, cfg.model_name, CHALLENGER, version, by, "registered")
    client.set_model_version_tag(cfg.model_name, version, "promotion", "promoted" if decision.promote else "refused")
    client.set_model_version_tag(cfg.model_name, version, "promotion_reasons", "; ".join(decision.reasons))
    if decision.promote:
        previous = move_alias(client, cfg.model_name, CHAMPION, version, by, "; ".join(decision.reasons))
        if previous is not None:
            client.set_model_version_tag(cfg.model_name, version, "previous_champion", previous)


def _compare_with_champion(client: MlflowClient, cfg: RegistryConfig, card: dict, champion_version: str,
                           champion_metrics: Callable[[Path, dict], dict[str, float]], key, new_task: bool,
                           ) -> tuple[dict[str, float] | None, list[str], str | None]:
    """The champion's test metrics where it verifies and predicts the same task (else None), notes for the
    decision's reasons, and the refusal where it predicts another task and not `new_task`."""
    with tempfile.TemporaryDirectory(prefix="champion-") as scratch:
        try:
            verified = download_verified(client, cfg.model_name, champion_version, Path(scratch), key.public_key())
        except (ManifestError, CardError) as error:
            return None, [f"champion v{champion_version} cannot be verified ({error}): no comparison"], None
        ours, theirs = task_identity(card), task_identity(verified.card)
        if ours != theirs and new_task:
            note = f"new task (--new-task): champion v{champion_version} predicted {describe_identity(theirs)}"
            return None, [note], None
        if ours != theirs:
            family = card["family"]
            return None, [], (f"champion v{champion_version} predicts {describe_identity(theirs)}; this version predicts "
                              f"{describe_identity(ours)}: not comparable. Register it under another name "
                              f"({family}.registry.model_name in params.yaml), or replace the champion's task with "
                              f"`python -m flows.stages.register {family} --new-task`")
        try:
            return champion_metrics(verified.onnx, verified.card), [], None
        except IncompatibleModelError as error:
            return None, [f"champion v{champion_version} cannot run on this code ({error}): no comparison"], None


def register_and_gate(
    cfg: RegistryConfig,
    card: dict,
    onnx_path: Path,
    signature: ModelSignature,
    champion_metrics: Callable[[Path, dict], dict[str, float]],
    signing_key: Path,
    new_task: bool = False,
    extra_files: dict[str, Path] | None = None,
    compare_calibration: bool = False,
    baseline: dict[str, float] | None = None,
    test_positives: int | None = None,
) -> dict:
    """Inside an active MLflow run: register a new signed version (with `extra_files` in its folder), verify the
    current champion and, when it predicts the same task, evaluate it on the same test split with
    `champion_metrics(onnx_path, card)`; apply the gate (`compare_calibration`, `baseline`, `test_positives`: see
    `decide`).

    A champion of another task is never compared: the new version is refused, unless `new_task` (then it is judged
    on calibration alone and replaces the champion's task)."""
    client = MlflowClient()
    champion_version = alias_version(client, cfg.model_name, CHAMPION)
    champion, notes, refusal = (None, [], None) if champion_version is None else _compare_with_champion(
        client, cfg, card, champion_version, champion_metrics, load_signing_key(signing_key), new_task)
    tags = {f"metric.{k}": f"{v:.6g}" for k, v in card["test_metrics"].items()}
    run_tags = client.get_run(mlflow.active_run().info.run_id).data.tags  # active_run() holds the tags at its start
    tags.update({k: v for k, v in run_tags.items() if k.startswith(("data.", "git_commit"))})
    tags["featurizer_version"] = str(card.get("featurizer_version", "n/a"))
    version = register_version(cfg, onnx_path, card, signature, tags, signing_key, extra_files)
    if refusal is not None:
        decision = Decision(False, [refusal])
    else:
        decision = decide(cfg, card["test_metrics"], champion, card["calibration_error"], compare_calibration,
                          baseline, test_positives, card.get("serving_cost"))
        decision.reasons[:0] = notes
    apply_decision(cfg, version, decision, actor(f"flows.stages.register {card['family']}"))
    mlflow.log_dict({"promoted": decision.promote, "reasons": decision.reasons}, "promotion.json")
    return {
        "model_name": cfg.model_name,
        "registered_version": int(version),
        "promoted": decision.promote,
        "reasons": decision.reasons,
        "champion_before": champion_version,
        "champion_before_metrics": champion,
    }
