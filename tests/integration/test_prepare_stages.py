"""Prepare stages as Prefect flow runs on the developer datasets, and bad input at the edges."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pandas as pd
import pytest
import yaml
from mlflow import MlflowClient

from tests.integration.workspace import PROJECT, merged, run, workspace_env

pytestmark = pytest.mark.integration


def write_params(root, overrides) -> str:
    params = merged(yaml.safe_load((PROJECT / "params.yaml").read_text()), overrides)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return str(root / "params.yaml")


def test_molecule_prepare_on_esol_scaffold_split(shared_data, tmp_path, monkeypatch):
    from flows.stages.prepare import prepare

    monkeypatch.chdir(tmp_path)
    params = write_params(tmp_path, {"molecule": {"data": {
        "source": "file", "path": str(shared_data / "esol" / "delaney-processed.csv"),
        "target_column": "measured log solubility in mols per litre", "duplicates": "keep"}}})
    report = prepare("molecule", params_file=params)
    sizes = {name: len(pd.read_csv(tmp_path / "data/prepared/molecule" / f"{name}.csv")) for name in ("train", "val", "test")}
    assert sizes == {"train": 902, "val": 113, "test": 113}  # the ANCHORS protocol
    assert report["invalid"]["count"] == 0
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    (prepare_run,) = client.search_runs([client.get_experiment_by_name("molecule").experiment_id])
    assert prepare_run.data.tags["data.molecule.dvc_md5"].endswith(".dir")
    assert prepare_run.data.metrics["n_train"] == 902


def test_sensor_prepare_on_cmapss_fd001(shared_data, tmp_path, monkeypatch):
    from flows.stages.prepare import prepare

    monkeypatch.chdir(tmp_path)
    params = write_params(tmp_path, {"sensor": {"data": {
        "source": "cmapss", "path": str(shared_data / "cmapss_fd001" / "train_FD001.txt.gz"),
        "window": 30, "stride": 1, "horizon": 30, "split": "unit", "unit_order": "sorted"}}})
    prepare("sensor", params_file=params)
    with np.load(tmp_path / "data/prepared/sensor/test.npz") as test:
        assert test["X"].shape[0] == 2856 and int(test["y"].sum()) == 465  # the ANCHORS protocol
        assert set(np.unique(test["unit"])) == {f"e{i:03d}" for i in range(86, 101)}
    meta = json.loads((tmp_path / "data/prepared/sensor/meta.json").read_text())
    assert {"op_setting_3", "s1", "s18", "s19"} <= set(meta["report"]["dropped_channels"])


def test_rows_without_a_label_reach_fine_tuning_as_unlabelled_windows(tmp_path, monkeypatch):
    """A file whose label cells are blank for part of a training unit: the prepare flow keeps those windows as
    unlabelled ones, and fine-tuning loads them featurised like the labelled ones."""
    from flows.params import load_params
    from flows.sensor.family import FAMILY
    from flows.stages.prepare import prepare

    rng = np.random.default_rng(0)
    rows = [{"machine": f"m{u}", "t": t, "temp": 20.0 + t * (u % 2) + rng.normal(), "flow": rng.normal(),
             "failed": float(t == 59 and u % 2), "split": ["train", "train", "train", "train", "val", "val", "test",
                                                           "test"][u]}
            for u in range(8) for t in range(60)]
    frame = pd.DataFrame(rows)
    frame.loc[(frame["machine"] == "m0") & (frame["t"] < 30), "failed"] = np.nan
    csv = tmp_path / "fleet.csv"
    frame.to_csv(csv, index=False)
    monkeypatch.chdir(tmp_path)
    params = write_params(tmp_path, {"sensor": {"data": {
        "source": "file", "path": str(csv), "unit_column": "machine", "time_column": "t", "label_column": "failed",
        "split": "column", "window": 8, "stride": 2, "horizon": 4}}})
    prepare("sensor", params_file=params)
    with np.load(tmp_path / "data/prepared/sensor/unlabelled.npz") as unlabelled:
        assert len(unlabelled["y"]) > 0 and (unlabelled["y"] == -1).all()
        assert set(unlabelled["unit"]) == {"m0"} and unlabelled["time"].max() < 30
        n_unlabelled = len(unlabelled["y"])
    report = json.loads((tmp_path / "data/prepared/sensor/meta.json").read_text())["report"]
    assert report["unlabelled_train_windows"] == report["windows_without_label"]["train"] == n_unlabelled
    cfg = load_params(params).sensor
    windows = FAMILY.finetune_data(cfg.model_copy(update={"finetune": cfg.finetune.model_copy(
        update={"use_pretrained": False})}), in_flow=False).data
    assert windows.unlabelled_x.shape == (n_unlabelled, *windows.train_x.shape[1:])
    assert np.isfinite(windows.unlabelled_x).all()


def test_bad_sensor_file_stops_the_stage_naming_file_and_column_and_keeps_old_outputs(tmp_path):
    rows = [{"machine": f"m{u}", "t": t, "temp": "hot" if t == 3 else 20.0 + t, "failed": int(t == 9)}
            for u in range(6) for t in range(10)]
    csv = tmp_path / "fleet.csv"
    pd.DataFrame(rows).to_csv(csv, index=False)
    write_params(tmp_path, {"sensor": {"data": {"source": "file", "path": str(csv), "unit_column": "machine",
                                                "time_column": "t", "label_column": "failed",
                                                "sensor_columns": ["temp"], "window": 4, "stride": 1}}})
    earlier = tmp_path / "data" / "prepared" / "sensor" / "meta.json"
    earlier.parent.mkdir(parents=True)
    earlier.write_text("{}")
    result = run(tmp_path, sys.executable, "-m", "flows.stages.prepare", "sensor", "--params", "params.yaml", check=False)
    assert result.returncode == 2
    assert "fleet.csv" in result.stderr and "'temp'" in result.stderr and "numeric" in result.stderr
    assert "Traceback" not in result.stderr
    assert earlier.read_text() == "{}"


def test_bad_params_stop_the_stage_naming_the_key(tmp_path):
    write_params(tmp_path, {"molecule": {"finetune": {"epochs": "many"}}})
    result = run(tmp_path, sys.executable, "-m", "flows.stages.prepare", "molecule", check=False)
    assert result.returncode == 2
    assert "molecule.finetune.epochs" in result.stderr and "Traceback" not in result.stderr


def _build_task_state(flow_state) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        task_runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_state.state_details.flow_run_id])))
    (build,) = [t for t in task_runs if t.task_key.startswith("build")]
    return build.state.name


def test_molecule_prepare_reuses_its_cached_result_until_the_source_changes(tmp_path, monkeypatch):
    from flows.stages.prepare import prepare

    monkeypatch.chdir(tmp_path)
    smiles = ["CCO", "CCN", "CCC", "c1ccccc1", "CC(=O)O", "CCCl", "CCBr", "CCCO", "OCCO", "CC(C)O"] * 3
    source = tmp_path / "mols.csv"
    pd.DataFrame({"smiles": smiles, "target": np.arange(30.0)}).to_csv(source, index=False)
    params = write_params(tmp_path, {"molecule": {"data": {"source": "file", "path": str(source), "split": "random",
                                                           "duplicates": "keep"}}})
    first = prepare("molecule", params_file=params, return_state=True)
    source.write_text(source.read_text())  # rewritten, same bytes
    second = prepare("molecule", params_file=params, return_state=True)
    assert [_build_task_state(s) for s in (first, second)] == ["Completed", "Cached"]
    pd.DataFrame({"smiles": smiles, "target": np.arange(30.0) + 1}).to_csv(source, index=False)
    third = prepare("molecule", params_file=params, return_state=True)
    assert _build_task_state(third) == "Completed"
    prepared = pd.concat(pd.read_csv(tmp_path / "data/prepared/molecule" / f"{n}.csv") for n in ("train", "val", "test"))
    assert prepared["target"].min() == 1.0  # the new file's values, not the cached ones


def test_sigterm_stops_molecule_prepare_inside_rdkit(tmp_path):
    """Three 3,000-atom chains (limit raised to 5,000): each Bemis-Murcko scaffold is one RDKit call of a minute
    or more that holds the GIL; SIGTERM still ends the stage within flows/termination.py's grace period."""
    source = tmp_path / "mols.csv"
    smiles = ["C" * 3000, "C" * 3000 + "O", "C" * 3000 + "N", "CCO", "CCN", "c1ccccc1O", "CCCl", "OCCO"]
    pd.DataFrame({"smiles": smiles, "target": np.arange(8.0)}).to_csv(source, index=False)
    write_params(tmp_path, {"molecule": {"data": {"source": "file", "path": str(source), "split": "scaffold",
                                                  "max_heavy_atoms": 5000}}})
    env = {**workspace_env(tmp_path), "PYTHONPATH": str(PROJECT)}
    process = subprocess.Popen([sys.executable, "-m", "flows.stages.prepare", "molecule"], cwd=tmp_path, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    chunks: list[bytes] = []  # raw chunks: a progress bar ends in no newline until its next update
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: process.stderr.read1(4096), b"")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 180  # start-up of the flow run on a busy machine
        while b"scaffolds" not in b"".join(chunks) and time.monotonic() < deadline:
            time.sleep(0.2)  # the scaffolds' progress bar: past the task's start-up and the standardisation
        time.sleep(2)  # inside the first scaffold (a minute or more)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)  # a timeout for the test, not a speed check (grace 3 s)
    finally:
        process.kill()
    reader.join(timeout=5)
    stderr = b"".join(chunks).decode(errors="replace")
    assert process.returncode == 128 + signal.SIGTERM
    assert "0/8" in stderr and "1/8" not in stderr  # stopped inside the first scaffold, not after it
    assert stderr.rstrip().endswith("error: stopped by SIGTERM")
    assert not (tmp_path / "data" / "prepared" / "molecule" / "report.json").exists()
