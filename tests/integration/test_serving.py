"""The service against a real registry: readiness, model info, predictions, bad input, auth, metrics, docs."""

from __future__ import annotations

import concurrent.futures
import gc
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
from fastapi.testclient import TestClient
from mlflow import MlflowClient

from contract.manifest import sha256_file
from models.predictors import SensorPredictor
from serving.app import create_app
from serving.settings import ServingSettings
from serving.served_models import ServedModels
from tests.integration.test_serving_registry import (
    CHANNELS, MOLECULE_NAME, SENSOR_NAME, WINDOW, free_port, serve, shared_registry, tiny_models,
)

pytestmark = pytest.mark.integration

LIMITS = dict(max_items=8, max_smiles_length=40, max_body_bytes=64 * 1024, max_heavy_atoms=12, poll_seconds=3600,
              prefer_cuda=False, featurize_workers=1)


def wait_ready(client: TestClient, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while client.get("/ready").status_code != 200:
        assert time.monotonic() < deadline, client.get("/ready").json()
        time.sleep(0.05)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_models(tmp_path_factory.getbasetemp() / "models")


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    return shared_registry(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def store(registry) -> ServedModels:
    return ServedModels(registry.uri, {"sensor": SENSOR_NAME, "molecule": MOLECULE_NAME}, "champion", registry.verify_key,
                      prefer_cuda=False)


@pytest.fixture(scope="module")
def client(store):
    with TestClient(create_app(ServingSettings(**LIMITS), store=store)) as client:
        wait_ready(client)
        yield client


def window_json(window: np.ndarray) -> list:
    """(C, T) with NaN -> the API's T lists of C values with null."""
    return [[None if np.isnan(v) else float(v) for v in step] for step in window.T]


def test_health_ready_and_model_info(client, registry, models):
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").json()["models"] == {"sensor": "2", "molecule": "1"}
    info = {m["family"]: m for m in client.get("/v1/models").json()["models"]}
    sensor = info["sensor"]
    assert (sensor["name"], sensor["version"], sensor["alias"]) == (SENSOR_NAME, "2", "champion")
    assert sensor["provider"] == "CPUExecutionProvider"
    assert sensor["sha256"] == sha256_file(models.good_sensor)
    assert sensor["sha256"] == MlflowClient(registry.uri).get_model_version(SENSOR_NAME, "2").tags["onnx_sha256"]
    assert sensor["metrics"]["pr_auc"] == pytest.approx(1.0)
    assert (sensor["channels"], sensor["window"]) == (CHANNELS, WINDOW)
    assert (info["molecule"]["version"], info["molecule"]["task"]) == ("1", "regression")


def test_sensor_predictions_are_the_champions(client, models):
    windows = models.test_windows[:5].copy()
    windows[0, 1, 3:7] = np.nan  # missing readings travel as null
    answer = client.post("/v1/sensor/predict", json={"windows": [window_json(w) for w in windows]})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["model"] == {"name": SENSOR_NAME, "version": "2", "alias": "champion"}
    expected = SensorPredictor(models.good_sensor, models.sensor_card, prefer_cuda=False).predict(windows)
    got = body["predictions"]
    assert np.allclose([p["failure_probability"] for p in got], expected["probability"], atol=1e-6)
    assert np.allclose([p["uncertainty"] for p in got], expected["uncertainty"], atol=1e-6)
    assert [p["alert"] for p in got] == list(expected["alert"])


def test_a_molecule_over_the_size_limit_is_answered_from_its_smiles_and_says_so(client):
    """Over SERVING_MAX_HEAVY_ATOMS (12) no graph is built; the SMILES view alone answers, without a domain (no
    fingerprint was made). The tiny tokenizer takes 30 SMILES tokens: a longer chain has neither view."""
    answer = client.post("/v1/molecule/predict", json={"smiles": ["CCO", "C" * 20, "c1ccccc1", "C" * 35]})
    assert answer.status_code == 200, answer.text
    ethanol, large, benzene, neither = answer.json()["predictions"]
    assert large["modality"] == "smiles_only" and large["canonical_smiles"] == "C" * 20
    assert math.isfinite(large["value"]) and "error" not in large and "nearest_similarity" not in large
    assert (ethanol["modality"], benzene["modality"]) == ("fused", "fused") and "nearest_similarity" in ethanol
    assert neither["error"] == (f"SMILES {'C' * 35!r} has 35 heavy atoms; at most 12; its SMILES view is longer "
                                "than the model's tokenizer takes") and "value" not in neither
    assert ethanol["value"] != benzene["value"]


def test_a_molecule_rdkit_cannot_sanitise_is_answered_from_its_smiles(client):
    answer = client.post("/v1/molecule/predict", json={"smiles": ["C(C)(C)(C)(C)C"]})
    assert answer.status_code == 200, answer.text
    (hypervalent,) = answer.json()["predictions"]
    assert hypervalent["modality"] == "smiles_only" and math.isfinite(hypervalent["value"])
    assert "error" not in hypervalent and "nearest_similarity" not in hypervalent


def test_molecule_predictions_with_a_per_item_error(client):
    answer = client.post("/v1/molecule/predict", json={"smiles": ["CCO", "not a molecule", "c1ccccc1"]})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["model"] == {"name": MOLECULE_NAME, "version": "1", "alias": "champion"}
    ethanol, broken, benzene = body["predictions"]
    assert ethanol["smiles"] == "CCO" and "error" not in ethanol
    assert ethanol["uncertainty"] == pytest.approx(0.1 * abs(ethanol["value"]))
    assert benzene["value"] != ethanol["value"]
    assert "value" not in broken and broken["error"]


def test_a_smiles_too_long_for_the_tokenizer_is_answered_from_its_graph_and_says_so(store):
    """The tiny model's tokenizer takes 32 tokens with [CLS] and [SEP]; a chain of 40 carbons has 40 tokens."""
    settings = ServingSettings(**{**LIMITS, "max_smiles_length": 60, "max_heavy_atoms": 60})
    with TestClient(create_app(settings, store=store)) as client:
        wait_ready(client)
        answer = client.post("/v1/molecule/predict", json={"smiles": ["CCO", "C" * 40]})
    assert answer.status_code == 200, answer.text
    ethanol, chain = answer.json()["predictions"]
    assert (ethanol["modality"], chain["modality"]) == ("fused", "graph_only")
    assert math.isfinite(chain["value"]) and "error" not in chain


def _window(steps: int = WINDOW, channels: int = len(CHANNELS), value=0.5) -> list:
    return [[value] * channels for _ in range(steps)]


BAD_INPUT = [
    ("sensor", {"windows": [_window(steps=WINDOW - 1)]}, 422, f"needs exactly {WINDOW}"),
    ("sensor", {"windows": [_window(channels=len(CHANNELS) + 1)]}, 422, f"needs {len(CHANNELS)} channels"),
    ("sensor", '{"windows": [[[NaN, 1, 2]]]}', 422, "finite number"),
    ("sensor", '{"windows": [[[Infinity, 1, 2]]]}', 422, "finite number"),
    ("sensor", '{"windows": [[[1e999, 1, 2]]]}', 422, "finite number"),
    ("sensor", {"windows": [_window(value="high")]}, 422, "valid number"),
    ("sensor", {"windows": [[0.5] * WINDOW]}, 422, "valid array"),
    ("sensor", {"windows": [[*_window()[:-1], [0.5, 3.5e38, 0.5]]]}, 422,
     f"windows[0][{WINDOW - 1}][1] ({CHANNELS[1]}) is 3.5e+38, which does not fit in float32"),
    ("sensor", {"windows": [[*_window()[:-1], [0.5, -1e39, 0.5]]]}, 422, "does not fit in float32"),
    ("sensor", {"windows": [_window(value=True)]}, 422, "body.windows.0.0.0: Input should be a valid number"),
    ("sensor", {"windows": [_window(value="1")]}, 422, "valid number"),
    ("sensor", {"windows": []}, 422, "at least 1 item"),
    ("sensor", {"windows": [_window()] * 9}, 422, "at most 8"),
    ("sensor", {"windows": [_window()], "extra": 1}, 422, "Extra inputs"),
    ("sensor", {"smiles": ["CCO"]}, 422, "windows: Field required"),
    ("molecule", {"smiles": []}, 422, "at least 1 item"),
    ("molecule", {"smiles": ["C"] * 9}, 422, "at most 8"),
    ("molecule", {"smiles": ["C" * 41]}, 422, "at most 40"),
    ("molecule", {"smiles": "CCO"}, 422, "valid array"),
    ("molecule", '{"smiles": ["CCO"', 400, "not valid JSON"),
    ("molecule", "", 422, "body is empty"),
    ("molecule", {"smiles": ["C" * 30] * 3000}, 413, "larger than"),
]


@pytest.mark.parametrize(("family", "body", "status", "message"), BAD_INPUT,
                         ids=[f"{f}-{m}-{i}" for i, (f, _, _, m) in enumerate(BAD_INPUT)])
def test_bad_input_gets_a_4xx_saying_what_is_wrong(client, family, body, status, message):
    content = body if isinstance(body, str) else json.dumps(body)
    answer = client.post(f"/v1/{family}/predict", content=content, headers={"Content-Type": "application/json"})
    assert answer.status_code == status, answer.text
    assert message in answer.json()["detail"]


def test_a_body_that_is_not_json_gets_415(client):
    answer = client.post("/v1/molecule/predict", content="smiles=CCO",
                         headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert answer.status_code == 415 and "application/json" in answer.json()["detail"]


def test_depiction_is_svg_and_bad_smiles_is_a_422(client):
    drawn = client.get("/v1/molecule/depict", params={"smiles": "c1ccccc1O"})
    assert drawn.status_code == 200 and drawn.headers["content-type"].startswith("image/svg+xml")
    assert "<svg" in drawn.text
    assert client.get("/v1/molecule/depict", params={"smiles": "C1CC"}).status_code == 422


def test_api_key_guards_v1_only(store):
    settings = ServingSettings(**LIMITS, api_key="s3cret")
    with TestClient(create_app(settings, store=store)) as guarded:
        wait_ready(guarded)
        assert guarded.get("/health").status_code == 200
        assert guarded.get("/ready").status_code == 200
        assert guarded.get("/metrics").status_code == 200
        refused = guarded.get("/v1/models")
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert guarded.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert guarded.post("/v1/molecule/predict", json={"smiles": ["C"]}).status_code == 401
        assert guarded.post("/v1/admin/reload", json={}, headers={"Authorization": "Bearer s3cret"}).status_code == 403
        ok = {"Authorization": "Bearer s3cret"}
        assert guarded.get("/v1/models", headers=ok).status_code == 200
        assert guarded.post("/v1/molecule/predict", json={"smiles": ["C"]}, headers=ok).status_code == 200


def test_no_api_key_means_open_v1(client):
    assert client.get("/v1/models").status_code == 200


def test_metrics_count_requests_batches_and_version(client):
    client.post("/v1/molecule/predict", json={"smiles": ["CCO", "CCN"]})
    text = client.get("/metrics").text
    assert 'serving_requests_total{method="POST",path="/v1/molecule/predict",status="200"}' in text
    assert 'serving_request_duration_seconds_count{method="POST",path="/v1/molecule/predict"}' in text
    assert 'serving_batch_items_count{family="molecule"}' in text
    assert 'serving_request_items_sum{family="molecule"}' in text
    assert f'serving_model_version{{family="sensor",name="{SENSOR_NAME}"}} 2.0' in text


def test_api_docs_are_served_without_a_cdn(client):
    page = client.get("/docs").text
    assert "cdn" not in page
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
        assert f"/static-offline-docs/{asset}" in page
        assert client.get(f"/static-offline-docs/{asset}").status_code == 200
    assert client.get("/openapi.json").json()["paths"]["/v1/sensor/predict"]


def test_concurrent_requests_each_get_their_own_rows(client, models):
    expected = SensorPredictor(models.good_sensor, models.sensor_card, prefer_cuda=False).predict(models.test_windows)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda i: client.post("/v1/sensor/predict", json={"windows": [
            window_json(w) for w in models.test_windows[i:i + 3]]}), range(12)))
    for i, answer in enumerate(answers):
        got = [p["failure_probability"] for p in answer.json()["predictions"]]
        assert np.allclose(got, expected["probability"][i:i + 3], atol=1e-6)


def large_molecules(count: int) -> list[str]:
    """Distinct unbranched chains of 120 to 120 + count carbons: each takes tens of milliseconds to featurise."""
    return ["C" * (120 + i) for i in range(count)]


def featurize_calls(url: str) -> float:
    metrics = httpx.get(f"{url}/metrics").text
    return float(next(line.split()[-1] for line in metrics.splitlines()
                      if line.startswith('serving_batch_items_count{family="featurize"}')))


def test_a_request_past_its_deadline_gets_504_its_work_is_dropped_and_the_next_is_answered(store):
    """64 large molecules take seconds to featurise one at a time; the deadline is 0.5 s."""
    settings = ServingSettings(**{**LIMITS, "max_items": 64, "max_smiles_length": 200, "max_heavy_atoms": 200,
                                  "featurize_batch_items": 1, "request_timeout_s": 0.5})
    with serve(create_app(settings, store=store)) as url:
        late = httpx.post(f"{url}/v1/molecule/predict", json={"smiles": large_molecules(64)}, timeout=30)
        assert late.status_code == 504 and "SERVING_REQUEST_TIMEOUT_S" in late.json()["detail"]
        after = httpx.post(f"{url}/v1/molecule/predict", json={"smiles": ["CCO"]}, timeout=30)
        assert after.status_code == 200 and "value" in after.json()["predictions"][0]
        assert featurize_calls(url) < 64  # the rest of the late request's molecules were never featurised


def test_a_client_that_disconnects_takes_its_queued_work_with_it(store):
    settings = ServingSettings(**{**LIMITS, "max_items": 64, "max_smiles_length": 200, "max_heavy_atoms": 200,
                                  "featurize_batch_items": 1})
    with serve(create_app(settings, store=store)) as url:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
            httpx.post(f"{url}/v1/molecule/predict", json={"smiles": large_molecules(64)}, timeout=0.5)
        assert httpx.post(f"{url}/v1/molecule/predict", json={"smiles": ["CCO"]}, timeout=30).status_code == 200
        assert featurize_calls(url) < 64


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_service_within_5_s_without_a_traceback(registry, stop):
    """`python -m serving` with a long molecule request in flight: the request is refused (503), the process
    and its featurisation workers end, and nothing in the output is a traceback."""
    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": registry.uri, "SERVING_VERIFY_KEY": str(registry.verify_key),
           "SERVING_PORT": str(port), "SERVING_PREFER_CUDA": "false",
           "SERVING_FEATURIZE_BATCH_ITEMS": "1", "SERVING_WORKERS": "1"}  # one process: its metrics show the work
    service = subprocess.Popen([sys.executable, "-m", "serving"], cwd=Path(__file__).resolve().parents[2], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not _ready(url):
            assert service.poll() is None and time.monotonic() < deadline, "the service did not become ready"
            time.sleep(0.2)
        workers = psutil.Process(service.pid).children(recursive=True)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(httpx.post, f"{url}/v1/molecule/predict", json={"smiles": large_molecules(64)},
                                  timeout=60)
            while featurize_calls(url) < 1:  # the request's molecules are being featurised
                time.sleep(0.05)
            service.send_signal(stop)
            service.wait(timeout=5)
            answer = pending.result()
        _, alive = psutil.wait_procs(workers, timeout=5)
        output = service.stdout.read()
    finally:
        if service.poll() is None:
            service.kill()
    assert answer.status_code == 503 and "shutting down" in answer.json()["detail"]
    assert not alive, f"worker processes left: {alive}"
    assert "Traceback" not in output and "Error" not in output.replace("ErrorHandler", ""), output[-3000:]


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/ready").status_code == 200
    except httpx.TransportError:
        return False



def test_start_up_loads_the_models_before_the_first_request(registry):
    """Loading is part of start-up (uvicorn accepts connections only after it), so with several workers none
    answers 'not ready' once it answers at all."""
    fresh = ServedModels(registry.uri, {"sensor": SENSOR_NAME, "molecule": MOLECULE_NAME}, "champion",
                       registry.verify_key, prefer_cuda=False)
    with TestClient(create_app(ServingSettings(**LIMITS), store=fresh)) as client:
        first = client.get("/ready")
    assert first.status_code == 200 and first.json()["models"] == {"sensor": "2", "molecule": "1"}


def test_what_start_up_loaded_is_kept_out_of_the_collectors_walks_until_shutdown(registry):
    """Full collections under load walked the libraries and models, every two seconds, holding every waiting request:
    the service freezes what it holds once started (and what each new version adds), and unfreezes at shutdown."""
    fresh = ServedModels(registry.uri, {"sensor": SENSOR_NAME, "molecule": MOLECULE_NAME}, "champion",
                       registry.verify_key, prefer_cuda=False)
    gc.unfreeze()
    with TestClient(create_app(ServingSettings(**LIMITS), store=fresh)) as client:
        wait_ready(client)
        sensor_model = fresh.get("sensor")
        assert gc.get_freeze_count() > 0 and _frozen(sensor_model)
        assert client.post("/v1/sensor/predict", json={"windows": [_window()]}).status_code == 200
    assert gc.get_freeze_count() == 0


def _frozen(thing) -> bool:
    """`thing` is in the permanent generation (no collection of generations 0-2 ever lists it)."""
    return gc.is_tracked(thing) and all(id(thing) not in map(id, gc.get_objects(generation)) for generation in range(3))
