"""Batch scoring (flows/predict.py) through Prefect on the tests' registry of tiny real models: every input row keeps
its place (a bad one with its error), the answers equal the service's for the same inputs, and a job killed in the
middle, started again, continues from its finished chunks to the same output bytes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import yaml
from fastapi.testclient import TestClient

from flows.predict import JOBS, predict
from serving.app import create_app
from serving.settings import ServingSettings
from tests.conftest import PROJECT_ROOT
from tests.integration.test_serving_registry import CHANNELS, WINDOW, sensor_windows, shared_registry

pytestmark = pytest.mark.integration
SMILES = ["CCO", "c1ccccc1O", "not a molecule", "CC(=O)Nc1ccc(O)cc1", "C1CC1N", "CCCCCCCC(=O)O", "O=C(O)c1ccccc1",
          "CN1CCC[C@H]1c1cccnc1"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A folder whose params.yaml points at the shared tiny registry (its store and signing key)."""
    registry = shared_registry(tmp_path_factory.getbasetemp())
    root = tmp_path_factory.mktemp("batch")
    (root / "params.yaml").write_text(yaml.safe_dump({"tracking": {
        "uri": registry.uri, "signing_key": str(registry.verify_key.with_suffix(".key")),
        "artifact_root": str(root / "artifacts")}}))
    return root


def service_answers(workspace, family: str, body: dict) -> list[dict]:
    settings = ServingSettings(params_file=str(workspace / "params.yaml"), prediction_log=False, prefer_cuda=False)
    with TestClient(create_app(settings)) as client:
        answer = client.post(f"/v1/{family}/predict", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()["predictions"]


def test_molecules_keep_their_rows_and_ids_and_get_the_services_answers(workspace, monkeypatch):
    monkeypatch.chdir(workspace)
    pd.DataFrame({"compound": [f"m{i}" for i in range(len(SMILES))], "smiles": SMILES}).to_csv(
        workspace / "molecules.csv", index=False)
    summary = predict("molecule", str(workspace / "molecules.csv"), str(workspace / "scored.parquet"),
                      chunk_rows=3, id_column="compound", params_file=str(workspace / "params.yaml"))
    scored = pd.read_parquet(workspace / "scored.parquet")
    assert scored["compound"].tolist() == [f"m{i}" for i in range(len(SMILES))]
    assert scored["smiles"].tolist() == SMILES
    assert (summary["rows"], summary["errors"], summary["chunks"]) == (len(SMILES), 1, 3)
    bad = scored.iloc[2]
    assert np.isnan(bad["prediction"]) and "not a molecule" in bad["error"]
    assert set(scored["model_version"]) == {"1"} and set(scored["model_name"]) == {summary["model_name"]}
    served = service_answers(workspace, "molecule", {"smiles": SMILES})
    good = [i for i in range(len(SMILES)) if i != 2]
    np.testing.assert_allclose(scored["prediction"].to_numpy()[good], [served[i]["value"] for i in good], rtol=1e-6)
    np.testing.assert_allclose(scored["uncertainty"].to_numpy()[good], [served[i]["uncertainty"] for i in good],
                               rtol=1e-6)
    assert not (workspace / JOBS).exists() or not any((workspace / JOBS).iterdir())  # finished: no chunks kept


def readings() -> pd.DataFrame:
    """Long-format readings of three units: 40 and 30 steps, and one with fewer than a window."""
    frames = []
    for unit, steps, seed in (("pump-a", 40, 1), ("pump-b", 5, 2), ("pump-c", 30, 3)):
        values = sensor_windows(1, seed=seed)[0].repeat(3, axis=1)[:, :steps].T  # (steps, C)
        frames.append(pd.DataFrame({"unit": unit, "time": np.arange(steps), **dict(zip(CHANNELS, values.T))}))
    return pd.concat(frames, ignore_index=True)


def test_sensor_readings_are_cut_into_windows_per_unit_and_scored_as_the_service_scores_them(workspace, monkeypatch):
    monkeypatch.chdir(workspace)
    frame = readings()
    frame.to_parquet(workspace / "readings.parquet")
    summary = predict("sensor", str(workspace / "readings.parquet"), str(workspace / "windows.csv"), stride=4,
                      chunk_rows=35, params_file=str(workspace / "params.yaml"))
    scored = pd.read_csv(workspace / "windows.csv")
    # windows end at each unit's last reading and every 4th before it; pump-b is too short for one
    expected_ends = {"pump-a": list(range(39 - 4 * ((39 - WINDOW + 1) // 4), 40, 4)),
                     "pump-c": list(range(29 - 4 * ((29 - WINDOW + 1) // 4), 30, 4))}
    for unit, ends in expected_ends.items():
        assert scored.loc[scored.unit == unit, "time"].tolist() == ends
    short = scored[scored.unit == "pump-b"]
    assert len(short) == 1 and "5 readings, fewer than the model's window" in short.iloc[0]["error"]
    assert summary["errors"] == 1 and summary["chunks"] == 2
    ok = scored[scored.error.isna()]
    windows = [frame[(frame.unit == row.unit) & (frame.time > row.time - WINDOW) & (frame.time <= row.time)]
               [CHANNELS].to_numpy().tolist() for row in ok.itertuples()]
    served = service_answers(workspace, "sensor", {"windows": windows})
    np.testing.assert_allclose(ok["probability"].to_numpy(), [p["failure_probability"] for p in served], rtol=1e-5)


def test_a_job_killed_in_the_middle_continues_from_its_finished_chunks_to_the_same_bytes(workspace, tmp_path):
    many = pd.DataFrame({"smiles": SMILES * 40})
    many.to_csv(tmp_path / "many.csv", index=False)
    params = str(workspace / "params.yaml")
    command = [sys.executable, "-m", "flows.predict", "molecule", "--input", str(tmp_path / "many.csv"),
               "--chunk-rows", "8", "--params", params]
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}

    def run(output: str) -> subprocess.CompletedProcess:
        return subprocess.run([*command, "--output", output], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)

    whole = run(str(tmp_path / "whole.parquet"))
    assert whole.returncode == 0, whole.stderr[-3000:]
    job = subprocess.Popen([*command, "--output", str(tmp_path / "resumed.parquet")], cwd=tmp_path, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while len(list((tmp_path / JOBS).glob("*/*.parquet"))) < 2:  # two of its 40 chunks are done
        assert job.poll() is None and time.monotonic() < deadline, "the job ended before it could be killed"
        time.sleep(0.05)
    os.killpg(job.pid, signal.SIGKILL)
    job.wait(timeout=60)
    assert not (tmp_path / "resumed.parquet").exists()
    again = run(str(tmp_path / "resumed.parquet"))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "kept from before" in again.stdout
    assert (tmp_path / "resumed.parquet").read_bytes() == (tmp_path / "whole.parquet").read_bytes()


def test_a_missing_column_or_version_is_refused_in_one_line(workspace, tmp_path):
    pd.DataFrame({"name": ["CCO"]}).to_csv(tmp_path / "no_smiles.csv", index=False)
    params = str(workspace / "params.yaml")
    for arguments, message in ((["--input", str(tmp_path / "no_smiles.csv")], "no column smiles (columns: name)"),
                               (["--input", str(tmp_path / "missing.csv")], "missing.csv: no such file"),
                               (["--input", str(tmp_path / "no_smiles.csv"), "--version", "99"], "has no version 99")):
        done = subprocess.run([sys.executable, "-m", "flows.predict", "molecule", *arguments, "--output",
                               str(tmp_path / "out.parquet"), "--params", params], cwd=tmp_path, capture_output=True,
                              text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert not (tmp_path / "out.parquet").exists()


def test_chunks_on_a_dask_cluster_give_the_same_output_as_on_threads(workspace, tmp_path, monkeypatch):
    from flows.config import OrchestrationConfig
    from flows.runners import task_runner

    monkeypatch.chdir(tmp_path)
    pd.DataFrame({"smiles": SMILES * 3}).to_csv(tmp_path / "molecules.csv", index=False)
    params = str(workspace / "params.yaml")
    predict("molecule", str(tmp_path / "molecules.csv"), str(tmp_path / "threads.parquet"), chunk_rows=5,
            params_file=params)
    on_dask = predict.with_options(task_runner=task_runner(OrchestrationConfig(task_runner="dask", dask_workers=2)))
    summary = on_dask("molecule", str(tmp_path / "molecules.csv"), str(tmp_path / "dask.parquet"), chunk_rows=5,
                      params_file=params)
    assert summary["chunks"] == 5 and summary["errors"] == 3
    assert (tmp_path / "dask.parquet").read_bytes() == (tmp_path / "threads.parquet").read_bytes()
