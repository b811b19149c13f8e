"""Stage `<family>_finetune`: train the ensemble members on the labelled training split, from the pretrained
weights, with early stopping on the validation score.

The members are parallel Prefect tasks on the `orchestration` task runner (threads or Dask). A family that
checkpoints its members does so every epoch under artifacts/<family>/checkpoints/: a killed stage resumes from there
when rerun with the same data and settings; the checkpoints are removed once the ensemble is saved.

One large model across processes or machines (the sensor family): launch the stage with torchrun, e.g.
`torchrun --nproc-per-node 4 -m flows.stages.finetune sensor` (gloo on CPU, NCCL with one GPU per process).
Each member then trains data-parallel (DDP) on all processes, one member after the other; rank 0 runs the Prefect
flow and writes the MLflow run and the artifacts, the other ranks only train.
"""

from __future__ import annotations

import shutil

import mlflow
import numpy as np
import typer
from prefect import flow

from flows import plots
from flows.family import FinetuneData, PipelineFamily, pipeline_family
from flows.params import load_params, tuned_file, with_tuned
from flows.tasks import compute_task, stage_cli
from flows.tracking import stage_run
from models.distributed import DistributedContext, process_group


@compute_task(name="finetune-member", task_run_name="finetune-member-{seed}")
def train_member(parts: PipelineFamily, cfg, inputs: FinetuneData, seed: int, checkpoint=None):
    return parts.train_member(cfg, inputs, seed, checkpoint)


def train_members(parts: PipelineFamily, cfg, inputs: FinetuneData, distributed: DistributedContext | None) -> list:
    """(member, TrainResult) of every member: parallel tasks, or under torchrun one after the other, each
    data-parallel on every rank."""
    seeds = [cfg.finetune.seed + index for index in range(cfg.finetune.ensemble_size)]
    folder = parts.paths.artifacts / "checkpoints"
    checkpoints = [(folder / f"member{index}.pt").resolve() for index in range(len(seeds))]
    if distributed is not None:
        return [parts.train_member(cfg, inputs, seed, checkpoint, distributed)
                for seed, checkpoint in zip(seeds, checkpoints)]
    futures = [train_member.submit(parts, cfg, inputs, seed, checkpoint)
               for seed, checkpoint in zip(seeds, checkpoints)]
    return [future.result() for future in futures]


@flow(name="finetune", flow_run_name="{family}-finetune")
def finetune(family: str, params_file: str = "params.yaml") -> None:
    """Fine-tune `<family>.finetune.ensemble_size` members, with tuned/<family>.yaml on top of the params."""
    params, tuned = with_tuned(load_params(params_file), family)
    parts = pipeline_family(family)
    distributed = DistributedContext.from_env()
    cfg, paths = parts.settings(params), parts.paths
    inputs = parts.finetune_data(cfg)
    logged = {"model": cfg.model.model_dump(), "finetune": cfg.finetune.model_dump()}
    with stage_run(params.tracking, family, "finetune", logged, {family: paths.prepared}):
        mlflow.set_tags({"started_from_pretrained": str(inputs.pretrained is not None), **inputs.tags,
                         "tuned": str(tuned_file(family).relative_to(paths.root)) if tuned else "no",
                         "processes": str(distributed.world_size if distributed else 1)})
        members, histories = [], []
        for index, (member, result) in enumerate(train_members(parts, cfg, inputs, distributed)):
            if result.resumed_from is not None:
                print(f"member {index} resumed after epoch {result.resumed_from} from its checkpoint")
            members.append(member)
            histories.append(result.history)
            for record in result.history:
                mlflow.log_metric(f"member{index}_train_loss", record["train_loss"], step=record["epoch"])
                mlflow.log_metric(f"member{index}_val_score", record["val_score"], step=record["epoch"])
            mlflow.log_metric(f"member{index}_best_val_score", result.best_score)
        parts.save_ensemble(cfg, inputs, members, histories)
        shutil.rmtree(paths.artifacts / "checkpoints", ignore_errors=True)
        figure = plots.training_curves({f"member {i}": h for i, h in enumerate(histories)},
                                       paths.plots / "training_curves.png", inputs.score_name)
        mlflow.log_artifact(str(figure))
    best = [max(r["val_score"] for r in h) for h in histories]
    print(f"{family} ensemble of {len(members)} trained; best validation {inputs.score_name} per member: "
          f"{np.round(best, 4).tolist()}")


def follow(family: str = typer.Argument(..., help="the model family"),
           params: str = typer.Option("params.yaml", help="parameters file")) -> None:
    """A torchrun rank other than 0: the same training steps as rank 0, nothing written."""
    loaded, _ = with_tuned(load_params(params), family)  # the settings rank 0 trains with
    parts = pipeline_family(family)
    cfg = parts.settings(loaded)
    train_members(parts, cfg, parts.finetune_data(cfg, in_flow=False), DistributedContext.from_env())


def main() -> None:
    """The stage's command line; under torchrun rank 0 runs the flow and the other ranks follow it."""
    distributed = DistributedContext.from_env()
    if distributed is None:
        stage_cli(finetune)
        return
    with process_group(distributed):
        if distributed.is_main:
            stage_cli(finetune, stoppable=False)
        else:
            typer.run(follow)


if __name__ == "__main__":
    main()
