"""Stage `molecule_finetune`: train the ensemble members from the pretrained encoder, as parallel Prefect
tasks on the `orchestration` task runner (threads or Dask)."""

from __future__ import annotations

from dataclasses import dataclass

import mlflow
import numpy as np
from prefect import flow

from data.molecules.tokenizer import SmilesTokenizer

from flows import plots
from flows.molecule.artifacts import featurize, load_pretrained, save_ensemble
from flows.molecule.prepared import load_molecules, targets, tokenizer_of
from flows.params import MoleculeParams, load_params, tuned_file, with_tuned
from flows.paths import MOLECULE
from flows.tasks import compute_task, stage_cli
from flows.tracking import stage_run
from models.device import pick_device
from models.molecule.training import Molecules, finetune_member


@compute_task(name="finetune-member", task_run_name="finetune-member-{seed}")
def train_member(train_data, train_y, val_data, val_y, task, model_cfg, cfg, pretrained_state, tokenizer, seed: int):
    return finetune_member(train_data, train_y, val_data, val_y, task, model_cfg, cfg, pretrained_state,
                           len(tokenizer), tokenizer.max_length, seed, pick_device())


@dataclass
class FinetuneInputs:
    """What every member trains on: featurised molecules, targets standardised by the training mean and sd
    (regression; classification: as they are), the tokenizer and the pretrained weights (None: from scratch)."""

    task: str
    train_data: Molecules
    train_y: np.ndarray
    val_data: Molecules
    val_y: np.ndarray
    mean: float
    std: float
    tokenizer: SmilesTokenizer
    pretrained_state: dict | None


def load_inputs(cfg: MoleculeParams) -> FinetuneInputs:
    """The prepared splits featurised, and the pretrained model where `finetune.use_pretrained` (ValueError where
    it was built with other model sizes or another tokenizer)."""
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
        # the settings that shape the weights (views and dropout do not)
        sizes = lambda model: {k: v for k, v in model.items() if k not in ("modalities", "dropout")}  # noqa: E731
        if pretrained_state is not None and (sizes(pretrained["model"]) != sizes(cfg.model.model_dump())
                                             or pretrained["tokenizer"] != tokenizer.to_dict()):
            raise ValueError("the pretrained model was built with another molecule.model or tokenizer; rerun pretrain")
    return FinetuneInputs(task, train_data, (train_y - mean) / std, val_data, (val_y - mean) / std, mean, std,
                          tokenizer, pretrained_state)


@flow(name="molecule-finetune")
def molecule_finetune(params_file: str = "params.yaml") -> None:
    """Fine-tune `molecule.finetune.ensemble_size` members (regression on standardised targets)."""
    params, tuned = with_tuned(load_params(params_file), "molecule")
    cfg = params.molecule
    inputs = load_inputs(cfg)
    task, tokenizer, pretrained_state = inputs.task, inputs.tokenizer, inputs.pretrained_state
    score_name = "-RMSE (standardised)" if task == "regression" else "ROC-AUC"
    logged = {"model": cfg.model.model_dump(), "finetune": cfg.finetune.model_dump()}
    with stage_run(params.tracking, "molecule", "finetune", logged, {"molecule": MOLECULE.prepared}):
        mlflow.set_tags({"started_from_pretrained": str(pretrained_state is not None),
                         "tuned": str(tuned_file("molecule").relative_to(MOLECULE.root)) if tuned else "no"})
        futures = [train_member.submit(inputs.train_data, inputs.train_y, inputs.val_data, inputs.val_y, task,
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
        save_ensemble(MOLECULE.finetuned, members, cfg.model, task, inputs.mean, inputs.std, histories, tokenizer)
        figure = plots.training_curves({f"member {i}": h for i, h in enumerate(histories)},
                                       MOLECULE.plots / "training_curves.png", score_name)
        mlflow.log_artifact(str(figure))
    best = [max(r["val_score"] for r in h) for h in histories]
    print(f"molecule ensemble of {len(members)} trained; best validation {score_name} per member: "
          f"{np.round(best, 4).tolist()}")


if __name__ == "__main__":
    stage_cli(molecule_finetune)
