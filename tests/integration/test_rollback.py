"""`python -m flows.rollback` against a real registry, seen by a running service (reload and polling), with
the alias moves in the registry's audit trail."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from mlflow import MlflowClient

from contract.audit import audit_log_path, read_moves
from contract.registry import CHAMPION, audit_trail
from serving.app import create_app
from serving.settings import ServingSettings
from tests.integration.test_serving_registry import SENSOR_NAME, build_registry, serve, tiny_models

pytestmark = pytest.mark.integration

PROJECT = Path(__file__).resolve().parents[2]
ADMIN_KEY = "rollback-admin-key"


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """A registry of its own: these tests move the champion alias."""
    root = tmp_path_factory.mktemp("rollback")
    return build_registry(root / "registry", tiny_models(tmp_path_factory.getbasetemp() / "models"))


@pytest.fixture(scope="module")
def service(registry):
    """The app as `python -m serving` builds it (params.yaml, MLFLOW_TRACKING_URI), polling every second, with
    the admin routes enabled."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", registry.uri)
        settings = ServingSettings(params_file=str(PROJECT / "params.yaml"), verify_key=str(registry.verify_key),
                                   poll_seconds=1.0, prefer_cuda=False, admin_key=ADMIN_KEY)
        with serve(create_app(settings)) as url:
            yield url


def rollback(registry, family: str = "sensor") -> subprocess.CompletedProcess:
    """`python -m flows.rollback` with the project's params, but the registry's store and signing key."""
    params = yaml.safe_load((PROJECT / "params.yaml").read_text())
    params["tracking"]["signing_key"] = str(registry.signing_key)
    params_file = registry.signing_key.parent / "params.yaml"
    params_file.write_text(yaml.safe_dump(params))
    env = {**os.environ, "MLFLOW_TRACKING_URI": registry.uri}
    return subprocess.run([sys.executable, "-m", "flows.rollback", family, "--params", str(params_file)],
                          cwd=PROJECT, env=env, capture_output=True, text=True, timeout=120)


def served_version(url: str) -> str:
    return {m["family"]: m for m in httpx.get(f"{url}/v1/models").json()["models"]}["sensor"]["version"]


def predict_version(url: str) -> str:
    window = [[0.1, 0.2, 0.3]] * 16
    answer = httpx.post(f"{url}/v1/sensor/predict", json={"windows": [window]})
    assert answer.status_code == 200, answer.text
    return answer.json()["model"]["version"]


def test_rollback_moves_champion_and_the_service_answers_with_it_after_reload(registry, service):
    assert served_version(service) == predict_version(service) == "2"
    done = rollback(registry)
    assert done.returncode == 0, done.stderr
    assert f"{SENSOR_NAME}: 'champion' moved from version 2 back to version 1" in done.stdout
    client = MlflowClient(registry.uri)
    assert str(client.get_model_version_by_alias(SENSOR_NAME, CHAMPION).version) == "1"
    assert client.get_model_version(SENSOR_NAME, "2").tags["promotion"] == "rolled_back"
    last = audit_trail(client, SENSOR_NAME)[-1]
    assert (last["alias"], last["from"], last["to"]) == ("champion", "2", "1")
    assert "make rollback" in last["by"] and last["why"] == "rollback from version 2"
    logged = read_moves(audit_log_path(registry.uri))[-1]  # the alias audit log beside the store, chain intact
    assert (logged["model"], logged["alias"], logged["from"], logged["to"], logged["by"], logged["why"]) == (
        SENSOR_NAME, "champion", "2", "1", last["by"], last["why"]) and logged["sha256"] == last["sha256"]
    reloaded = httpx.post(f"{service}/v1/admin/reload", json={},
                          headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json()
    assert {m["family"]: m["version"] for m in reloaded["models"]}["sensor"] == "1"
    assert served_version(service) == predict_version(service) == "1"


def test_nothing_to_roll_back_to_is_a_clear_error(registry):
    done = rollback(registry)  # version 1 was the first champion
    assert done.returncode == 2
    assert "records no previous champion" in done.stderr


def test_the_service_follows_the_alias_by_polling(registry, service):
    MlflowClient(registry.uri).set_registered_model_alias(SENSOR_NAME, CHAMPION, "2")
    deadline = time.monotonic() + 20
    while served_version(service) != "2":
        assert time.monotonic() < deadline, "the service did not pick up the new champion by polling"
        time.sleep(0.2)
    assert predict_version(service) == "2"
