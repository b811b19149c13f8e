"""Scale-out of the sensor flows in a tiny workspace: the tune stage's grid trials as parallel tasks on a local Dask
cluster of two workers (prefect-dask) and on threads, and the fine-tuning stage under torchrun (DDP)."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from mlflow import MlflowClient

from flows.params import write_overrides
from tests.integration.workspace import TINY, clone_workspace, merged, run

pytestmark = pytest.mark.integration

# model.hidden changes the weights' shapes: the trials train from scratch
GRID = {"finetune.lr": {"choices": [0.001, 0.003]}, "model.hidden": {"choices": [8, 12]}}
TUNE = {"trials": 8, "sampler": "grid", "pruner": "none", "parallel": 2, "space": GRID}  # no pruning: order-free


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, finished_workspace):
    """Prepared windows and a pretrained encoder (a clone of the finished workspace)."""
    root = clone_workspace(finished_workspace, tmp_path_factory.mktemp("scale_out") / "ws",
                           merged(TINY, {"sensor": {"finetune": {"use_pretrained": False}}}))
    write_overrides(root / "params.yaml", {"sensor.tune": TUNE})  # the grid alone, not merged into the default space
    return root


def _trials(root) -> dict[str, tuple[float, str]]:
    """The newest tuning's trials: their settings (JSON) -> (validation PR-AUC, worker)."""
    trials = json.loads((root / "artifacts" / "sensor" / "tune" / "trials.json").read_text())
    return {json.dumps(t["params"], sort_keys=True): (t["value"], t["worker"]) for t in trials}


def test_tune_trials_run_on_a_dask_cluster_with_the_same_results_as_threads(workspace):
    run(workspace, sys.executable, "-m", "flows.stages.tune", "sensor")
    on_threads = _trials(workspace)
    write_overrides(workspace / "params.yaml", {"orchestration.task_runner": "dask", "orchestration.dask_workers": 2})
    result = run(workspace, sys.executable, "-m", "flows.stages.tune", "sensor")
    on_dask = _trials(workspace)
    assert sorted(on_dask) == sorted(on_threads) and len(on_threads) == 4  # the grid, each point once (trials: 8)
    assert len({worker for _, worker in on_threads.values()}) == 1  # the flow's own process
    dask_workers = {worker for _, worker in on_dask.values()}
    assert len(dask_workers) == 2 and not dask_workers & {worker for _, worker in on_threads.values()}
    for point, (score, _) in on_threads.items():
        assert on_dask[point][0] == pytest.approx(score, abs=1e-6)  # the same flow, another runner
    assert "val_pr_auc" in result.stdout  # the ranked table


def test_finetune_stage_trains_data_parallel_under_torchrun(workspace):
    run(workspace, sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "flows.stages.finetune", "sensor")
    client = MlflowClient(tracking_uri=f"sqlite:///{workspace / 'mlflow' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("sensor").experiment_id
    runs = client.search_runs([experiment], "tags.stage = 'finetune'")
    assert [r.data.tags["processes"] for r in runs] == ["2"]  # rank 0 alone logs
    saved = torch.load(workspace / "artifacts" / "sensor" / "finetuned.pt", map_location="cpu", weights_only=True)
    assert len(saved["members"]) == TINY["sensor"]["finetune"]["ensemble_size"]
    assert all(len(history) >= 1 for history in saved["histories"])
    assert not (workspace / "artifacts" / "sensor" / "checkpoints").exists()
