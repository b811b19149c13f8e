"""A folder for the whole test run, shared by its xdist workers: the controller (or the only test process) makes it
and names it in TEST_RUN_FOLDER, which the workers inherit. It holds the record of the run's one Prefect server and
the finished tiny workspace (tests/integration/conftest.py), and goes when the run ends."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

import psutil

VARIABLE = "TEST_RUN_FOLDER"
SERVER_RECORD = "prefect-server.json"  # {"url": API URL, "pid": the server's process, leader of its own group}


def make() -> None:
    os.environ[VARIABLE] = tempfile.mkdtemp(prefix="test-run-")


def path() -> Path:
    return Path(os.environ[VARIABLE])


def remove() -> None:
    """Stop the run's Prefect server, if a test started one, and delete the folder."""
    record = path() / SERVER_RECORD
    if record.exists():
        pid = json.loads(record.read_text())["pid"]
        with contextlib.suppress(psutil.NoSuchProcess):
            server = psutil.Process(pid)
            os.killpg(pid, signal.SIGTERM)  # `prefect server start` and its uvicorn
            try:
                server.wait(timeout=20)
            except psutil.TimeoutExpired:
                os.killpg(pid, signal.SIGKILL)
    shutil.rmtree(path(), ignore_errors=True)
