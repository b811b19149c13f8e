"""One real Prefect server for the integration tests of the whole test run (in-process flows and stage
subprocesses of every xdist worker), and one finished tiny workspace for the whole test run."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from filelock import FileLock
from prefect.context import refresh_global_settings_context

from flows.server import start_prefect_server
from tests import run_folder
from tests.integration.workspace import build_finished


@pytest.fixture(scope="session", autouse=True)
def prefect_api():
    """A `prefect server start` on a free port, one for the whole test run: the first test process that needs it
    starts it, the other xdist workers wait on the lock and connect to it, and it stops when the run ends
    (tests/run_folder.py). PREFECT_API_URL points every flow run at it."""
    record = run_folder.path() / run_folder.SERVER_RECORD
    with FileLock(run_folder.path() / "prefect-server.lock"):
        if not record.exists():
            url, process = start_prefect_server()
            record.write_text(json.dumps({"url": url, "pid": process.pid}))
    url = json.loads(record.read_text())["url"]
    os.environ["PREFECT_API_URL"] = url
    # Prefect reads its settings when it is imported (here: while the tests were collected); without a refresh the
    # in-process clients would start a temporary server of their own, on this process's PREFECT_HOME
    refresh_global_settings_context()
    yield url
    os.environ.pop("PREFECT_API_URL", None)
    refresh_global_settings_context()


@pytest.fixture(scope="session")
def finished_workspace(prefect_api) -> Path:
    """The workspace of workspace.build_finished (the whole tiny pipeline run as `make run` runs it), built once per
    test run in the run's folder (tests/run_folder.py): by the first test process that asks for it, while the other
    xdist workers wait on the lock. Tests read it or clone it (workspace.clone_workspace), never change it."""
    shared = run_folder.path()
    template, built = shared / "finished", shared / "finished.built"
    with FileLock(shared / "finished.lock"):
        if not built.exists():
            shutil.rmtree(template, ignore_errors=True)  # what a failed build left
            build_finished(template)
            built.touch()
    return template
