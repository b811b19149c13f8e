"""Acknowledged predictions are never lost: the whole service killed with SIGKILL under load from 8 clients, then
started again on the same store and journal, holds every prediction a client received an id for; a PostgreSQL store
made read-only under load holds them all once it is writable again, without a restart of the service."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from contract.prediction_store import engine_for, find_predictions
from tests.integration.postgres import set_read_only, throwaway_cluster
from tests.conftest import PROJECT_ROOT
from tests.integration.test_no_orphans import wait_for
from tests.integration.test_serving_registry import free_port, sensor_windows, shared_registry

pytestmark = pytest.mark.integration
CLIENTS = 8


def start(env: dict[str, str], log_file=None) -> subprocess.Popen:
    """`python -m serving` in a process group of its own, so that it can be killed whole (its output appended to
    `log_file`, if given)."""
    output = open(log_file, "ab") if log_file else subprocess.DEVNULL
    with output if log_file else contextlib.nullcontext():
        return subprocess.Popen([sys.executable, "-m", "serving"], cwd=PROJECT_ROOT, env=env, start_new_session=True,
                                stdout=output, stderr=subprocess.STDOUT)


def service_env(tmp_path_factory, port: int, store: str, **settings: str) -> dict[str, str]:
    registry = shared_registry(tmp_path_factory.getbasetemp())
    return {**os.environ, "MLFLOW_TRACKING_URI": registry.uri, "SERVING_VERIFY_KEY": str(registry.verify_key),
            "SERVING_PORT": str(port), "SERVING_PREFER_CUDA": "false", "SERVING_WORKERS": "2",
            "SERVING_FEATURIZE_WORKERS": "1", "SERVING_PREDICTION_STORE": store, **settings}


def sensor_client(url: str, acknowledged: list[str], stop: threading.Event) -> None:
    """Send 4 windows at a time until `stop` or the service is gone; keep the ids of the answers."""
    body = {"windows": [w.T.tolist() for w in sensor_windows(4, seed=9)]}
    with httpx.Client(base_url=url, timeout=10) as session:
        while not stop.is_set():
            try:
                answer = session.post("/v1/sensor/predict", json=body)
            except httpx.TransportError:  # the service is gone
                return
            if answer.status_code == 200:
                acknowledged.extend(p["prediction_id"] for p in answer.json()["predictions"])


def wait_until_stored(store: str, acknowledged: list[str], timeout_s: float = 60) -> None:
    engine = engine_for(store)
    deadline = time.monotonic() + timeout_s
    while missing := set(acknowledged) - set(find_predictions(engine, acknowledged)):
        assert time.monotonic() < deadline, f"{len(missing)} of {len(acknowledged)} acknowledged ids missing"
        time.sleep(0.5)
    engine.dispose()


def test_every_acknowledged_prediction_survives_a_kill_of_the_whole_service(tmp_path_factory, tmp_path):
    port, store = free_port(), f"sqlite:///{tmp_path / 'p.db'}"
    env = service_env(tmp_path_factory, port, store)
    url = f"http://127.0.0.1:{port}"
    acknowledged: list[str] = []
    stop = threading.Event()
    client = functools.partial(sensor_client, url, acknowledged, stop)
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
        wait_until_stored(store, acknowledged)
    finally:
        stop.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(service.pid, signal.SIGKILL)


def test_a_store_read_only_under_load_loses_nothing_and_the_log_resumes_without_a_restart(tmp_path_factory,
                                                                                          tmp_path):
    """The store turns read-only while 8 clients send windows to a queue of 64 rows: the service keeps answering,
    says the log is failing, keeps the overflow in its journal, and once the store is writable writes every
    acknowledged prediction."""
    with throwaway_cluster(tmp_path / "postgres") as store:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        acknowledged: list[str] = []
        stop = threading.Event()
        service = start(service_env(tmp_path_factory, port, store, SERVING_PREDICTION_QUEUE_ROWS="64",
                                    SERVING_PREDICTION_JOURNAL=str(tmp_path / "journal")),
                        tmp_path / "service.log")
        try:
            wait_for(f"{url}/ready", service)
            with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
                runs = [pool.submit(sensor_client, url, acknowledged, stop) for _ in range(CLIENTS)]
                try:
                    time.sleep(1)
                    set_read_only(store, True)
                    degraded, deadline = None, time.monotonic() + 30
                    while degraded is None:
                        assert time.monotonic() < deadline, "the service never said its log was failing"
                        ready = httpx.get(f"{url}/ready", timeout=10).json()
                        degraded = ready["prediction_log"] if ready["prediction_log"] != "ok" else None
                        time.sleep(0.2)
                    during = len(acknowledged)
                    time.sleep(3)
                    assert len(acknowledged) > during + 100  # answers go on while the store is read-only
                    set_read_only(store, False)
                    time.sleep(1)
                finally:
                    stop.set()
                for run in runs:
                    run.result()
            assert "read-only" in degraded, degraded
            assert service.poll() is None
            wait_until_stored(store, acknowledged)
            assert httpx.get(f"{url}/ready", timeout=10).json()["prediction_log"] == "ok"
        finally:
            stop.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(service.pid, signal.SIGKILL)
