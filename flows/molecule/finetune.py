"""Stage `molecule_finetune`: train the ensemble members from the pretrained encoder, as parallel Prefect
tasks on the `orchestration` task runner (threads or Dask)."""

from __future__ import annotations

import mlflow
import numpy as np
from prefect import flow

from flows import plots
from flows.molecule.artifacts import featurize, load_pretrained, save_ensemble
from flows.molecule.prepared import load_molecules, targets, tokenizer_of
from flows.params import load_params
from flows.paths import MOLECULE
from flows.tasks import compute_task, stage_cli
from flows.tracking import stage_run
from models.device import pick_device
from models.molecule.training import finetune_member


@compute_task(name="finetune-member", task_run_name="finetune-member-{seed}")
def train_member(train_data, train_y, val_data, val_y, task, model_cfg, cfg, pretrained_state, tokenizer, seed: int):
    return finetune_member(train_data, train_y, val_data, val_y, task, model_cfg, cfg, pretrained_state,
                           len(tokenizer), tokenizer.max_length, seed, pick_device())


@flow(name="molecule-finetune")
def molecule_finetune(params_file: str = "params.yaml") -> None:
    """Fine-tune `molecule.finetune.ensemble_size` members (regression on standardised targets)."""
    params = load_params(params_file)
    cfg = params.molecule
    prepared = load_molecules()
    task = prepared.task
    tokenizer = tokenizer_of(prepared)
    train_data = featurize(list(prepared.splits["train"]["smiles"]), tokenizer, cfg.data.max_heavy_atoms)
    val_data = featurize(list(prepared.splits["val"]["smiles"]), tokenizer, cfg.data.max_heavy_atoms)
    train_y, val_y = targets(prepared, "train"), targets(prepared, "val")
    mean, std = (float(train_y.mean()), float(train_y.std()) or 1.0) if task == "regression" else (0.0, 1.0)
    pretrained_state = None
    if cfg.finetune.use_pretrained:
        pretrained = load_pretrained(MOLECULE.pretrained)
        pretrained_state = pretrained.get("state")
        sizes = lambda model: {k: v for k, v in model.items() if k != "modalities"}  # noqa: E731 (same weights)
        if pretrained_state is not None and (sizes(pretrained["model"]) != sizes(cfg.model.model_dump())
                                             or pretrained["tokenizer"] != tokenizer.to_dict()):
            raise ValueError("the pretrained model was built with another molecule.model or tokenizer; rerun pretrain")
    score_name = "-RMSE (standardised)" if task == "regression" else "ROC-AUC"
    logged = {"model": cfg.model.model_dump(), "finetune": cfg.finetune.model_dump()}
    with stage_run(params.tracking, "molecule", "finetune", logged, {"molecule": MOLECULE.prepared}):
        mlflow.set_tag("started_from_pretrained", str(pretrained_state is not None))
        futures = [train_member.submit(train_data, (train_y - mean) / std, val_data, (val_y - mean) / std, task,
                                       cfg.model, cfg.finetune, pretrained_state, tokenizer, cfg.finetune.seed + index)
                   for index in range(cfg.finetune.ensemble_size)]
        members, histories = [], []
        for index, future in enumerate(futures):
            member, result = future.result()
            members.append(member)
            histories.append(result.history)
            for record in result.history:
                mlflow.log_metric(f"member{index}_train_loss", record["train_loss"], step=record["epoch"])
                mlflow.log_metric(f"member{index}_val_score", record["val_score"], step=record["epoch"])
        save_ensemble(MOLECULE.finetuned, members, cfg.model, task, mean, std, histories, tokenizer)
        figure = plots.training_curves({f"member {i}": h for i, h in enumerate(histories)},
                                       MOLECULE.plots / "training_curves.png", score_name)
        mlflow.log_artifact(str(figure))
    best = [max(r["val_score"] for r in h) for h in histories]
    print(f"molecule ensemble of {len(members)} trained; best validation {score_name} per member: "
          f"{np.round(best, 4).tolist()}")


if __name__ == "__main__":
    stage_cli(molecule_finetune)
