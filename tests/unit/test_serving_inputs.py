"""Checks of prediction inputs against the model card, and the service's import footprint."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient

from contract.manifest import load_signing_key
from serving.families.molecule import check_smiles
from serving.families.sensor.inputs import sensor_windows
from serving.inputs import BadInput, check_count

CHANNELS, STEPS = ["a", "b"], 3


def test_windows_become_time_by_channel_arrays_with_nan_for_null():
    (window,) = sensor_windows([[[1.0, None], [2.0, 3.0], [4.0, 5.0]]], CHANNELS, STEPS)
    assert window.shape == (3, 2) and window.dtype == np.float32
    assert np.isnan(window[0, 1]) and window[2, 0] == 4.0


@pytest.mark.parametrize(("windows", "message"), [
    ([[[1.0, 2.0]] * 2], "windows[0] has 2 time steps; this model needs exactly 3"),
    ([[[1.0, 2.0]] * 3, [[1.0, 2.0], [1.0], [1.0, 2.0]]], "windows[1][1] has 1 values; this model needs 2 channels"),
])
def test_wrong_shapes_are_named(windows, message):
    with pytest.raises(BadInput, match=message.replace("[", r"\[").replace("]", r"\]")):
        sensor_windows(windows, CHANNELS, STEPS)


def test_limits():
    check_count(8, 8, "windows")
    with pytest.raises(BadInput, match="9 windows in one request; at most 8"):
        check_count(9, 8, "windows")
    with pytest.raises(BadInput, match=r"smiles\[1\] is 6 characters long; at most 5"):
        check_smiles(["CCO", "CCCCCC"], 5)


def test_the_service_runs_without_the_pipeline(tmp_path):
    """On an empty store, without importing torch, Prefect, DVC, onnx or the pipeline's code."""
    store = f"sqlite:///{tmp_path / 'empty.db'}"
    MlflowClient(store).search_experiments()  # an empty store: the service never creates one
    load_signing_key(tmp_path / "signing.key")
    code = (
        "import sys\n"
        "from fastapi.testclient import TestClient\n"
        "from serving.__main__ import main\n"
        "from serving.app import create_app\n"
        "with TestClient(create_app()) as client:\n"
        "    assert client.get('/health').status_code == 200\n"
        "    assert client.get('/ready').status_code == 503\n"
        "loaded = {name.split('.')[0] for name in sys.modules}\n"
        "assert not loaded & {'torch', 'prefect', 'dvc', 'onnx', 'flows'}, loaded & {'torch', 'prefect', 'dvc', 'onnx', 'flows'}\n"
    )
    env = {"MLFLOW_TRACKING_URI": store, "SERVING_VERIFY_KEY": str(tmp_path / "signing.pub"), "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path), "SERVING_PREFER_CUDA": "false"}
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
