"""The deployments `make ui` serves, on the test session's real Prefect server: registered with their
schedules, runnable through the API with parameters, leaving DVC and MLflow as `dvc repro` would."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import yaml
from mlflow import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId
from prefect.deployments import run_deployment

from tests.integration.workspace import FINISHED, clone_workspace, merged, run, workspace_env

pytestmark = pytest.mark.integration

SCHEDULES = {"data_refresh": "30 1 * * *", "retrain": "0 4 * * 6", "monitor": "15 * * * *", "timezone": "Europe/Berlin"}
NAMES = {"pipeline/sensor", "pipeline/molecule", "data-refresh/nightly", "retrain/weekly", "monitor/hourly",
         "predict/batch"}


def _deployments() -> dict:
    with get_client(sync_client=True) as client:
        return {f"{client.read_flow(d.flow_id).name}/{d.name}": d for d in client.read_deployments()}


@pytest.fixture(scope="module")
def served(tmp_path_factory, finished_workspace):
    """A clone of the finished workspace whose deployments are served by `python -m flows.deployments` (what `make ui`
    runs)."""
    root = clone_workspace(finished_workspace, tmp_path_factory.mktemp("served") / "ws",
                           merged(FINISHED, {"orchestration": {"schedules": SCHEDULES}}))
    log = open(root / "runner.log", "w")
    # the runner looks for runs to start every second (Prefect's default: 10 s)
    env = {**workspace_env(root), "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    runner = subprocess.Popen([sys.executable, "-m", "flows.deployments"], cwd=root, env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not NAMES <= set(_deployments()):
        assert runner.poll() is None and time.monotonic() < deadline, (root / "runner.log").read_text()[-3000:]
        time.sleep(1)
    yield root
    runner.terminate()
    runner.wait(timeout=30)
    log.close()


def _mlflow_runs(root, family: str) -> list:
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(family)
    return client.search_runs([experiment.experiment_id]) if experiment else []


def test_deployments_are_registered_with_the_schedules_from_params(served):
    deployments = _deployments()
    crons = {name: [(s.schedule.cron, s.schedule.timezone) for s in deployments[name].schedules] for name in NAMES}
    assert crons == {"pipeline/sensor": [], "pipeline/molecule": [],
                     "data-refresh/nightly": [("30 1 * * *", "Europe/Berlin")],
                     "retrain/weekly": [("0 4 * * 6", "Europe/Berlin")],
                     "monitor/hourly": [("15 * * * *", "Europe/Berlin")], "predict/batch": []}
    assert not any(deployments[name].paused for name in NAMES)
    batch = deployments["predict/batch"].parameter_openapi_schema
    assert {"family", "input", "output"} <= set(batch["required"])
    assert {"alias", "version", "chunk_rows", "id_column"} <= set(batch["properties"])
    schema = deployments["pipeline/sensor"].parameter_openapi_schema["properties"]
    assert {"family", "data_source", "data_path", "epochs", "seed", "overrides", "force"} <= set(schema)
    assert deployments["pipeline/molecule"].parameters == {"family": "molecule"}


def test_triggered_data_refresh_completes_and_versions_the_prepared_data(served):
    flow_run = run_deployment("data-refresh/nightly", timeout=600, poll_interval=1)
    assert flow_run.state.is_completed(), flow_run.state.message
    lock = yaml.safe_load((served / "dvc.lock").read_text())["stages"]
    assert {"sensor_prepare", "molecule_prepare"} <= set(lock)
    for family in ("sensor", "molecule"):
        runs = _mlflow_runs(served, family)
        assert [r.data.tags["stage"] for r in runs] == ["prepare"]
        assert runs[0].data.tags[f"data.{family}.dvc_md5"] == lock[f"{family}_prepare"]["outs"][0]["md5"]
    assert any((served / ".dvc-storage").rglob("*")), "the refresh did not push the data"
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["data-refresh"])))
    ours = [a for a in artifacts if a.flow_run_id == flow_run.id]
    assert len(ours) == 1 and lock["sensor_prepare"]["outs"][0]["md5"] in ours[0].data


def test_pipeline_run_with_parameters_leaves_what_dvc_repro_would(served):
    flow_run = run_deployment("pipeline/sensor", parameters={"overrides": {"sensor.registry.tolerance": 0.01}},
                              timeout=600, poll_interval=1)
    assert flow_run.state.is_completed(), flow_run.state.message
    assert yaml.safe_load((served / "params.yaml").read_text())["sensor"]["registry"]["tolerance"] == 0.01
    runs = _mlflow_runs(served, "sensor")
    register = next(r for r in runs if r.data.tags["stage"] == "register")
    assert register.data.params["registry.tolerance"] == "0.01"
    # what the override reaches re-ran; the rest of the finished pipeline, the refreshed data too, was up to date
    assert sorted(r.data.tags["stage"] for r in runs) == ["prepare", "register"]
    again = run(served, "dvc", "repro", "sensor_register")
    assert "Running stage" not in again.stdout  # one code path: the UI's run is the command line's
    assert (served / "metrics" / "sensor.json").exists()
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["sensor-register"])))
    assert any(f"/runs/{register.info.run_id})" in a.data for a in artifacts)  # the stage run links its MLflow run


def test_bad_parameters_fail_the_run_and_leave_params_untouched(served):
    before = (served / "params.yaml").read_text()
    flow_run = run_deployment("pipeline/sensor", parameters={"overrides": {"sensor.finetune.epochz": 2}},
                              timeout=300, poll_interval=1)
    assert flow_run.state.is_failed()
    with get_client(sync_client=True) as client:
        task_runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])))
    failed = [t for t in task_runs if t.state.is_failed()]
    assert [t.name.split("-")[0] for t in failed] == ["apply"]
    assert failed[0].run_count == 1  # bad input is not retried
    assert (served / "params.yaml").read_text() == before
