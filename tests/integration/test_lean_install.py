"""`pip install '.[serve]'` into a fresh virtual environment gives a service that starts and answers from a real
registry, with neither torch, Prefect, DVC, onnx nor the pipeline's libraries installed; its monitoring (numpy
statistics) works without scipy and scikit-learn."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from models.predictors import SensorPredictor
from tests.integration.test_serving_registry import CHANNELS, free_port, shared_registry, tiny_models

pytestmark = pytest.mark.integration

PROJECT = Path(__file__).resolve().parents[2]
SOURCES = ["pyproject.toml", "README.md", "contract", "data", "models", "flows", "serving"]
PIPELINE_ONLY = ["torch", "torch_geometric", "prefect", "dvc", "onnx", "onnxscript", "sklearn", "scipy", "datamol",
                 "matplotlib"]


@pytest.fixture(scope="module")
def lean_python(tmp_path_factory) -> Path:
    """A new venv with the project installed from a clean copy of its sources, `serve` extra only."""
    root = tmp_path_factory.mktemp("lean")
    source = root / "source"
    source.mkdir()
    for name in SOURCES:
        if (PROJECT / name).is_dir():
            shutil.copytree(PROJECT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "prepared"))
        else:
            shutil.copy2(PROJECT / name, source / name)
    # no pip of its own: the test run's pip installs into it (`--python`), in half the time of the venv's bundled older
    # pip; --no-compile: the throwaway venv's modules are compiled when the service imports them, not all up front
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                              "--disable-pip-version-check", "--no-compile", "-c", str(PROJECT / "constraints.txt"),
                              f"{source}[serve]"], capture_output=True, text=True, timeout=1200)
    assert install.returncode == 0, install.stderr[-3000:]
    return python


def test_the_serve_extra_installs_nothing_of_the_pipeline(lean_python):
    probe = "import importlib.util as u, sys; print(','.join(m for m in sys.argv[1:] if u.find_spec(m)))"
    found = subprocess.run([str(lean_python), "-c", probe, *PIPELINE_ONLY], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == ""


def test_the_lean_service_starts_and_answers(lean_python, tmp_path_factory):
    registry = shared_registry(tmp_path_factory.getbasetemp())
    models = tiny_models(tmp_path_factory.getbasetemp() / "models")
    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": registry.uri, "SERVING_VERIFY_KEY": str(registry.verify_key),
           "SERVING_PARAMS_FILE": str(PROJECT / "params.yaml"), "SERVING_PORT": str(port),
           "SERVING_PREFER_CUDA": "false", "SERVING_MONITOR_SECONDS": "0.5",
           "SERVING_WORKERS": "1"}  # one process: each worker monitors the inputs it answered itself
    scratch = tmp_path_factory.mktemp("lean-run")  # not the project folder: its code must come from the venv
    service = subprocess.Popen([str(lean_python), "-m", "serving"], cwd=scratch, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert service.poll() is None, service.stdout.read()
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the lean service was not ready within 120 s"
            time.sleep(0.5)
        windows = models.test_windows[:3]
        body = {"windows": [[[float(v) for v in step] for step in window.T] for window in windows]}
        answer = httpx.post(f"{url}/v1/sensor/predict", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        expected = SensorPredictor(models.good_sensor, models.sensor_card, prefer_cuda=False).predict(windows)
        got = [p["failure_probability"] for p in answer.json()["predictions"]]
        np.testing.assert_allclose(got, expected["probability"], rtol=1e-5)
        molecule = httpx.post(f"{url}/v1/molecule/predict", json={"smiles": ["CCO", "not a molecule"]}, timeout=30)
        assert molecule.status_code == 200, molecule.text
        first, second = molecule.json()["predictions"]
        assert np.isfinite(first["value"]) and "could not parse" in second["error"]
        assert first["in_domain"] is True and first["nearest_similarity"] == 1.0  # ethanol is a training molecule
        origin = httpx.get(f"{url}/v1/models", timeout=10).json()
        assert {m["family"] for m in origin["models"]} == {"sensor", "molecule"}
        deadline = time.monotonic() + 60
        while True:  # the figures are computed in the background, once the models are loaded
            sensor = httpx.get(f"{url}/v1/monitoring", timeout=10).json()["families"].get("sensor", {})
            if "input_drift" in sensor:
                break
            assert time.monotonic() < deadline, sensor
            time.sleep(0.5)
        assert sensor["reference"] and [c["channel"] for c in sensor["input_drift"]["channels"]] == CHANNELS
    finally:
        service.send_signal(signal.SIGTERM)
        service.wait(timeout=30)
