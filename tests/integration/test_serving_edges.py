"""The service's edges: the admin key and JSON-only admin bodies, CORS closed unless configured, depiction off
the event loop with the molecule size limit, the documented error statuses, and what /v1/models says about
the target and the interval."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from contract.card import parse_card
from models.predictors import MoleculePredictor
from serving.app import create_app
from serving.loading import LoadedModel
from serving.settings import ServingSettings
from serving.served_models import ServedModels
from tests.integration.test_serving import LIMITS, wait_ready
from tests.integration.test_serving_registry import MOLECULE_NAME, SENSOR_NAME, serve, shared_registry, tiny_models

pytestmark = pytest.mark.integration

API_KEY, ADMIN_KEY, ALLOWED = "api-key", "admin-key", "https://ops.example.com"


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> ServedModels:
    registry = shared_registry(tmp_path_factory.getbasetemp())
    return ServedModels(registry.uri, {"sensor": SENSOR_NAME, "molecule": MOLECULE_NAME}, "champion",
                      registry.verify_key, prefer_cuda=False)


@pytest.fixture(scope="module")
def configured(store):
    """API key, admin key and one allowed origin."""
    settings = ServingSettings(**LIMITS, api_key=API_KEY, admin_key=ADMIN_KEY, cors_origins=[ALLOWED])
    with TestClient(create_app(settings, store=store)) as client:
        wait_ready(client)
        yield client


@pytest.fixture(scope="module")
def default_url(store):
    """The defaults of the edges (no admin key, no origin) on a live server; large molecules may be drawn."""
    settings = ServingSettings(**{**LIMITS, "max_smiles_length": 500, "max_heavy_atoms": 200})
    with serve(create_app(settings, store=store)) as url:
        yield url


def admin(key: str | None = ADMIN_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def test_reload_needs_the_admin_key_not_the_api_key(configured):
    for headers in (admin(None), admin("wrong"), admin(API_KEY)):
        refused = configured.post("/v1/admin/reload", json={}, headers=headers)
        assert refused.status_code == 401 and "SERVING_ADMIN_KEY" in refused.json()["detail"]
    done = configured.post("/v1/admin/reload", json={}, headers=admin())
    assert done.status_code == 200, done.text
    assert done.json()["changes"] == {} and {m["version"] for m in done.json()["models"]} == {"2", "1"}


@pytest.mark.parametrize(("content", "content_type"), [
    ("{}", "text/plain"), ("a=1", "application/x-www-form-urlencoded"), ("", None), ("{}", "multipart/form-data"),
])
def test_reload_refuses_a_body_that_is_not_json(configured, content, content_type):
    """What a cross-site form or `fetch` without a preflight can send is refused before the route runs."""
    headers = admin() | ({"Content-Type": content_type} if content_type else {})
    refused = configured.post("/v1/admin/reload", content=content, headers=headers)
    assert refused.status_code == 415 and "application/json" in refused.json()["detail"]


def test_reload_takes_an_empty_object_only(configured):
    refused = configured.post("/v1/admin/reload", json={"force": True}, headers=admin())
    assert refused.status_code == 422 and "force" in refused.json()["detail"]


def test_without_an_admin_key_the_admin_routes_are_disabled(default_url):
    refused = httpx.post(f"{default_url}/v1/admin/reload", json={}, headers=admin())
    assert refused.status_code == 403 and "disabled" in refused.json()["detail"]


def preflight(url_or_client, origin: str):
    headers = {"Origin": origin, "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "authorization,content-type"}
    if isinstance(url_or_client, str):
        return httpx.options(f"{url_or_client}/v1/sensor/predict", headers=headers)
    return url_or_client.options("/v1/sensor/predict", headers=headers)


def test_cors_is_closed_by_default(default_url):
    assert "access-control-allow-origin" not in preflight(default_url, ALLOWED).headers
    simple = httpx.get(f"{default_url}/v1/models", headers={"Origin": ALLOWED})
    assert simple.status_code == 200 and "access-control-allow-origin" not in simple.headers


def test_cors_lets_the_configured_origin_in_only(configured):
    allowed = preflight(configured, ALLOWED)
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == ALLOWED
    assert "authorization" in allowed.headers["access-control-allow-headers"].lower()
    assert "access-control-allow-origin" not in preflight(configured, "https://elsewhere.example").headers
    answer = configured.get("/v1/models", headers={"Origin": ALLOWED, "Authorization": f"Bearer {API_KEY}"})
    assert answer.headers["access-control-allow-origin"] == ALLOWED


def test_a_molecule_over_the_size_limit_is_not_drawn(configured):
    refused = configured.get("/v1/molecule/depict", params={"smiles": "C" * 13},
                             headers={"Authorization": f"Bearer {API_KEY}"})
    assert refused.status_code == 422 and refused.json()["detail"] == "SMILES 'CCCCCCCCCCCCC' has 13 heavy atoms; at most 12"


def test_drawing_does_not_hold_up_other_requests(default_url):
    """Twelve large drawings queued on the one drawing process, then five /health calls one after another:
    all five are answered before the last drawing is."""
    molecules = ["c1ccc2cc3ccccc3cc2c1" * 10 + "C" * i for i in range(12)]  # 140 to 151 heavy atoms each
    finished: list[tuple[float, str]] = []

    def depict(smiles: str) -> None:
        answer = httpx.get(f"{default_url}/v1/molecule/depict", params={"smiles": smiles}, timeout=60)
        assert answer.status_code == 200 and "<svg" in answer.text, answer.text
        finished.append((time.monotonic(), "drawing"))

    with concurrent.futures.ThreadPoolExecutor(len(molecules)) as pool:
        drawings = [pool.submit(depict, smiles) for smiles in molecules]
        time.sleep(0.2)  # the drawings reach the service first
        for _ in range(5):
            assert httpx.get(f"{default_url}/health", timeout=60).status_code == 200
            finished.append((time.monotonic(), "health"))
        for drawing in drawings:
            drawing.result()
    assert max(t for t, what in finished if what == "health") < max(t for t, what in finished if what == "drawing")


def test_openapi_documents_one_error_body_for_every_status(default_url):
    schema = httpx.get(f"{default_url}/openapi.json").json()
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    assert schema["components"]["schemas"]["ErrorBody"]["properties"]["detail"]["type"] == "string"
    responses = {f"{method.upper()} {path}": set(operation["responses"])
                 for path, methods in schema["paths"].items() for method, operation in methods.items()}
    assert responses["POST /v1/sensor/predict"] == {"200", "400", "401", "413", "415", "422", "503", "504"}
    assert responses["POST /v1/molecule/predict"] == responses["POST /v1/sensor/predict"]
    assert responses["GET /v1/molecule/depict"] == {"200", "401", "422", "503", "504"}
    assert responses["POST /v1/admin/reload"] == {"200", "400", "401", "403", "413", "415", "422"}
    invalid = httpx.post(f"{default_url}/v1/molecule/predict", json={"smiles": "CCO"})
    assert invalid.status_code == 422 and isinstance(invalid.json()["detail"], str)


def test_models_name_the_target_and_the_interval(default_url, tmp_path_factory):
    info = {m["family"]: m for m in httpx.get(f"{default_url}/v1/models").json()["models"]}
    assert info["molecule"]["target"] == "solubility" and info["sensor"]["target"] == "failure within 8 steps"
    assert info["molecule"]["interval"] is None  # the tests' card has no calibration, like older cards
    models = tiny_models(tmp_path_factory.getbasetemp() / "models")
    card = {**models.molecule_card, "calibration": {"interval_z": 1.96, "nominal_coverage": 0.95},
            "test_metrics": {"rmse": 0.7, "r2": float("nan")}}
    described = LoadedModel("molecule", MOLECULE_NAME, "3", "champion", "0" * 64, parse_card(card),
                            MoleculePredictor(models.molecule, card, prefer_cuda=False)).describe()
    assert described["interval"] == {"z": 1.96, "coverage": 0.95}
    assert described["metrics"] == {"rmse": 0.7, "r2": None}  # JSON has no NaN
