"""Trust at the registry: only versions whose signed manifest checks out are served or compared, the gate
compares a challenger only with a champion of the same task, and the service never creates a store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import mlflow
import onnx
import pytest
from fastapi.testclient import TestClient
from mlflow import MlflowClient

from contract.registry import CHAMPION, audit_trail
from flows.config import ServingBudget
from flows.registry import register_and_gate
from models.predictors import SensorPredictor
from models.serving_cost import THREADS, serving_cost
from serving.app import create_app
from serving.settings import ServingSettings
from serving.served_models import ServedModels
from tests.integration.test_serving_registry import (MOLECULE_GATE, MOLECULE_NAME, SENSOR_GATE, SENSOR_NAME,
                                                     build_registry, tiny_models)

pytestmark = pytest.mark.integration

PROJECT = Path(__file__).resolve().parents[2]
NAMES = {"sensor": SENSOR_NAME, "molecule": MOLECULE_NAME}


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """A registry of its own: these tests tamper with versions and move aliases."""
    return build_registry(tmp_path_factory.mktemp("trust") / "registry", tiny_models(tmp_path_factory.getbasetemp() / "models"))


def version_folder(uri: str, name: str, version: str) -> Path:
    return Path(urlparse(MlflowClient(uri).get_model_version_download_uri(name, version)).path)


def reload(registry, alias_version: str) -> dict:
    """Point the sensor champion at `alias_version` and let a fresh service load it."""
    MlflowClient(registry.uri).set_registered_model_alias(SENSOR_NAME, CHAMPION, alias_version)
    store = ServedModels(registry.uri, NAMES, CHAMPION, registry.verify_key, prefer_cuda=False)
    store.refresh()
    return {"problems": store.problems, "served": {f: m.version for f, m in store.models.items()}}


def test_a_card_edited_in_the_artifact_store_is_not_served(registry):
    card_file = version_folder(registry.uri, SENSOR_NAME, "3") / "card.json"
    card = json.loads(card_file.read_text())
    card["threshold"] = 0.999999  # would switch the alert off
    card_file.write_text(json.dumps(card))
    outcome = reload(registry, "3")
    assert "sensor" not in outcome["served"]
    assert outcome["problems"]["sensor"].startswith(f"refused to serve {SENSOR_NAME} version 3: card.json has sha256")


def test_a_replaced_onnx_file_is_not_served_and_the_served_model_stays(registry):
    store = ServedModels(registry.uri, NAMES, CHAMPION, registry.verify_key, prefer_cuda=False)
    MlflowClient(registry.uri).set_registered_model_alias(SENSOR_NAME, CHAMPION, "2")
    store.refresh()
    assert store.models["sensor"].version == "2"
    onnx_file = version_folder(registry.uri, SENSOR_NAME, "1") / "model.onnx"
    onnx_file.write_bytes(onnx_file.read_bytes() + b"\0")
    MlflowClient(registry.uri).set_registered_model_alias(SENSOR_NAME, CHAMPION, "1")
    changes = store.refresh()
    assert "model.onnx has sha256" in changes["sensor"]
    assert store.models["sensor"].version == "2"  # the previous model keeps answering
    MlflowClient(registry.uri).set_registered_model_alias(SENSOR_NAME, CHAMPION, "2")


def test_an_unsigned_version_is_not_served(registry, tmp_path):
    mlflow.set_tracking_uri(registry.uri)
    models = tiny_models(tmp_path.parent / "models")
    with mlflow.start_run():
        info = mlflow.onnx.log_model(onnx.load(str(models.good_sensor)), name="model", registered_model_name=SENSOR_NAME)
    outcome = reload(registry, str(info.registered_model_version))
    assert "has no signed manifest" in outcome["problems"]["sensor"]
    MlflowClient(registry.uri).set_registered_model_alias(SENSOR_NAME, CHAMPION, "2")


def test_a_version_signed_by_another_key_is_not_served(registry, tmp_path):
    store = ServedModels(registry.uri, NAMES, CHAMPION, registry.verify_key, prefer_cuda=False)
    from contract.manifest import load_signing_key, public_key_path
    other = tmp_path / "other.key"
    load_signing_key(other)
    stranger = ServedModels(registry.uri, NAMES, CHAMPION, public_key_path(other), prefer_cuda=False)
    store.refresh(), stranger.refresh()
    assert store.ready and not stranger.models
    assert "signature is not valid for the trusted key" in stranger.problems["molecule"]


def run_service(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "serving"], cwd=PROJECT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SERVING_PORT": "1", **env})


def test_a_missing_store_is_one_line_and_is_not_created(tmp_path, registry):
    missing = tmp_path / "mlflow" / "mlflow.db"
    done = run_service({"MLFLOW_TRACKING_URI": f"sqlite:///{missing}", "SERVING_VERIFY_KEY": str(registry.verify_key)})
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [f"error: the MLflow store {missing} does not exist: run the pipeline "
                                                f"first (make run), or point MLFLOW_TRACKING_URI at the store"]
    assert not missing.exists() and not missing.parent.exists()


def test_a_corrupt_store_is_one_line(tmp_path, registry):
    corrupt = tmp_path / "mlflow.db"
    corrupt.write_bytes(b"this is not a database" * 100)
    done = run_service({"MLFLOW_TRACKING_URI": f"sqlite:///{corrupt}", "SERVING_VERIFY_KEY": str(registry.verify_key)})
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: the MLflow store {corrupt} cannot be read: "), done.stderr


def test_a_store_that_disappears_makes_the_service_not_ready(tmp_path, registry):
    copy = tmp_path / "mlflow.db"
    copy.write_bytes(Path(urlparse(registry.uri).path).read_bytes())
    store = ServedModels(f"sqlite:///{copy}", NAMES, CHAMPION, registry.verify_key, prefer_cuda=False)
    settings = ServingSettings(poll_seconds=3600, prefer_cuda=False)
    with TestClient(create_app(settings, store=store)) as client:
        store.refresh()
        assert client.get("/ready").status_code == 200
        copy.unlink()
        store.refresh()  # what the service's poll does
        ready = client.get("/ready")
        assert ready.status_code == 503 and "has disappeared" in ready.json()["problems"]["store"]
        assert not copy.exists()
        window = [[0.1, 0.2, 0.3]] * 16
        assert client.post("/v1/sensor/predict", json={"windows": [window]}).status_code == 200


def test_the_gate_compares_only_the_same_task(tmp_path):
    models = tiny_models(tmp_path.parent / "models")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = mlflow.create_experiment("tasks", artifact_location=(tmp_path / "artifacts").as_uri())
    key = tmp_path / "signing.key"
    solubility = {**models.molecule_card, "test_metrics": {"rmse": 7.98, "mae": 6.0}, "calibration_error": 0.0}
    logd = {**solubility, "target": "logD", "test_metrics": {"rmse": 1.83, "mae": 1.2}}

    def register(card, new_task=False, metrics=lambda *_: {"rmse": 7.98}):
        with mlflow.start_run(experiment_id=experiment):
            return register_and_gate(MOLECULE_GATE, card, models.molecule, None, metrics, key, new_task)

    assert register(solubility)["promoted"]
    refused = register(logd)
    assert not refused["promoted"] and refused["champion_before_metrics"] is None
    assert refused["reasons"] == [
        "champion v1 predicts molecule regression of 'solubility'; this version predicts molecule regression of 'logD': "
        "not comparable. Register it under another name (molecule.registry.model_name in params.yaml), or replace "
        "the champion's task with `python -m flows.stages.register molecule --new-task`"]
    replaced = register(logd, new_task=True)
    assert replaced["promoted"] and "new task (--new-task)" in replaced["reasons"][0]
    trail = audit_trail(MlflowClient(), MOLECULE_NAME)
    assert [(m["alias"], m["to"]) for m in trail if m["alias"] == CHAMPION] == [(CHAMPION, "1"), (CHAMPION, "3")]


def test_a_sensor_model_of_other_channels_is_refused_not_a_crash(tmp_path):
    models = tiny_models(tmp_path.parent / "models")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = mlflow.create_experiment("channels", artifact_location=(tmp_path / "artifacts").as_uri())
    card = {**models.sensor_card, "test_metrics": {"pr_auc": 0.5}, "calibration_error": 0.0}
    one_channel = {**card, "channels": ["vibration"]}

    def crash(*_):
        raise AssertionError("a champion of other channels must not be evaluated")

    outcomes = []
    for each in (card, one_channel):
        with mlflow.start_run(experiment_id=experiment):
            outcomes.append(register_and_gate(SENSOR_GATE, each, models.good_sensor, None, crash, tmp_path / "k.key"))
    assert not outcomes[1]["promoted"]
    assert "from 1 channels (vibration)" in outcomes[1]["reasons"][0] and "not comparable" in outcomes[1]["reasons"][0]


def test_a_version_over_its_serving_budget_is_registered_but_not_promoted(tmp_path):
    """The serving cost of the tiny sensor model itself, measured as the register stage does, against a budget it
    exceeds."""
    models = tiny_models(tmp_path.parent / "models")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = mlflow.create_experiment("budget", artifact_location=(tmp_path / "artifacts").as_uri())
    predictor = SensorPredictor(models.good_sensor, models.sensor_card, prefer_cuda=False, threads=THREADS)
    card = {**models.sensor_card, "test_metrics": {"pr_auc": 0.9}, "calibration_error": 0.0,
            "serving_cost": serving_cost(predictor, models.test_windows, models.good_sensor)}
    spent = card["serving_cost"]["total_ms_per_item"]["batch_1"]
    budget = SENSOR_GATE.model_copy(update={"serving_budget_ms": ServingBudget(batch_1=spent / 2)})
    with mlflow.start_run(experiment_id=experiment):
        outcome = register_and_gate(budget, card, models.good_sensor, None, lambda *_: {}, tmp_path / "k.key")
    assert not outcome["promoted"] and outcome["registered_version"] == 1
    assert outcome["reasons"] == [f"serving cost {spent:.2f} ms per item at batch 1 exceeds "
                                  f"registry.serving_budget_ms.batch_1 = {spent / 2:g} (measured on "
                                  f"{card['serving_cost']['machine']})"]
    assert MlflowClient().get_registered_model(SENSOR_NAME).aliases == {"challenger": 1}  # no champion
