"""Schemathesis against the live service on a real registry: fuzzed valid and invalid requests to every route
of the OpenAPI schema get no server error, and every answer (errors included) has a documented status, content
type and body."""

from __future__ import annotations

import contextlib

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance, response_schema_conformance, status_code_conformance,
)

from serving.app import create_app
from serving.settings import ServingSettings
from serving.served_models import ServedModels
from tests.integration.test_serving import LIMITS
from tests.integration.test_serving_registry import MOLECULE_NAME, SENSOR_NAME, serve, shared_registry

pytestmark = pytest.mark.integration

ADMIN_KEY = "fuzz-admin-key"
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES = 15  # per route and generation mode: about 200 requests in all


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory):
    """The live service's own /openapi.json (admin routes enabled)."""
    registry = shared_registry(tmp_path_factory.getbasetemp())
    store = ServedModels(registry.uri, {"sensor": SENSOR_NAME, "molecule": MOLECULE_NAME}, "champion",
                       registry.verify_key, prefer_cuda=False)
    with serve(create_app(ServingSettings(**LIMITS, admin_key=ADMIN_KEY), store=store)) as url:
        yield schemathesis.openapi.from_url(f"{url}/openapi.json")


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
def test_every_answer_is_documented_and_none_is_a_server_error(api_schema, mode):
    """Every route gets drawn requests (with the admin key, so that reload is reached); a failed check raises
    with the request that broke it as a curl command."""
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert {op.label for op in operations} >= {"POST /v1/sensor/predict", "POST /v1/molecule/predict",
                                              "GET /v1/molecule/depict", "POST /v1/admin/reload"}
    for operation in operations:

        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(mode))
        def call(case) -> None:
            case.call_and_validate(headers={"Authorization": f"Bearer {ADMIN_KEY}"}, checks=CHECKS, timeout=30)

        with contextlib.suppress(Unsatisfiable):  # a route without parameters has no invalid request
            call()
