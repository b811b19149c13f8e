"""Orchestration under load: the ephemeral server's start-up timeout, one pipeline run at a time, and
MLflow runs of killed stages marked FAILED."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from flows.config import TrackingConfig
from flows.locking import PipelineBusyError, acquire, lock_path
from flows.tracking import fail_orphaned_runs, owner_tags, stage_run

PROJECT = Path(__file__).resolve().parents[2]
TIMEOUT_VARIABLE = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
PRINT_TIMEOUT = ("import flows; from prefect.settings import get_current_settings; "
                 "print(get_current_settings().server.ephemeral.startup_timeout_seconds)")


def _python(code: str, cwd: Path, **env: str) -> subprocess.Popen:
    environ = {k: v for k, v in os.environ.items() if k != TIMEOUT_VARIABLE}
    environ["PYTHONPATH"] = str(PROJECT)
    return subprocess.Popen([sys.executable, "-c", code], cwd=cwd, env={**environ, **env}, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_a_stage_waits_120_s_for_prefects_ephemeral_server():
    process = _python(PRINT_TIMEOUT, PROJECT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert out.strip() == "120"


def test_the_environment_sets_another_ephemeral_timeout():
    process = _python(f"import flows, os; print(os.environ['{TIMEOUT_VARIABLE}'])", PROJECT, **{TIMEOUT_VARIABLE: "300"})
    out, err = process.communicate(timeout=60)
    assert out.strip() == "300", err


@pytest.fixture
def holder(tmp_path, monkeypatch):
    """Another process holding the pipeline lock of the workspace tmp_path (this test's cwd)."""
    monkeypatch.chdir(tmp_path)
    process = _python("import sys; from flows.locking import pipeline_lock\n"
                      "with pipeline_lock():\n    print('held', flush=True); sys.stdin.read()", tmp_path)
    assert process.stdout.readline().strip() == "held", process.stderr.read()
    yield process
    process.kill()
    process.wait()


def test_a_second_run_is_refused_naming_the_holder(holder):
    with pytest.raises(PipelineBusyError, match=rf"another pipeline run holds {lock_path()} \(pid {holder.pid} "
                                                r"since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\); wait for it"):
        acquire()


def test_a_stage_entry_refuses_in_one_line_with_status_3(holder, tmp_path):
    stage = _python("from flows.locking import hold_for_stage; hold_for_stage(); print('ran')", tmp_path)
    out, err = stage.communicate(timeout=60)
    assert stage.returncode == 3 and out == ""
    assert err.strip().count("\n") == 0 and f"another pipeline run holds {lock_path()} (pid {holder.pid}" in err


def test_a_stage_started_by_the_holder_goes_ahead(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    child = "from flows.locking import hold_for_stage; hold_for_stage(); print('ran')"
    parent = _python("import subprocess, sys\nfrom flows.locking import pipeline_lock\nwith pipeline_lock():\n"
                     f"    sys.exit(subprocess.run([sys.executable, '-c', {child!r}]).returncode)", tmp_path)
    out, err = parent.communicate(timeout=60)
    assert parent.returncode == 0 and out.strip() == "ran", err


def test_the_lock_of_a_killed_run_is_free(holder):
    holder.kill()
    holder.wait()
    lock = acquire()
    assert lock is not None
    lock.close()


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A real MLflow SQLite store in tmp_path, the tracking URI of this process."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
    client = MlflowClient()
    return client, client.create_experiment("sensor", artifact_location=(tmp_path / "artifacts").as_uri())


def _dead_process_tags() -> dict[str, str]:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return {**owner_tags(), "owner.pid": str(process.pid)}


def test_a_running_run_of_a_dead_process_is_marked_failed_a_live_ones_is_not(store):
    client, experiment = store
    killed = client.create_run(experiment, run_name="sensor.finetune", tags=_dead_process_tags()).info.run_id
    child = client.create_run(experiment, tags={"mlflow.parentRunId": killed}).info.run_id
    alive = client.create_run(experiment, run_name="sensor.pretrain", tags=owner_tags()).info.run_id
    reused_pid = client.create_run(experiment, tags={**owner_tags(), "owner.started": "12.00"}).info.run_id

    assert sorted(fail_orphaned_runs(client)) == sorted([killed, child, reused_pid])
    for run_id in (killed, child):
        run = client.get_run(run_id)
        assert run.info.status == "FAILED"
        assert run.data.tags["killed"] == f"process {client.get_run(killed).data.tags['owner.pid']} on " \
                                          f"{socket.gethostname()} is gone"
    assert client.get_run(alive).info.status == "RUNNING" and "killed" not in client.get_run(alive).data.tags


def test_the_next_stage_run_fails_the_orphans_and_records_its_owner(store):
    client, experiment = store
    killed = client.create_run(experiment, run_name="sensor.finetune", tags=_dead_process_tags()).info.run_id
    with stage_run(TrackingConfig(), "molecule", "prepare", {"a": 1}) as run:
        pass
    assert client.get_run(killed).info.status == "FAILED"
    finished = client.get_run(run.info.run_id)
    assert finished.info.status == "FINISHED" and finished.data.tags["owner.pid"] == str(os.getpid())
    assert finished.data.tags["stage"] == "prepare" and finished.data.params["a"] == "1"
