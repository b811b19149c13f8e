"""Stage `molecule_finetune`: train the ensemble members from the pretrained encoder."""

from __future__ import annotations

import mlflow
import numpy as np
import torch
from prefect import flow

from flows import plots
from flows.molecule.artifacts import featurize, load_molecules, save_ensemble, targets
from flows.params import load_params
from flows.paths import MOLECULE
from flows.tasks import compute_task, stage_cli
from flows.tracking import stage_run
from models.device import pick_device
from models.molecule.training import finetune_member


@compute_task(name="finetune-member", task_run_name="finetune-member-{seed}")
def train_member(train_graphs, train_y, val_graphs, val_y, task, model_cfg, cfg, encoder_state, seed: int):
    return finetune_member(train_graphs, train_y, val_graphs, val_y, task, model_cfg, cfg, encoder_state, seed,
                           pick_device())


@flow(name="molecule-finetune")
def molecule_finetune(params_file: str = "params.yaml") -> None:
    """Fine-tune `molecule.finetune.ensemble_size` members (regression on standardised targets)."""
    params = load_params(params_file)
    cfg = params.molecule
    prepared = load_molecules()
    task = prepared.task
    train_graphs = featurize(list(prepared.splits["train"]["smiles"]))
    val_graphs = featurize(list(prepared.splits["val"]["smiles"]))
    train_y, val_y = targets(prepared, "train"), targets(prepared, "val")
    mean, std = (float(train_y.mean()), float(train_y.std()) or 1.0) if task == "regression" else (0.0, 1.0)
    encoder_state = None
    if cfg.finetune.use_pretrained:
        encoder_state = torch.load(MOLECULE.pretrained, map_location="cpu", weights_only=False)["encoder"]
    score_name = "-RMSE (standardised)" if task == "regression" else "ROC-AUC"
    logged = {"model": cfg.model.model_dump(), "finetune": cfg.finetune.model_dump()}
    with stage_run(params.tracking, "molecule", "finetune", logged, {"molecule": MOLECULE.prepared}):
        mlflow.set_tag("started_from_pretrained", str(encoder_state is not None))
        members, histories = [], []
        for index in range(cfg.finetune.ensemble_size):
            seed = cfg.finetune.seed + index
            member, result = train_member(train_graphs, (train_y - mean) / std, val_graphs, (val_y - mean) / std,
                                          task, cfg.model, cfg.finetune, encoder_state, seed)
            members.append(member)
            histories.append(result.history)
            for record in result.history:
                mlflow.log_metric(f"member{index}_train_loss", record["train_loss"], step=record["epoch"])
                mlflow.log_metric(f"member{index}_val_score", record["val_score"], step=record["epoch"])
        save_ensemble(MOLECULE.finetuned, members, cfg.model, task, mean, std, histories)
        figure = plots.training_curves({f"member {i}": h for i, h in enumerate(histories)},
                                       MOLECULE.plots / "training_curves.png", score_name)
        mlflow.log_artifact(str(figure))
    best = [max(r["val_score"] for r in h) for h in histories]
    print(f"molecule ensemble of {len(members)} trained; best validation {score_name} per member: "
          f"{np.round(best, 4).tolist()}")


if __name__ == "__main__":
    stage_cli(molecule_finetune)
