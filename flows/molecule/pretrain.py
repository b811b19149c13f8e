"""Stage `molecule_pretrain`: masked atom prediction on unlabelled molecules (train + val SMILES)."""

from __future__ import annotations

import mlflow
import torch
from prefect import flow

from flows.molecule.artifacts import featurize, load_molecules
from flows.params import load_params
from flows.paths import MOLECULE
from flows.tasks import compute_task, stage_cli
from flows.tracking import stage_run
from models.device import pick_device
from models.molecule.training import pretrain_encoder


@compute_task(name="masked-atom-prediction")
def pretrain(graphs, model_cfg, cfg):
    return pretrain_encoder(graphs, model_cfg, cfg, pick_device())


@flow(name="molecule-pretrain")
def molecule_pretrain(params_file: str = "params.yaml") -> None:
    """Pretrain the graph encoder (`molecule.model`, `molecule.pretrain`); test molecules are never used."""
    params = load_params(params_file)
    cfg = params.molecule
    MOLECULE.pretrained.parent.mkdir(parents=True, exist_ok=True)
    logged = {"model": cfg.model.model_dump(), "pretrain": cfg.pretrain.model_dump()}
    with stage_run(params.tracking, "molecule", "pretrain", logged, {"molecule": MOLECULE.prepared}):
        if not cfg.pretrain.enabled:
            torch.save({"encoder": None}, MOLECULE.pretrained)
            print("molecule pretraining disabled")
            return
        prepared = load_molecules()
        smiles = [*prepared.splits["train"]["smiles"], *prepared.splits["val"]["smiles"]]
        encoder, result = pretrain(featurize(smiles), cfg.model, cfg.pretrain)
        for record in result.history:
            mlflow.log_metric("masked_atom_loss", record["train_loss"], step=record["epoch"])
        torch.save({"encoder": encoder.state_dict(), "history": result.history}, MOLECULE.pretrained)
        print(f"molecule encoder pretrained on {len(smiles)} molecules; final loss {result.history[-1]['train_loss']:.4f}")


if __name__ == "__main__":
    stage_cli(molecule_pretrain)
