"""Stage `sensor_finetune`: train the ensemble members on labelled windows, from the pretrained encoder.

The members are parallel Prefect tasks on the `orchestration` task runner (threads or Dask).
Each member checkpoints every epoch under artifacts/sensor/checkpoints/; a killed stage resumes from
there when rerun with the same data and settings; the checkpoints are removed once the ensemble is saved.

One large model across processes or machines: launch the stage with torchrun, e.g.
`torchrun --nproc-per-node 4 -m flows.sensor.finetune` (gloo on CPU, NCCL with one GPU per process).
Each member then trains data-parallel (DDP) on all processes, one member after the other; rank 0 runs
the Prefect flow and writes the MLflow run and the artifacts, the other ranks only train.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

import mlflow
import numpy as np
import torch
import typer
from prefect import flow

from data.sensors.featurize import WindowFeaturizer
from flows import plots
from flows.params import Params, load_params, tuned_file, with_tuned
from flows.paths import SENSOR
from flows.sensor.artifacts import load_encoder, save_ensemble
from flows.sensor.prepared import load_windows
from flows.tasks import compute_task, stage_cli
from flows.tracking import stage_run
from models.device import pick_device
from models.distributed import DistributedContext, process_group
from models.sensor.config import SensorModelConfig
from models.sensor.training import finetune_member
from models.training import TrainResult


@dataclass
class FinetuneInputs:
    """Featurised windows (n, F, T) (F = WindowFeaturizer.width), labels (n,), the fitted featurizer, the pretrained
    encoder's weights and the featurised training windows without a label (m, F, T) for the mean teacher."""

    train_x: np.ndarray
    train_y: np.ndarray
    val_x: np.ndarray
    val_y: np.ndarray
    featurizer: WindowFeaturizer
    encoder_state: dict | None
    unlabelled_x: np.ndarray


def load_inputs(use_pretrained: bool, model: SensorModelConfig, in_flow: bool = True) -> FinetuneInputs:
    """What every member trains on, featurised as `model` says (in_flow=False: outside a Prefect flow run, tasks
    called as functions)."""
    prepared = load_windows() if in_flow else load_windows.fn()
    train, val = prepared.windows["train"], prepared.windows["val"]
    featurizer = prepared.fit_featurizer(model.relative_channels)
    encoder_state = None
    if use_pretrained:
        encoder_state = load_encoder(SENSOR.pretrained)
    return FinetuneInputs(prepared.features(featurizer, "train", model.level_dropout), train.y,
                          prepared.features(featurizer, "val"), val.y, featurizer, encoder_state,
                          prepared.features(featurizer, "unlabelled", model.level_dropout))


def _checkpoint(index: int):
    return (SENSOR.artifacts / "checkpoints" / f"member{index}.pt").resolve()


@compute_task(name="finetune-member", task_run_name="finetune-member-{seed}")
def train_member(train_x, train_y, val_x, val_y, model_cfg, cfg, encoder_state, unlabelled_x, seed: int,
                 checkpoint=None):
    return finetune_member(train_x, train_y, val_x, val_y, model_cfg, cfg, encoder_state, seed, pick_device(),
                           checkpoint=checkpoint, unlabelled_x=unlabelled_x)


def train_members(inputs: FinetuneInputs, params: Params,
                  distributed: DistributedContext | None) -> list[tuple[torch.nn.Module, TrainResult]]:
    """All members: parallel tasks, or under torchrun one after the other, each data-parallel on every rank."""
    cfg = params.sensor
    args = (inputs.train_x, inputs.train_y, inputs.val_x, inputs.val_y, cfg.model, cfg.finetune, inputs.encoder_state)
    seeds = [cfg.finetune.seed + index for index in range(cfg.finetune.ensemble_size)]
    if distributed is not None:
        return [finetune_member(*args, seed, pick_device(), checkpoint=_checkpoint(index), distributed=distributed,
                                unlabelled_x=inputs.unlabelled_x)
                for index, seed in enumerate(seeds)]
    futures = [train_member.submit(*args, inputs.unlabelled_x, seed, _checkpoint(index)) for index, seed in enumerate(seeds)]
    return [future.result() for future in futures]


@flow(name="sensor-finetune")
def sensor_finetune(params_file: str = "params.yaml") -> None:
    """Fine-tune `sensor.finetune.ensemble_size` members; early stopping on validation PR-AUC."""
    params, tuned = with_tuned(load_params(params_file), "sensor")
    distributed = DistributedContext.from_env()
    cfg = params.sensor
    inputs = load_inputs(cfg.finetune.use_pretrained, cfg.model)
    logged = {"model": cfg.model.model_dump(), "finetune": cfg.finetune.model_dump()}
    with stage_run(params.tracking, "sensor", "finetune", logged, {"sensor": SENSOR.prepared}):
        mlflow.set_tags({"started_from_pretrained": str(inputs.encoder_state is not None),
                         "unlabelled_windows": str(len(inputs.unlabelled_x) if cfg.finetune.mean_teacher.enabled else 0),
                         "tuned": str(tuned_file("sensor").relative_to(SENSOR.root)) if tuned else "no",
                         "processes": str(distributed.world_size if distributed else 1)})
        members, histories = [], []
        for index, (member, result) in enumerate(train_members(inputs, params, distributed)):
            if result.resumed_from is not None:
                print(f"member {index} resumed after epoch {result.resumed_from} from its checkpoint")
            members.append(member)
            histories.append(result.history)
            for record in result.history:
                mlflow.log_metric(f"member{index}_train_loss", record["train_loss"], step=record["epoch"])
                mlflow.log_metric(f"member{index}_val_pr_auc", record["val_score"], step=record["epoch"])
            mlflow.log_metric(f"member{index}_best_val_pr_auc", result.best_score)
        save_ensemble(SENSOR.finetuned, members, cfg.model, inputs.featurizer, histories)
        shutil.rmtree(SENSOR.artifacts / "checkpoints", ignore_errors=True)
        figure = plots.training_curves(
            {f"member {i}": h for i, h in enumerate(histories)}, SENSOR.plots / "training_curves.png", "PR-AUC"
        )
        mlflow.log_artifact(str(figure))
    best = [max(r["val_score"] for r in h) for h in histories]
    print(f"sensor ensemble of {len(members)} trained; best validation PR-AUC per member: {np.round(best, 4).tolist()}")


def follow(params: str = typer.Option("params.yaml", help="parameters file")) -> None:
    """A torchrun rank other than 0: the same training steps as rank 0, nothing written."""
    loaded, _ = with_tuned(load_params(params), "sensor")  # the settings rank 0 trains with
    train_members(load_inputs(loaded.sensor.finetune.use_pretrained, loaded.sensor.model, in_flow=False), loaded,
                  DistributedContext.from_env())


def main() -> None:
    """The stage's command line; under torchrun rank 0 runs the flow and the other ranks follow it."""
    distributed = DistributedContext.from_env()
    if distributed is None:
        stage_cli(sensor_finetune)
        return
    with process_group(distributed):
        if distributed.is_main:
            stage_cli(sensor_finetune, stoppable=False)
        else:
            typer.run(follow)


if __name__ == "__main__":
    main()
