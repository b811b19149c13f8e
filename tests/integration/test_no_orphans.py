"""One service, not N processes, and no process outliving what started it: a service killed outright (`kill -9` of
its main process) takes its workers, their prediction log writers and featurisation processes along, and its port
can be bound again; a Prefect server started by the pipeline ends with the pipeline's process; a reload asked of
one worker reaches every worker."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import psutil
import pytest
from mlflow import MlflowClient
from prometheus_client.parser import text_string_to_metric_families

from contract.registry import CHAMPION
from tests.conftest import PROJECT_ROOT
from tests.integration.test_serving_registry import (SENSOR_NAME, build_registry, free_port, sensor_windows,
                                                     shared_registry, tiny_models)

pytestmark = pytest.mark.integration
BOUND_S = 60  # a timeout for the test, not a speed check


def wait_for(url: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + BOUND_S * 2
    while True:
        assert process.poll() is None, f"the process ended with {process.returncode}"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"{url} was not up in time"
        time.sleep(0.2)


def all_gone(processes: list[psutil.Process]) -> list[str]:
    """What is still running of `processes` after waiting up to BOUND_S."""
    _, alive = psutil.wait_procs(processes, timeout=BOUND_S)
    return [" ".join(p.cmdline()[:4]) for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_a_service_killed_outright_leaves_no_worker_and_frees_its_port(tmp_path_factory, tmp_path):
    registry = shared_registry(tmp_path_factory.getbasetemp())
    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": registry.uri, "SERVING_VERIFY_KEY": str(registry.verify_key),
           "SERVING_PORT": str(port), "SERVING_PREFER_CUDA": "false", "SERVING_WORKERS": "2",
           "SERVING_FEATURIZE_WORKERS": "1", "SERVING_PREDICTION_STORE": f"sqlite:///{tmp_path / 'p.db'}"}
    service = subprocess.Popen([sys.executable, "-m", "serving"], cwd=PROJECT_ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(f"http://127.0.0.1:{port}/ready", service)
        assert httpx.post(f"http://127.0.0.1:{port}/v1/molecule/predict", json={"smiles": ["CCO"]},
                          timeout=30).status_code == 200
        started = psutil.Process(service.pid).children(recursive=True)
        assert len([p for p in started if "serving" in " ".join(p.cmdline())]) >= 2  # the workers, their writers
        service.kill()
        service.wait(timeout=BOUND_S)
        assert all_gone(started) == []
        with socket.socket() as again:
            again.bind(("127.0.0.1", port))
    finally:
        service.kill()


def test_the_pipelines_prefect_server_ends_with_the_pipeline_killed_outright(tmp_path):
    code = ("import os; from flows.server import start_prefect_server; url, server = start_prefect_server(); "
            "print(server.pid, url, flush=True); import time; time.sleep(600)")
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)
    pipeline = subprocess.Popen([sys.executable, "-c", code], cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE,
                                text=True)
    try:
        pid, url = pipeline.stdout.readline().split()
        server = psutil.Process(int(pid))
        family = [server, *server.children(recursive=True)]
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        pipeline.kill()
        pipeline.wait(timeout=BOUND_S)
        assert all_gone(family) == []
    finally:
        pipeline.kill()


def test_a_reload_asked_of_one_worker_reaches_every_worker_and_the_metrics_are_the_services(tmp_path):
    """Two workers, the registry polled hourly: after the champion moves and one worker is asked to reload, every
    answer, whichever worker gives it, comes from the new version; /metrics, whichever worker answers it, counts
    every request of the service and shows the version served."""
    registry = build_registry(tmp_path / "registry", tiny_models(tmp_path / "models"))
    port, admin = free_port(), "admin-key"
    env = {**os.environ, "MLFLOW_TRACKING_URI": registry.uri, "SERVING_VERIFY_KEY": str(registry.verify_key),
           "SERVING_PORT": str(port), "SERVING_PREFER_CUDA": "false", "SERVING_WORKERS": "2",
           "SERVING_FEATURIZE_WORKERS": "1", "SERVING_POLL_SECONDS": "3600", "SERVING_ADMIN_KEY": admin,
           "SERVING_PREDICTION_STORE": f"sqlite:///{tmp_path / 'p.db'}"}
    service = subprocess.Popen([sys.executable, "-m", "serving"], cwd=PROJECT_ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    window = {"windows": [sensor_windows(1, seed=5)[0].T.tolist()]}

    def versions(requests: int) -> set[str]:
        """The versions that answered `requests` requests, each on a new connection (any worker may take it)."""
        return {httpx.post(f"{url}/v1/sensor/predict", json=window, timeout=30).json()["model"]["version"]
                for _ in range(requests)}

    try:
        wait_for(f"{url}/ready", service)
        assert versions(10) == {"2"}
        MlflowClient(registry.uri).set_registered_model_alias(SENSOR_NAME, CHAMPION, "1")
        answer = httpx.post(f"{url}/v1/admin/reload", json={}, headers={"Authorization": f"Bearer {admin}"},
                            timeout=60)
        assert answer.status_code == 200, answer.text
        assert (answer.json()["workers"], answer.json()["lagging"]) == (2, []), answer.json()
        assert versions(20) == {"1"}
        for _ in range(10):  # each scrape on a new connection: any worker may answer it
            families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text)}
            answered = sum(sample.value for sample in families["serving_requests"].samples if sample.name ==
                           "serving_requests_total" and sample.labels["path"] == "/v1/sensor/predict")
            served = {sample.value for sample in families["serving_model_version"].samples
                      if sample.labels["name"] == SENSOR_NAME}
            assert (answered, served) == (30, {1.0})
    finally:
        service.terminate()
        service.wait(timeout=BOUND_S)
