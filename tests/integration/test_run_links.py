"""Prefect's "View at <url>" line: absent against the pipeline's temporary server, present against a user's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from flows.pipeline import temporary_server_env

pytestmark = pytest.mark.integration

FLOW = "from prefect import flow\n@flow(name='links')\ndef links():\n    return 1\nlinks()\n"


def flow_log(env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", FLOW], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Finished in state Completed" in done.stdout + done.stderr
    return done.stdout + done.stderr


def test_no_view_links_to_the_runs_temporary_server(prefect_api):
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_UI_URL")}
    assert "View at" not in flow_log(temporary_server_env(env, prefect_api))
    users_server = flow_log({**env, "PREFECT_API_URL": prefect_api})
    assert f"View at {prefect_api.removesuffix('/api')}/runs/flow-run/" in users_server
