"""MLflow tracking: one experiment per model family, one run per stage, lineage on every run."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow
import psutil
from mlflow import MlflowClient
from mlflow.entities import Run, RunStatus
from prefect.artifacts import create_markdown_artifact
from prefect.context import FlowRunContext

from contract.registry import TRACKING_URI_VARIABLE, resolve_tracking_uri, sqlite_file
from flows._environment import workspace
from flows.config import TrackingConfig
from flows.lineage import dataset_tags, git_commit


def tracking_uri(cfg: TrackingConfig) -> str:
    """MLFLOW_TRACKING_URI if set; else cfg.uri with a relative sqlite path made workspace-absolute (its folder
    is created: the pipeline creates the store, a service never does)."""
    uri = resolve_tracking_uri(cfg.uri, workspace())
    database = sqlite_file(uri)
    if database is not None:
        database.parent.mkdir(parents=True, exist_ok=True)
    return uri


def signing_key(cfg: TrackingConfig) -> Path:
    """The private key that signs registered versions (relative paths are inside the workspace)."""
    return workspace() / cfg.signing_key


def artifact_location(cfg: TrackingConfig, family: str) -> str:
    """Artifact root of a family's experiment (a URI; relative paths are inside the workspace)."""
    root = cfg.artifact_root
    if "://" in root:
        return f"{root.rstrip('/')}/{family}"
    return (workspace() / root / family).resolve().as_uri()


def use_tracking(cfg: TrackingConfig) -> None:
    """Point this process's MLflow client at the project's store.

    MLflow also exports the URI as MLFLOW_TRACKING_URI; that is undone, so the variable keeps meaning what the
    user set: otherwise a second `use_tracking` in the same process (a served deployment, a test session)
    would resolve to the first store."""
    users_uri = os.environ.get(TRACKING_URI_VARIABLE)
    mlflow.set_tracking_uri(tracking_uri(cfg))
    if users_uri is None:
        os.environ.pop(TRACKING_URI_VARIABLE, None)
    else:
        os.environ[TRACKING_URI_VARIABLE] = users_uri


# MLflow 3's UI shows an experiment as model training or as GenAI (traces, prompts) by this tag
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING_KIND = "custom_model_development"


def experiment_id(cfg: TrackingConfig, family: str) -> str:
    """The family's experiment, created on first use with its artifact location, as a model-training experiment
    (`mlflow.experimentKind`; an existing experiment without the tag gets it, a kind chosen in the UI stays)."""
    use_tracking(cfg)
    client = MlflowClient()
    experiment = client.get_experiment_by_name(family)
    if experiment is None:
        return client.create_experiment(family, artifact_location=artifact_location(cfg, family),
                                        tags={EXPERIMENT_KIND_TAG: TRAINING_KIND})
    if EXPERIMENT_KIND_TAG not in experiment.tags:
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, TRAINING_KIND)
    return experiment.experiment_id


def flatten(prefix: str, value: Any) -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'prefix.a.b': 1}, for mlflow.log_params."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(flatten(f"{prefix}.{key}" if prefix else str(key), item))
        return out
    return {prefix: value}


@contextlib.contextmanager
def stage_run(
    cfg: TrackingConfig,
    family: str,
    stage: str,
    params: dict[str, Any],
    datasets: dict[str, Path] | None = None,
) -> Iterator[mlflow.ActiveRun]:
    """An MLflow run named `<family>.<stage>` with params, the git commit and dataset lineage tags.

    It starts when the stage's flow run started (so its duration covers the work before this call) and
    carries its owner process (`owner_tags`); runs left RUNNING by a killed stage are marked FAILED first.
    """
    experiment = experiment_id(cfg, family)
    fail_orphaned_runs(MlflowClient())
    flow_run = FlowRunContext.get()
    start_ms = int(flow_run.start_time.timestamp() * 1000) if flow_run is not None else None
    created = MlflowClient().create_run(experiment, start_time=start_ms, run_name=f"{family}.{stage}",
                                        tags=owner_tags())
    with mlflow.start_run(run_id=created.info.run_id) as run:
        mlflow.set_tags({"family": family, "stage": stage, "git_commit": git_commit()})
        for name, path in (datasets or {}).items():
            mlflow.set_tags(dataset_tags(name, path))
        mlflow.log_params({k: str(v)[:6000] for k, v in flatten("", params).items()})
        yield run
    publish_run_artifact(cfg, family, stage, run.info.run_id)


def _process_started(pid: int) -> float:
    """When process `pid` started (seconds since the epoch), as the OS reports it."""
    return psutil.Process(pid).create_time()


def owner_tags() -> dict[str, str]:
    """Tags naming the process that owns a run: host, pid and the process's start time (a pid can be reused)."""
    return {"owner.host": socket.gethostname(), "owner.pid": str(os.getpid()),
            "owner.started": f"{_process_started(os.getpid()):.2f}"}


def _owner_alive(tags: dict[str, str]) -> bool:
    """Whether the process named by `owner_tags` still runs (on this host)."""
    try:
        return abs(_process_started(int(tags["owner.pid"])) - float(tags["owner.started"])) < 1
    except psutil.NoSuchProcess:
        return False
    except (KeyError, ValueError, psutil.Error):
        return True  # no usable owner tags, or a process we may not inspect: leave the run alone


def fail_orphaned_runs(client: MlflowClient) -> list[str]:
    """Mark as FAILED every RUNNING run owned by a process of this host that is gone (a stage killed mid-run),
    and its RUNNING child runs, each tagged `killed: process <pid> on <host> is gone`. Returns their ids."""
    host = socket.gethostname()
    experiments = [e.experiment_id for e in client.search_experiments()]
    running = f"attributes.status = 'RUNNING' and tags.`owner.host` = '{host}'"
    failed = []
    for run in client.search_runs(experiments, filter_string=running, max_results=1000) if experiments else []:
        if _owner_alive(run.data.tags):
            continue
        reason = f"process {run.data.tags['owner.pid']} on {host} is gone"
        children = client.search_runs(
            [run.info.experiment_id], max_results=1000,
            filter_string=f"attributes.status = 'RUNNING' and tags.`mlflow.parentRunId` = '{run.info.run_id}'")
        for orphan in [*children, run]:
            client.set_tag(orphan.info.run_id, "killed", reason)
            client.set_terminated(orphan.info.run_id, RunStatus.to_string(RunStatus.FAILED))
            failed.append(orphan.info.run_id)
    return failed


def run_link(cfg: TrackingConfig, run: Run) -> str:
    """The run's page in the MLflow UI."""
    return f"{cfg.ui_url.rstrip('/')}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"


def publish_run_artifact(cfg: TrackingConfig, family: str, stage: str, run_id: str) -> None:
    """A Prefect artifact on the current flow run: the MLflow run's metrics as a markdown table and a link
    to it. Nothing outside a flow run (e.g. in benchmarks)."""
    if FlowRunContext.get() is None:
        return
    run = mlflow.get_run(run_id)
    rows = "\n".join(f"| {name} | {value:.6g} |" for name, value in sorted(run.data.metrics.items()))
    table = f"| metric | value |\n|---|---|\n{rows}" if rows else "_no metrics logged_"
    create_markdown_artifact(
        f"### {family} {stage}\n\n{table}\n\nMLflow run: [{run.info.run_name}]({run_link(cfg, run)})",
        key=f"{family}-{stage}", description=f"{family} {stage}: metrics and MLflow run",
    )


def log_json(obj: Any, artifact_file: str) -> None:
    """Log a JSON-serialisable object as a run artifact."""
    mlflow.log_text(json.dumps(obj, indent=2, sort_keys=True, default=str), artifact_file)
