"""One real Prefect server for the integration tests (in-process flows and stage subprocesses)."""

from __future__ import annotations

import os

import pytest

from flows.server import prefect_server


@pytest.fixture(scope="session", autouse=True)
def prefect_api():
    """A `prefect server start` on a free port; PREFECT_API_URL points every flow run at it."""
    with prefect_server() as url:
        os.environ["PREFECT_API_URL"] = url
        yield url
        os.environ.pop("PREFECT_API_URL", None)
