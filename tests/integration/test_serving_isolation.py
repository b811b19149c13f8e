"""One bad item never fails another: arbitrary strings (lone surrogates, control characters, RDKit's edge cases)
through /v1 and /v2 of both families, while other clients send valid traffic beside them, get no 5xx, and the
valid items are all answered; text that is not Unicode and a header that is not a number are refused by name; the
OpenAPI schema declares every path parameter."""

from __future__ import annotations

import concurrent.futures
import json
import threading

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving.app import create_app
from serving.served_models import ServedModels
from serving.settings import ServingSettings
from tests.integration.test_serving import LIMITS
from tests.integration.test_serving_registry import (MOLECULE_NAME, SENSOR_NAME, sensor_windows, serve,
                                                     shared_registry)

pytestmark = pytest.mark.integration

VALID_SMILES = ["CCO", "c1ccccc1O", "CC(=O)N", "ClCBr"]
EDGE_SMILES = ["[H][H]", "[H+]", "*", "[2H][2H]", "[Na+].[Cl-]", "C\x00C", "C" * 40, "c1cc", "[Xe]", "C1CC2"]
# Any code point, surrogates included (hypothesis leaves out category Cs unless told)
ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=30)


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    registry = shared_registry(tmp_path_factory.getbasetemp())
    store = ServedModels(registry.uri, {"sensor": SENSOR_NAME, "molecule": MOLECULE_NAME}, "champion",
                         registry.verify_key, prefer_cuda=False)
    with serve(create_app(ServingSettings(**LIMITS), store=store)) as url:
        yield url


def json_body(payload: dict) -> bytes:
    """`payload` as JSON that may spell lone surrogates (as `\\ud800` escapes), as a client's encoder writes them."""
    return json.dumps(payload, ensure_ascii=True).encode()


def v2_smiles(smiles: list[str]) -> dict:
    return {"inputs": [{"name": "smiles", "shape": [len(smiles)], "datatype": "BYTES", "data": smiles}]}


class ValidTraffic:
    """Clients that send valid molecules and windows to /v1 and /v2 until stopped; `failures` lists each answer
    that was not a 200 with every item answered."""

    def __init__(self, url: str, clients: int = 4):
        self.url, self.clients = url, clients
        self.failures: list[str] = []
        self.answered = 0
        self._stop = threading.Event()
        self._pool = concurrent.futures.ThreadPoolExecutor(clients)
        self._windows = sensor_windows(4, seed=3).transpose(0, 2, 1)

    def __enter__(self) -> ValidTraffic:
        self._runs = [self._pool.submit(self._client, i) for i in range(self.clients)]
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for run in self._runs:
            run.result()
        self._pool.shutdown()

    def _client(self, index: int) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self._stop.is_set():
                rng = np.random.default_rng(self.answered + index)
                smiles = [str(s) for s in rng.choice(VALID_SMILES, size=2)]
                kind = (self.answered + index) % 3
                if kind == 0:
                    answer = client.post("/v1/molecule/predict", json={"smiles": smiles})
                    ok = answer.status_code == 200 and not any("error" in p for p in answer.json()["predictions"])
                elif kind == 1:
                    answer = client.post(f"/v2/models/{MOLECULE_NAME}/infer", json=v2_smiles(smiles))
                    ok = answer.status_code == 200 and not any(
                        o["data"] != [""] * len(smiles) for o in answer.json()["outputs"] if o["name"] == "error")
                else:
                    answer = client.post("/v1/sensor/predict", json={"windows": self._windows.tolist()})
                    ok = answer.status_code == 200
                self.answered += 1
                if not ok:
                    self.failures.append(f"{answer.status_code}: {answer.text[:300]}")


def test_edge_molecules_are_answered_or_refused_per_item(url):
    sent = EDGE_SMILES[:LIMITS["max_items"] - 1] + ["CCO"]
    answer = httpx.post(f"{url}/v1/molecule/predict", json={"smiles": sent}, timeout=30)
    assert answer.status_code == 200, answer.text
    predictions = answer.json()["predictions"]
    assert "error" not in predictions[-1] and predictions[-1]["value"] is not None
    for smiles, prediction in zip(sent, predictions, strict=True):
        assert prediction["smiles"] == smiles
        assert ("error" in prediction) != ("value" in prediction), prediction


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(ANY_TEXT | st.sampled_from(EDGE_SMILES), min_size=1, max_size=4))
def test_arbitrary_strings_never_fail_another_request(url, texts):
    """Each body is answered without a 5xx, and the valid clients beside it lose nothing."""
    with ValidTraffic(url) as valid, httpx.Client(base_url=url, timeout=30) as client:
        for path, body in (("/v1/molecule/predict", {"smiles": texts + ["CCO"]}),
                           (f"/v2/models/{MOLECULE_NAME}/infer", v2_smiles(texts + ["CCO"])),
                           (f"/v2/models/{SENSOR_NAME}/infer", v2_smiles(texts)),
                           ("/v1/sensor/predict", {"windows": [[[1.0, 2.0, 3.0]] * 16], "unit": texts[0] or "u"})):
            answer = client.post(path, content=json_body(body), headers={"Content-Type": "application/json"})
            assert answer.status_code < 500, (path, texts, answer.text)
            if answer.status_code == 200 and path.startswith("/v1/molecule"):
                assert "error" not in answer.json()["predictions"][-1], answer.text
    assert valid.answered and not valid.failures, valid.failures[:3]


def test_a_lone_surrogate_is_refused_naming_the_item(url):
    v1 = httpx.post(f"{url}/v1/molecule/predict", content=b'{"smiles": ["CCO", "C\\ud800C"]}',
                    headers={"Content-Type": "application/json"})
    assert v1.status_code == 400 and "column" in v1.json()["detail"], v1.text
    v2 = httpx.post(f"{url}/v2/models/{MOLECULE_NAME}/infer", content=json_body(v2_smiles(["CCO", "C\ud800C"])),
                    headers={"Content-Type": "application/json"})
    assert v2.status_code == 400 and "smiles[1]" in v2.json()["error"], v2.text


@pytest.mark.parametrize("declared", ["²", "¹²", "-1", "1e3"])
def test_a_header_length_that_is_not_ascii_digits_is_refused(url, declared):
    body = json_body(v2_smiles(["CCO"]))
    answer = httpx.post(f"{url}/v2/models/{MOLECULE_NAME}/infer", content=body,
                        headers={"Content-Type": "application/json",
                                 "Inference-Header-Content-Length": declared.encode("latin-1")})
    assert answer.status_code == 400 and "Inference-Header-Content-Length" in answer.json()["error"], answer.text


def test_openapi_declares_every_path_parameter(url):
    spec = httpx.get(f"{url}/openapi.json").json()
    for path, operations in spec["paths"].items():
        named = {part[1:-1] for part in path.split("/") if part.startswith("{")}
        for method, operation in operations.items():
            declared = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
            assert declared == named, (method, path, declared)
    version = httpx.get(f"{url}/v2/models/{MOLECULE_NAME}/versions/1").json()
    assert version["versions"] == ["1"], version
