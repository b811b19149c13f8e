"""One real Prefect server per test process for the integration tests (in-process flows and stage subprocesses),
and one finished tiny workspace for the whole test run."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from filelock import FileLock

from flows.server import prefect_server
from tests.integration.workspace import build_finished


@pytest.fixture(scope="session", autouse=True)
def prefect_api():
    """A `prefect server start` on a free port; PREFECT_API_URL points every flow run at it."""
    with prefect_server() as url:
        os.environ["PREFECT_API_URL"] = url
        yield url
        os.environ.pop("PREFECT_API_URL", None)


@pytest.fixture(scope="session")
def finished_workspace(tmp_path_factory, worker_id, prefect_api) -> Path:
    """The workspace of workspace.build_finished (the whole tiny pipeline run as `make run` runs it), built once per
    test run: by the first test process that asks for it, while the other xdist workers wait on the lock. Tests read
    it or clone it (workspace.clone_workspace), never change it."""
    shared = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        shared = shared.parent  # the folder of every worker's base temp
    template, built = shared / "finished", shared / "finished.built"
    with FileLock(shared / "finished.lock"):
        if not built.exists():
            shutil.rmtree(template, ignore_errors=True)  # what a failed build left
            build_finished(template)
            built.touch()
    return template
