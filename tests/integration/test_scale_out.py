"""Scale-out of the sensor flows in a tiny workspace: the sweep's trials as parallel tasks on a local Dask
cluster of two workers (prefect-dask) and on threads, and the fine-tuning stage under torchrun (DDP)."""

from __future__ import annotations

import sys

import pytest
import torch
from mlflow import MlflowClient

from flows.params import write_overrides
from tests.integration.test_pipeline import TINY
from tests.integration.workspace import make_workspace, merged, run

pytestmark = pytest.mark.integration

GRID = {"finetune.lr": [0.001, 0.003], "model.hidden": [8, 12]}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """Prepared windows and a pretrained encoder (`dvc repro sensor_pretrain`)."""
    root = make_workspace(tmp_path_factory.mktemp("scale_out"), merged(TINY, {"sensor": {"sweep": {"grid": GRID}}}))
    run(root, "dvc", "repro", "sensor_pretrain")
    return root


def _sweep_trials(root) -> dict[int, tuple[float, str]]:
    """The newest sweep's trials: index -> (validation PR-AUC, worker)."""
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("sensor").experiment_id
    parent = client.search_runs([experiment], "tags.stage = 'sweep'", order_by=["start_time DESC"], max_results=1)[0]
    children = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    return {int(c.info.run_name.rsplit("-", 1)[1]): (c.data.metrics["val_pr_auc"], c.data.tags["worker"])
            for c in children}


def test_sweep_trials_run_on_a_dask_cluster_with_the_same_results_as_threads(workspace):
    run(workspace, sys.executable, "-m", "flows.sensor.sweep")
    on_threads = _sweep_trials(workspace)
    write_overrides(workspace / "params.yaml", {"orchestration.task_runner": "dask", "orchestration.dask_workers": 2})
    result = run(workspace, sys.executable, "-m", "flows.sensor.sweep")
    on_dask = _sweep_trials(workspace)
    assert sorted(on_dask) == sorted(on_threads) == [0, 1, 2, 3]
    assert len({worker for _, worker in on_threads.values()}) == 1  # the flow's own process
    dask_workers = {worker for _, worker in on_dask.values()}
    assert len(dask_workers) == 2 and not dask_workers & {worker for _, worker in on_threads.values()}
    for trial, (score, _) in on_threads.items():
        assert on_dask[trial][0] == pytest.approx(score, abs=1e-6)  # the same flow, another runner
    assert "val_pr_auc" in result.stdout  # the ranked table


def test_finetune_stage_trains_data_parallel_under_torchrun(workspace):
    run(workspace, sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "flows.sensor.finetune")
    client = MlflowClient(tracking_uri=f"sqlite:///{workspace / 'mlflow' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("sensor").experiment_id
    runs = client.search_runs([experiment], "tags.stage = 'finetune'")
    assert [r.data.tags["processes"] for r in runs] == ["2"]  # rank 0 alone logs
    saved = torch.load(workspace / "artifacts" / "sensor" / "finetuned.pt", map_location="cpu", weights_only=True)
    assert len(saved["members"]) == TINY["sensor"]["finetune"]["ensemble_size"]
    assert all(len(history) >= 1 for history in saved["histories"])
    assert not (workspace / "artifacts" / "sensor" / "checkpoints").exists()
