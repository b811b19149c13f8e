"""`python -m flows.sensor.sweep`: a grid search over the sensor fine-tuning (`sensor.sweep.grid`).

Each trial trains one member from scratch (so model sizes may vary) on the prepared windows (run
`dvc repro sensor_prepare` first) and is scored by its best validation PR-AUC. Trials are parallel
Prefect tasks on the `orchestration` task runner: threads, or a Dask cluster with prefect-dask.
MLflow: a parent run `sensor.sweep` with a nested run per trial; Prefect: a table artifact ranking the
trials. params.yaml is left as it is: copy the winning values into it.
"""

from __future__ import annotations

import itertools
import os
import socket
from typing import Any

import mlflow
from prefect import flow
from prefect.artifacts import create_table_artifact
from tabulate import tabulate

from flows.params import load_params, with_overrides
from flows.paths import SENSOR
from flows.sensor.finetune import load_inputs
from flows.tasks import compute_task, stage_cli
from flows.tracking import stage_run
from models.device import pick_device
from models.sensor.training import finetune_member


def grid_trials(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """{"a": [1, 2], "b": [3]} -> [{"a": 1, "b": 3}, {"a": 2, "b": 3}] (the product, in grid order)."""
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


@compute_task(name="sweep-trial", task_run_name="trial-{index}")
def run_trial(index: int, overrides: dict[str, Any], train_x, train_y, val_x, val_y, model_cfg, finetune_cfg) -> dict:
    """One grid point: (n, 2C, T) windows in, its validation score and where it ran out."""
    _, result = finetune_member(train_x, train_y, val_x, val_y, model_cfg, finetune_cfg, None, finetune_cfg.seed,
                                pick_device())
    return {"trial": index, **overrides, "val_pr_auc": result.best_score, "best_epoch": result.best_epoch,
            "worker": f"{socket.gethostname()}:{os.getpid()}"}


@flow(name="sensor-sweep")
def sensor_sweep(params_file: str = "params.yaml") -> list[dict]:
    """Train and score every trial of the grid in parallel; returns the trials, best first."""
    params = load_params(params_file)
    grid = params.sensor.sweep.grid
    trials = grid_trials(grid)
    # every trial's settings are validated before anything trains
    configs = [with_overrides(params, {f"sensor.{k}": v for k, v in trial.items()}).sensor for trial in trials]
    inputs = load_inputs(use_pretrained=False)
    futures = [run_trial.submit(i, trial, inputs.train_x, inputs.train_y, inputs.val_x, inputs.val_y, cfg.model,
                                cfg.finetune) for i, (trial, cfg) in enumerate(zip(trials, configs))]
    results = sorted((future.result() for future in futures), key=lambda r: -r["val_pr_auc"])
    with stage_run(params.tracking, "sensor", "sweep", {"grid": grid}, {"sensor": SENSOR.prepared}) as parent:
        for result in results:
            with mlflow.start_run(run_name=f"sensor.sweep.trial-{result['trial']}", nested=True,
                                  experiment_id=parent.info.experiment_id):
                mlflow.log_params({key: result[key] for key in grid})
                mlflow.log_metrics({"val_pr_auc": result["val_pr_auc"], "best_epoch": result["best_epoch"]})
                mlflow.set_tag("worker", result["worker"])
        mlflow.log_metric("best_val_pr_auc", results[0]["val_pr_auc"])
        create_table_artifact(results, key="sensor-sweep", description="sensor sweep trials, best validation PR-AUC first")
    print(tabulate(results, headers="keys", tablefmt="github", floatfmt=".4f"))
    return results


if __name__ == "__main__":
    stage_cli(sensor_sweep)
