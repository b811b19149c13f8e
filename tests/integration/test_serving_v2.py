"""The Open Inference Protocol (/v2) against a real uvicorn server, with tritonclient as the client: health,
metadata, inference on JSON and binary tensors equal to /v1's answers, each answered item's prediction id in the
prediction store, protocol errors, auth."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from fastapi.testclient import TestClient
from tritonclient.utils import InferenceServerException

from contract.prediction_store import connect, find_predictions, resolve_url
from serving.app import create_app
from serving.settings import ServingSettings
from serving.served_models import ServedModels
from tests.integration.test_serving import LIMITS, models, registry, store, window_json  # noqa: F401
from tests.integration.test_serving_registry import (
    CHANNELS, MOLECULE_NAME, SENSOR_NAME, WINDOW, serve,
)

pytestmark = pytest.mark.integration

SENSOR_OUTPUTS = ("failure_probability", "alert", "uncertainty")
SMILES = ["CCO", "not a molecule", "c1ccccc1"]


@pytest.fixture(scope="module")
def url(store):
    with serve(create_app(ServingSettings(**LIMITS), store=store)) as url:
        yield url


@pytest.fixture(scope="module")
def client(url):
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    yield client
    client.close()


@pytest.fixture(scope="module")
def windows(models) -> np.ndarray:
    """Five (T, C) windows in the protocol's layout, one with a missing reading."""
    windows = models.test_windows[:5].transpose(0, 2, 1).astype(np.float32)
    windows[0, 3, 1] = np.nan
    return windows


def v1_sensor(url: str, windows: np.ndarray) -> list[dict]:
    answer = httpx.post(f"{url}/v1/sensor/predict", json={"windows": [window_json(w.T) for w in windows]})
    assert answer.status_code == 200, answer.text
    return answer.json()["predictions"]


def v1_molecule(url: str, smiles: list[str]) -> list[dict]:
    answer = httpx.post(f"{url}/v1/molecule/predict", json={"smiles": smiles}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["predictions"]


def sensor_input(windows: np.ndarray, binary: bool, name: str = "windows", datatype: str = "FP32"):
    tensor = triton.InferInput(name, list(windows.shape), datatype)
    return tensor.set_data_from_numpy(windows, binary_data=binary)


def smiles_input(smiles: list[str], binary: bool, shape: tuple[int, ...] | None = None):
    array = np.array(smiles, dtype=object).reshape(shape or (len(smiles),))
    return triton.InferInput("smiles", list(array.shape), "BYTES").set_data_from_numpy(array, binary_data=binary)


def refusal(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as refused:
        call()
    return refused.value


def test_health_and_server_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    metadata = client.get_server_metadata()
    assert metadata["name"] == "failsafe-ml" and "binary_tensor_data" in metadata["extensions"]


@pytest.mark.parametrize("name", [SENSOR_NAME, "sensor"])
def test_sensor_metadata_matches_the_card(client, name):
    metadata = client.get_model_metadata(name)
    assert (metadata["name"], metadata["versions"], metadata["platform"]) == (SENSOR_NAME, ["2"], "onnxruntime")
    assert metadata["inputs"] == [{"name": "windows", "datatype": "FP32", "shape": [-1, WINDOW, len(CHANNELS)]}]
    assert metadata["outputs"] == [{"name": "failure_probability", "datatype": "FP32", "shape": [-1]},
                                   {"name": "alert", "datatype": "BOOL", "shape": [-1]},
                                   {"name": "uncertainty", "datatype": "FP32", "shape": [-1]},
                                   {"name": "prediction_id", "datatype": "BYTES", "shape": [-1]}]
    assert client.is_model_ready(name) and client.is_model_ready(name, "2")
    assert client.get_model_metadata(name, "2")["versions"] == ["2"]


@pytest.mark.parametrize("name", [MOLECULE_NAME, "molecule"])
def test_molecule_metadata_matches_the_card(client, name):
    metadata = client.get_model_metadata(name)
    assert (metadata["name"], metadata["versions"]) == (MOLECULE_NAME, ["1"])
    assert metadata["inputs"] == [{"name": "smiles", "datatype": "BYTES", "shape": [-1]}]
    assert [(o["name"], o["datatype"]) for o in metadata["outputs"]] == [  # a regression model
        ("value", "FP32"), ("uncertainty", "FP32"), ("error", "BYTES"), ("prediction_id", "BYTES")]
    assert client.is_model_ready(name)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_sensor_inference_equals_v1(client, url, windows, binary):
    result = client.infer("sensor", [sensor_input(windows, binary)],
                          outputs=[triton.InferRequestedOutput(n, binary_data=binary) for n in SENSOR_OUTPUTS])
    response = result.get_response()
    assert (response["model_name"], response["model_version"]) == (SENSOR_NAME, "2")
    assert all(("data" in o) != binary for o in response["outputs"])  # each output as it was asked for
    expected = v1_sensor(url, windows)
    assert np.array_equal(result.as_numpy("failure_probability"),
                          np.float32([p["failure_probability"] for p in expected]))
    assert np.array_equal(result.as_numpy("uncertainty"), np.float32([p["uncertainty"] for p in expected]))
    assert result.as_numpy("alert").tolist() == [p["alert"] for p in expected]
    assert result.as_numpy("alert").dtype == np.bool_


def test_each_answer_carries_its_prediction_id_in_the_store(client, url, windows):
    sensor = client.infer("sensor", [sensor_input(windows, True)])
    molecule = client.infer("molecule", [smiles_input(SMILES, True)])
    sensor_ids = [i.decode() for i in sensor.as_numpy("prediction_id")]
    molecule_ids = [i.decode() for i in molecule.as_numpy("prediction_id")]
    assert len(set(sensor_ids)) == len(windows) and all(len(i) == 32 for i in sensor_ids)
    assert molecule_ids[1] == "" and len(set(molecule_ids[::2])) == 2  # the SMILES that got an error has no id
    store = connect(resolve_url(Path.cwd()))
    deadline = time.monotonic() + 30
    while len(stored := find_predictions(store, sensor_ids + molecule_ids[::2])) < len(windows) + 2:
        assert time.monotonic() < deadline, "the /v2 predictions never reached the store"
        time.sleep(0.1)
    assert {stored[i]["family"] for i in sensor_ids} == {"sensor"}
    assert [stored[i]["output"]["failure_probability"] for i in sensor_ids] == pytest.approx(
        sensor.as_numpy("failure_probability").tolist())
    assert {stored[i]["family"] for i in molecule_ids[::2]} == {"molecule"}
    assert client.get_model_metadata("sensor", "2")["outputs"][-1]["name"] == "prediction_id"
    pinned = client.infer("sensor", [sensor_input(windows[:1], True)], model_version="2")
    assert pinned.get_response()["model_version"] == "2" and len(pinned.as_numpy("prediction_id")[0]) == 32


def test_a_missing_reading_is_not_a_zero(client, windows):
    """NaN (binary and tritonclient's JSON) and null (JSON) are masked as missing, not read as a number."""
    zeroed = windows.copy()
    zeroed[0, 3, 1] = 0.0
    missing = client.infer("sensor", [sensor_input(windows[:1], True)]).as_numpy("failure_probability")
    as_zero = client.infer("sensor", [sensor_input(zeroed[:1], True)]).as_numpy("failure_probability")
    assert missing[0] != as_zero[0]


def test_nested_json_data_with_null_and_request_level_binary_output(url, windows):
    """A nested `data` with null for the missing reading; binary_data_output for all but one output."""
    data = [[[None if np.isnan(v) else float(v) for v in step] for step in window] for window in windows]
    request = {"id": "req-7", "parameters": {"binary_data_output": True},
               "inputs": [{"name": "windows", "shape": list(windows.shape), "datatype": "FP32", "data": data}],
               "outputs": [{"name": "failure_probability"}, {"name": "alert", "parameters": {"binary_data": False}}]}
    answer = httpx.post(f"{url}/v2/models/{SENSOR_NAME}/infer", content=json.dumps(request))
    assert answer.status_code == 200, answer.text
    header_length = int(answer.headers["inference-header-content-length"])
    result = triton.InferResult.from_response_body(answer.content, header_length=header_length)
    assert result.get_response()["id"] == "req-7"
    assert [o["name"] for o in result.get_response()["outputs"]] == ["failure_probability", "alert"]
    assert "data" not in result.get_output("failure_probability") and "data" in result.get_output("alert")
    expected = v1_sensor(url, windows)
    assert np.array_equal(result.as_numpy("failure_probability"),
                          np.float32([p["failure_probability"] for p in expected]))
    assert result.as_numpy("alert").tolist() == [p["alert"] for p in expected]


@pytest.mark.parametrize(("binary", "shape"), [(True, None), (False, None), (True, (3, 1))],
                         ids=["binary", "json", "binary-n-by-1"])
def test_molecule_inference_with_a_per_item_error_equals_v1(client, url, binary, shape):
    result = client.infer(MOLECULE_NAME, [smiles_input(SMILES, binary, shape)],
                          outputs=[triton.InferRequestedOutput(n, binary_data=binary)
                                   for n in ("value", "uncertainty", "error")])
    ethanol, broken, benzene = v1_molecule(url, SMILES)
    value, uncertainty, error = (result.as_numpy(n) for n in ("value", "uncertainty", "error"))
    assert value[0] == np.float32(ethanol["value"]) and value[2] == np.float32(benzene["value"])
    assert uncertainty[0] == np.float32(ethanol["uncertainty"]) and uncertainty[2] == np.float32(benzene["uncertainty"])
    assert np.isnan(value[1]) and np.isnan(uncertainty[1])
    # tritonclient hands binary BYTES back as bytes and JSON ones as str
    assert [e.decode() if binary else e for e in error.tolist()] == ["", broken["error"], ""]
    if not binary:  # JSON has no NaN: the failed item's numbers are null
        assert result.get_output("value")["data"][1] is None


def bad_windows(windows: np.ndarray, binary: bool = True, **changes):
    return lambda client: client.infer("sensor", [sensor_input(windows, binary, **changes)])


def with_reading(windows: np.ndarray, value: float) -> np.ndarray:
    changed = windows.copy()
    changed[1, 2, 0] = value
    return changed


BAD_TENSORS = [
    ("name", lambda w: bad_windows(w, name="features"), "this model takes one input, 'windows' (FP32); got 'features'"),
    ("datatype", lambda w: bad_windows(w.astype(np.float64), datatype="FP64"),
     "input 'windows' must be FP32, not FP64"),
    ("shape", lambda w: bad_windows(w[:, 1:]), f"has shape [5, {WINDOW - 1}, 3]; this model needs [n, {WINDOW}, 3]"),
    ("infinite-binary", lambda w: bad_windows(with_reading(w, np.inf)),
     f"windows[1][2][0] ({CHANNELS[0]}) is not a finite float32 reading"),
    ("infinite-json", lambda w: bad_windows(with_reading(w, -np.inf), binary=False),
     f"windows[1][2][0] ({CHANNELS[0]}) is not a finite float32 reading"),
    ("too-many", lambda w: bad_windows(np.concatenate([w, w])), "10 windows in one request; at most 8"),
    ("output", lambda w: lambda client: client.infer("sensor", [sensor_input(w, True)],
                                                     outputs=[triton.InferRequestedOutput("probability")]),
     "unknown output 'probability'; this model has failure_probability, alert, uncertainty"),
    ("compressed", lambda w: lambda client: client.infer("sensor", [sensor_input(w, True)],
                                                         request_compression_algorithm="gzip"),
     "Content-Encoding gzip is not supported: send the body uncompressed"),
    ("smiles-too-long", lambda w: lambda client: client.infer("molecule", [smiles_input(["C" * 41], True)]),
     "smiles[0] is 41 characters long; at most 40"),
    ("smiles-shape", lambda w: lambda client: client.infer("molecule", [smiles_input(SMILES[:2], True, (1, 2))]),
     "input 'smiles' has shape [1, 2]; this model needs [n] or [n, 1]"),
]


@pytest.mark.parametrize(("case", "call", "message"), BAD_TENSORS, ids=[c for c, _, _ in BAD_TENSORS])
def test_a_bad_tensor_gets_the_protocols_400(client, windows, case, call, message):
    error = refusal(lambda: call(windows)(client))
    assert error.status() == "400" and message in error.message(), error.message()


def test_raw_bodies_the_protocol_refuses(url, windows):
    header = json.dumps({"inputs": [{"name": "windows", "shape": list(windows.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": windows.nbytes}}]}).encode()
    short = httpx.post(f"{url}/v2/models/sensor/infer", content=header + windows.tobytes()[:-4],
                       headers={"Inference-Header-Content-Length": str(len(header))})
    assert short.status_code == 400
    assert short.json()["error"] == f"input 'windows' declares binary_data_size {windows.nbytes} but " \
                                    f"{windows.nbytes - 4} bytes follow the JSON"
    strings = json.dumps({"inputs": [{"name": "windows", "shape": [1, WINDOW, 3], "datatype": "FP32",
                                      "data": ["0.5"] * WINDOW * 3}]})
    answer = httpx.post(f"{url}/v2/models/sensor/infer", content=strings)
    assert answer.status_code == 400 and "holds '0.5'" in answer.json()["error"]
    truncated = struct.pack("<I", 10) + b"CCO"
    header = json.dumps({"inputs": [{"name": "smiles", "shape": [1], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(truncated)}}]}).encode()
    answer = httpx.post(f"{url}/v2/models/molecule/infer", content=header + truncated,
                        headers={"Inference-Header-Content-Length": str(len(header))})
    assert answer.status_code == 400 and answer.json()["error"] == "BYTES element 0 claims 10 bytes; only 3 follow"
    assert httpx.post(f"{url}/v2/models/sensor/infer", content=b"{").json()["error"].startswith("the inference")


def test_a_body_over_the_limit_gets_413_in_the_protocols_form(client):
    error = refusal(lambda: client.infer("molecule", [smiles_input(["C" * 30] * 3000, True)]))
    assert error.status() == "413" and "larger than" in error.message()


def test_unknown_model_or_version_is_404(client, windows):
    for call in (lambda: client.get_model_metadata("resnet"),
                 lambda: client.infer("resnet", [sensor_input(windows, True)])):
        error = refusal(call)
        assert error.status() == "404" and "unknown model 'resnet'" in error.message()
        assert SENSOR_NAME in error.message()
    error = refusal(lambda: client.infer("sensor", [sensor_input(windows, True)], model_version="1"))
    assert error.status() == "404" and error.message() == "model 'sensor' version '1' is not served; version 2 is"
    assert not client.is_model_ready("sensor", "1")


def test_api_key_guards_models_and_inference_not_health(store, windows):
    with serve(create_app(ServingSettings(**LIMITS, api_key="s3cret"), store=store)) as url:
        client = triton.InferenceServerClient(url.removeprefix("http://"))
        assert client.is_server_live() and client.is_server_ready()
        for call in (lambda headers: client.get_model_metadata("sensor", headers=headers),
                     lambda headers: client.infer("sensor", [sensor_input(windows, True)], headers=headers)):
            error = refusal(lambda: call(None))
            assert error.status() == "401" and "missing or wrong API key" in error.message()
            assert refusal(lambda: call({"Authorization": "Bearer wrong"})).status() == "401"
        ok = {"Authorization": "Bearer s3cret"}
        assert client.get_model_metadata("sensor", headers=ok)["name"] == SENSOR_NAME
        result = client.infer("sensor", [sensor_input(windows, True)], headers=ok)
        assert result.as_numpy("failure_probability").shape == (len(windows),)
        client.close()


def test_a_model_that_is_not_loaded_is_503_in_the_protocols_form(registry, windows):
    store = ServedModels(registry.uri, {"sensor": SENSOR_NAME, "molecule": "no-such-model"}, "champion",
                       registry.verify_key, prefer_cuda=False)
    with TestClient(create_app(ServingSettings(**LIMITS), store=store)) as client:
        assert client.get("/v2/health/live").json() == {"live": True}
        deadline = time.monotonic() + 30
        while "no version of no-such-model" not in (ready := client.get("/v2/health/ready")).json()["error"]:
            assert time.monotonic() < deadline, ready.json()
            time.sleep(0.05)
        assert ready.status_code == 503 and "molecule: no version of no-such-model" in ready.json()["error"]
        refused = client.post("/v2/models/molecule/infer", json={
            "inputs": [{"name": "smiles", "shape": [1], "datatype": "BYTES", "data": ["CCO"]}]})
        assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
        assert refused.json()["error"].startswith("no molecule model is loaded yet")
        assert client.get("/v2/models/molecule/ready").status_code == 503
