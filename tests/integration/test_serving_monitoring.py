"""The service's own monitoring over the real app and registry (versions carrying their training reference):
drifted sensor windows raise the PSI of the shifted channel only, each molecule answer carries its applicability
domain (stored with the prediction too), feedback outcomes show up in the outcome figures, the figures reach
/metrics, GET /v1/monitoring needs the API key, and a version without a reference says so."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable

import numpy as np
import pytest
from fastapi.testclient import TestClient

from contract.prediction_store import connect, read_predictions
from serving.app import create_app
from serving.settings import ServingSettings
from serving.served_models import ServedModels
from tests.integration.test_serving import LIMITS, registry, store, wait_ready, window_json  # noqa: F401
from tests.integration.test_serving_registry import (
    CHANNELS, MOLECULE_NAME, SENSOR_NAME, TRAINING_SMILES, build_registry, sensor_windows, tiny_models,
)

pytestmark = pytest.mark.integration

MONITORING = dict(LIMITS, max_items=64, monitor_seconds=0.1, monitor_min_items=100)
FOREIGN = "FC(F)(F)C(F)(F)F"  # shares no substructure with TRAINING_SMILES


@pytest.fixture(scope="session")
def prefect_api():
    """No flow runs here: no Prefect server (overrides the integration conftest's)."""


def monitored_app(model_store: ServedModels, tmp_path, **settings) -> TestClient:
    url = f"sqlite:///{tmp_path / 'predictions.db'}"
    return TestClient(create_app(ServingSettings(**MONITORING, prediction_store=url, **settings), store=model_store))


def monitoring_when(client: TestClient, ready: Callable[[dict], bool], timeout: float = 30.0) -> dict:
    """GET /v1/monitoring until `ready(answer)` (the figures are recomputed in the background)."""
    deadline = time.monotonic() + timeout
    while True:
        answer = client.get("/v1/monitoring")
        assert answer.status_code == 200, answer.text
        body = answer.json()
        if ready(body):
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.1)


def send_windows(client: TestClient, windows: np.ndarray) -> list[dict]:
    answers = []
    for start in range(0, len(windows), 50):
        body = {"windows": [window_json(w) for w in windows[start:start + 50]]}
        answer = client.post("/v1/sensor/predict", json=body)
        assert answer.status_code == 200, answer.text
        answers += answer.json()["predictions"]
    return answers


def computed_after(moment: datetime.datetime, family: str, figure: str) -> Callable[[dict], bool]:
    def ready(body: dict) -> bool:
        report = body["families"].get(family, {}).get(figure)
        return report is not None and datetime.datetime.fromisoformat(report["computed_at"]) > moment
    return ready


def test_drifted_windows_raise_the_psi_of_the_shifted_channel_only(store, tmp_path):
    """The window holds the last 200 windows: the shifted ones replace the steady ones."""
    with monitored_app(store, tmp_path, monitor_drift_window=200) as client:
        wait_ready(client)
        send_windows(client, sensor_windows(200, seed=5))
        steady = monitoring_when(client, lambda b: b["families"].get("sensor", {}).get("input_drift", {}).get("windows") == 200)
        sensor = steady["families"]["sensor"]
        assert sensor["model"] == {"name": SENSOR_NAME, "version": "2", "alias": "champion"} and sensor["reference"]
        drift = {row["channel"]: row for row in sensor["input_drift"]["channels"]}
        assert list(drift) == CHANNELS and all(row["psi"] < 0.25 and not row["alarm"] for row in drift.values())

        send_windows(client, sensor_windows(200, seed=6, shift=np.array([0.0, 2.0, 0.0])))
        sent = datetime.datetime.now(datetime.timezone.utc)
        body = monitoring_when(client, computed_after(sent, "sensor", "input_drift"))
        report = body["families"]["sensor"]["input_drift"]
        assert report["windows"] == 200
        after = {row["channel"]: row for row in report["channels"]}
        assert after["temperature"]["psi"] > 1 and after["temperature"]["ks"] > 0.3 and after["temperature"]["alarm"]
        assert report["alarm"] and report["max_psi"] == 0.25
        for channel in ("vibration", "pressure"):
            assert after[channel]["psi"] < 0.25 and not after[channel]["alarm"]
        metrics = client.get("/metrics").text
        psi = float(next(line.split()[-1] for line in metrics.splitlines()
                         if line.startswith('serving_input_psi{channel="temperature",family="sensor"}')))
        assert psi > 1
        assert 'serving_monitor_alarm{check="input_drift",family="sensor"} 1.0' in metrics


def test_each_molecule_answer_carries_its_applicability_domain(store, tmp_path):
    with monitored_app(store, tmp_path) as client:
        wait_ready(client)
        answer = client.post("/v1/molecule/predict", json={"smiles": [TRAINING_SMILES[0], FOREIGN, "C1CC"]})
        assert answer.status_code == 200, answer.text
        training, foreign, broken = answer.json()["predictions"]
        assert training["nearest_similarity"] == 1.0 and training["in_domain"] is True
        assert training["descriptors_out_of_range"] == 0.0
        assert foreign["nearest_similarity"] < 0.3 and foreign["in_domain"] is False
        assert foreign["descriptors_out_of_range"] > 0
        assert "in_domain" not in broken and broken["error"]
        body = monitoring_when(client, lambda b: b["families"].get("molecule", {}).get("domain", {}).get("molecules") == 2)
        domain = body["families"]["molecule"]["domain"]
        assert domain["out_of_domain"] == 0.5 and domain["min_similarity"] == 0.3 and not domain["alarm"]
        assert 'serving_out_of_domain_share{family="molecule"} 0.5' in client.get("/metrics").text
        assert client.app.state.service.log.writer.flush(timeout_s=30)
        rows = {row["id"]: row for row in read_predictions(connect(f"sqlite:///{tmp_path / 'predictions.db'}"))}
        stored = rows[foreign["prediction_id"]]
        assert stored["input_summary"]["in_domain"] is False
        assert stored["input_summary"]["nearest_similarity"] == foreign["nearest_similarity"]
        assert "in_domain" not in stored["output"] and stored["output"]["value"] == foreign["value"]


def test_feedback_outcomes_show_up_in_the_outcome_figures(store, tmp_path):
    with monitored_app(store, tmp_path) as client:
        wait_ready(client)
        molecules = client.post("/v1/molecule/predict", json={"smiles": TRAINING_SMILES[:4]}).json()["predictions"]
        items = [{"prediction_id": m["prediction_id"], "observed": m["value"] + (1 if i % 2 else -1)}
                 for i, m in enumerate(molecules)]
        windows = send_windows(client, sensor_windows(8, seed=7))
        labels = [1.0, 0.0] * 4
        items += [{"prediction_id": w["prediction_id"], "observed": y} for w, y in zip(windows, labels)]
        assert client.post("/v1/feedback", json={"outcomes": items}).json()["accepted"] == 12
        body = monitoring_when(client, lambda b: all(b["families"].get(f, {}).get("outcomes", {}).get("outcomes") for f in
                                                     ("sensor", "molecule")))
        molecule, sensor = body["families"]["molecule"]["outcomes"], body["families"]["sensor"]["outcomes"]
        assert molecule["outcomes"] == 4 and molecule["metrics"] == {"rmse": pytest.approx(1.0)}
        p = np.array([w["failure_probability"] for w in windows])
        assert sensor["outcomes"] == 8 and sensor["metrics"]["brier"] == pytest.approx(np.mean((p - labels) ** 2))
        assert 0 <= sensor["metrics"]["ece"] <= 1 and 0 < sensor["metrics"]["pr_auc"] <= 1
        assert not sensor["alarm"]  # 8 outcomes, fewer than monitor_min_items
        metrics = client.get("/metrics").text
        assert 'serving_monitor_items{family="sensor",kind="outcomes"} 8.0' in metrics
        assert 'serving_outcome_metric{family="molecule",metric="rmse"} 1.0' in metrics


def test_the_monitoring_route_needs_the_api_key(store, tmp_path):
    with monitored_app(store, tmp_path, api_key="s3cret") as client:
        wait_ready(client)
        assert client.get("/v1/monitoring").status_code == 401
        answer = client.get("/v1/monitoring", headers={"Authorization": "Bearer s3cret"})
        assert answer.status_code == 200 and answer.json()["every_s"] == 0.1


def test_a_version_without_reference_answers_without_the_domain_and_says_so(tmp_path_factory, tmp_path):
    models = tiny_models(tmp_path_factory.getbasetemp() / "models")
    bare = build_registry(tmp_path / "registry", models, references=False)
    bare_store = ServedModels(bare.uri, {"sensor": SENSOR_NAME, "molecule": MOLECULE_NAME}, "champion",
                            bare.verify_key, prefer_cuda=False)
    with monitored_app(bare_store, tmp_path) as client:
        wait_ready(client)
        answer = client.post("/v1/molecule/predict", json={"smiles": [TRAINING_SMILES[0]]}).json()["predictions"][0]
        assert "value" in answer and not {"nearest_similarity", "in_domain", "descriptors_out_of_range"} & set(answer)
        send_windows(client, sensor_windows(4, seed=8))
        body = monitoring_when(client, lambda b: set(b["families"]) == {"sensor", "molecule"})
        for family, figure in (("sensor", "input_drift"), ("molecule", "domain")):
            report = body["families"][family]
            assert report["reference"] is False and figure not in report
            assert any("no training reference" in note for note in report["notes"]), report["notes"]
