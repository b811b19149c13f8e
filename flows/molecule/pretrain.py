"""Stage `molecule_pretrain`: masked atoms, masked tokens and graph/SMILES contrastive alignment on unlabelled
molecules (the train split plus `molecule.pretrain.extra_smiles`; validation and test molecules are never used)."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pandas as pd
from prefect import flow

from data.errors import DataValidationError
from data.molecules.standardize import InvalidSmilesError, canonical_smiles
from flows.molecule.artifacts import featurize
from flows.molecule.prepared import load_molecules, tokenizer_of
from flows.params import load_params
from flows.paths import MOLECULE
from flows.tasks import compute_task, io_task, stage_cli
from flows.tracking import stage_run
from models.device import pick_device
from models.molecule.training import pretrain_model
from models.serialization import save_state


@io_task(name="load-extra-smiles")
def extra_smiles(path: Path, column: str, excluded: set[str], max_heavy_atoms: int) -> tuple[list[str], dict]:
    """Canonical SMILES of an extra file, without unparseable ones (or over `max_heavy_atoms`), duplicates and
    `excluded` (val/test) molecules."""
    path = Path(path)
    if not path.is_file():
        raise DataValidationError("extra SMILES file not found", file=path)
    frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    if column not in frame.columns:
        raise DataValidationError(f"no column '{column}' (columns: {list(frame.columns)})", file=path, column=column)
    kept, bad, held_out = [], 0, 0
    seen = set()
    for raw in frame[column].astype(str):
        try:
            smi = canonical_smiles(raw, max_heavy_atoms)
        except InvalidSmilesError:
            bad += 1
            continue
        if smi in excluded:
            held_out += 1
        elif smi not in seen:
            seen.add(smi)
            kept.append(smi)
    return kept, {"extra_rows": len(frame), "extra_kept": len(kept), "extra_unparseable": bad,
                  "extra_in_val_or_test": held_out}


@compute_task(name="masked-atoms-tokens-contrastive")
def pretrain(molecules, vocab_size, max_length, model_cfg, cfg):
    return pretrain_model(molecules, vocab_size, max_length, model_cfg, cfg, pick_device())


@flow(name="molecule-pretrain")
def molecule_pretrain(params_file: str = "params.yaml") -> None:
    """Pretrain the graph and SMILES encoders (`molecule.model`, `molecule.pretrain`)."""
    params = load_params(params_file)
    cfg = params.molecule
    MOLECULE.pretrained.parent.mkdir(parents=True, exist_ok=True)
    logged = {"model": cfg.model.model_dump(), "pretrain": cfg.pretrain.model_dump(mode="json")}
    with stage_run(params.tracking, "molecule", "pretrain", logged, {"molecule": MOLECULE.prepared}):
        if not cfg.pretrain.enabled:
            save_state({"state": None}, MOLECULE.pretrained)
            print("molecule pretraining disabled")
            return
        prepared = load_molecules()
        tokenizer = tokenizer_of(prepared)
        smiles = list(prepared.splits["train"]["smiles"])
        if cfg.pretrain.extra_smiles is not None:
            held_out = {*prepared.splits["val"]["smiles"], *prepared.splits["test"]["smiles"]}
            extra, report = extra_smiles(cfg.pretrain.extra_smiles, cfg.pretrain.extra_smiles_column, held_out,
                                         cfg.data.max_heavy_atoms)
            smiles = list(dict.fromkeys([*smiles, *extra]))
            mlflow.log_metrics({k: float(v) for k, v in report.items()})
        molecules = featurize(smiles, tokenizer, cfg.data.max_heavy_atoms)
        model, result = pretrain(molecules, len(tokenizer), tokenizer.max_length, cfg.model, cfg.pretrain)
        for record in result.history:
            mlflow.log_metric("pretrain_loss", record["train_loss"], step=record["epoch"])
        save_state({"state": model.state_dict(), "model": cfg.model.model_dump(), "tokenizer": tokenizer.to_dict(),
                    "history": result.history}, MOLECULE.pretrained)
        print(f"molecule encoders pretrained on {len(smiles)} molecules; final loss {result.history[-1]['train_loss']:.4f}")


if __name__ == "__main__":
    stage_cli(molecule_pretrain)
