"""Acknowledged predictions are never lost: the whole service killed with SIGKILL under load from 8 clients, then
started again on the same store and journal, holds every prediction a client received an id for."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from contract.prediction_store import engine_for, find_predictions
from tests.conftest import PROJECT_ROOT
from tests.integration.test_no_orphans import wait_for
from tests.integration.test_serving_registry import free_port, sensor_windows, shared_registry

pytestmark = pytest.mark.integration
CLIENTS = 8


def start(env: dict[str, str]) -> subprocess.Popen:
    """`python -m serving` in a session of its own, so that it can be killed whole."""
    return subprocess.Popen([sys.executable, "-m", "serving"], cwd=PROJECT_ROOT, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_every_acknowledged_prediction_survives_a_kill_of_the_whole_service(tmp_path_factory, tmp_path):
    registry = shared_registry(tmp_path_factory.getbasetemp())
    port, store = free_port(), f"sqlite:///{tmp_path / 'p.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": registry.uri, "SERVING_VERIFY_KEY": str(registry.verify_key),
           "SERVING_PORT": str(port), "SERVING_PREFER_CUDA": "false", "SERVING_WORKERS": "2",
           "SERVING_FEATURIZE_WORKERS": "1", "SERVING_PREDICTION_STORE": store}
    url = f"http://127.0.0.1:{port}"
    body = {"windows": [w.T.tolist() for w in sensor_windows(4, seed=9)]}
    acknowledged: list[str] = []
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(base_url=url, timeout=10) as session:
            while not stop.is_set():
                try:
                    answer = session.post("/v1/sensor/predict", json=body)
                except httpx.TransportError:  # the service is gone
                    return
                if answer.status_code == 200:
                    acknowledged.extend(p["prediction_id"] for p in answer.json()["predictions"])

    service = start(env)
    try:
        wait_for(f"{url}/ready", service)
        with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
            runs = [pool.submit(client) for _ in range(CLIENTS)]
            time.sleep(3)
            os.killpg(service.pid, signal.SIGKILL)  # the main process, its workers and their writers at once
            stop.set()
            for run in runs:
                run.result()
        service.wait(timeout=30)
        assert len(acknowledged) > 100
        service = start(env)
        wait_for(f"{url}/ready", service)
        engine = engine_for(store)
        deadline = time.monotonic() + 60
        while missing := set(acknowledged) - set(find_predictions(engine, acknowledged)):
            assert time.monotonic() < deadline, f"{len(missing)} of {len(acknowledged)} acknowledged ids missing"
            time.sleep(0.5)
    finally:
        stop.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(service.pid, signal.SIGKILL)
