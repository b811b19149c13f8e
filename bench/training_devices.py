"""Training on the CPU against CUDA with bf16 autocast: the same code, data and settings (not a test).

For both families, on the prepared default data (`make run` or `dvc repro` first), it times pretraining and
the fine-tuning of one ensemble member on each device present, and reports the validation score each
fine-tuning reaches, so that the GPU path is seen to learn as well as to be fast. Settings come from
params.yaml, with the epochs cut to --epochs and early stopping off, so that every device runs as many.

    .venv/bin/python bench/training_devices.py [--epochs 5] [--threads N]

Results go to bench/results/training_devices.json and .md. On a machine without CUDA only the CPU rows appear.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from data.molecules.prepare import load_prepared as load_molecules
from data.molecules.tokenizer import SmilesTokenizer
from data.sensors.featurize import WindowFeaturizer
from data.sensors.prepare import load_prepared as load_sensors
from models.molecule.config import MoleculeFinetuneConfig, MoleculeModelConfig, MoleculePretrainConfig
from models.molecule.training import Molecules, finetune_member as finetune_molecule, pretrain_model
from models.sensor.config import SensorFinetuneConfig, SensorModelConfig, SensorPretrainConfig
from models.sensor.training import finetune_member as finetune_sensor, pretrain_encoder

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def timed(call) -> tuple[object, float]:
    """(result, seconds); waits for queued CUDA work before reading the clock."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = call()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return result, time.perf_counter() - start


def sensor_rows(params: dict, epochs: int, devices: list[torch.device]) -> list[dict]:
    prepared = load_sensors(ROOT / "data" / "prepared" / "sensor")
    train, val = prepared.windows["train"], prepared.windows["val"]
    featurizer = WindowFeaturizer(prepared.channels).fit(train.X)
    train_x, val_x = featurizer.transform(train.X), featurizer.transform(val.X)
    model_cfg = SensorModelConfig(**params["model"])
    pretrain_cfg = SensorPretrainConfig(**{**params["pretrain"], "epochs": epochs})
    finetune_cfg = SensorFinetuneConfig(**{**params["finetune"], "epochs": epochs, "patience": epochs,
                                           "checkpoint": False})
    rows = []
    for device in devices:
        _, pretrain_s = timed(lambda: pretrain_encoder(train_x, model_cfg, pretrain_cfg, device))
        (_, result), finetune_s = timed(lambda: finetune_sensor(
            train_x, train.y, val_x, val.y, model_cfg, finetune_cfg, None, finetune_cfg.seed, device))
        rows.append({"family": "sensor", "device": device.type, "train_windows": len(train_x),
                     "pretrain_s_per_epoch": pretrain_s / epochs, "finetune_s_per_epoch": finetune_s / epochs,
                     "val_score": result.best_score, "score": "PR-AUC"})
    return rows


def molecule_rows(params: dict, epochs: int, devices: list[torch.device]) -> list[dict]:
    prepared = load_molecules(ROOT / "data" / "prepared" / "molecule")
    tokenizer = SmilesTokenizer.from_dict(prepared.tokenizer)

    train, val = (Molecules.from_smiles(list(prepared.splits[s]["smiles"]), tokenizer) for s in ("train", "val"))
    train_y = prepared.splits["train"]["target"].to_numpy(dtype=np.float64)
    val_y = prepared.splits["val"]["target"].to_numpy(dtype=np.float64)
    if prepared.task == "regression":
        mean, std = train_y.mean(), train_y.std() or 1.0
        train_y, val_y = (train_y - mean) / std, (val_y - mean) / std
    model_cfg = MoleculeModelConfig(**params["model"])
    pretrain_cfg = MoleculePretrainConfig(**{**params["pretrain"], "epochs": epochs})
    finetune_cfg = MoleculeFinetuneConfig(**{**params["finetune"], "epochs": epochs, "patience": epochs})
    rows = []
    for device in devices:
        threads = torch.get_num_threads()
        _, pretrain_s = timed(lambda: pretrain_model(train, len(tokenizer), tokenizer.max_length, model_cfg,
                                                     pretrain_cfg, device))
        (_, result), finetune_s = timed(lambda: finetune_molecule(
            train, train_y, val, val_y, prepared.task, model_cfg, finetune_cfg, None, len(tokenizer),
            tokenizer.max_length, finetune_cfg.seed, device))
        torch.set_num_threads(threads)  # training on the CPU sets one thread (single_thread_on_cpu)
        rows.append({"family": "molecule", "device": device.type, "train_molecules": len(train),
                     "pretrain_s_per_epoch": pretrain_s / epochs, "finetune_s_per_epoch": finetune_s / epochs,
                     "val_score": result.best_score,
                     "score": "-RMSE (standardised)" if prepared.task == "regression" else "ROC-AUC"})
    return rows


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"# Training, CPU against CUDA (bf16 autocast), {meta['epochs']} epochs of each stage", "",
             f"CPU: {meta['cpu']} ({meta['threads']} torch threads; molecule training uses 1 on the CPU by design). "
             f"GPU: {meta['gpu'] or 'none'}.", "",
             "| family | device | pretrain s/epoch | finetune s/epoch | speed-up (finetune) | validation score |",
             "| --- | --- | --- | --- | --- | --- |"]
    cpu = {row["family"]: row for row in rows if row["device"] == "cpu"}
    for row in rows:
        speedup = cpu[row["family"]]["finetune_s_per_epoch"] / row["finetune_s_per_epoch"]
        lines.append(f"| {row['family']} | {row['device']} | {row['pretrain_s_per_epoch']:.2f} | "
                     f"{row['finetune_s_per_epoch']:.2f} | {speedup:.1f}x | {row['score']} {row['val_score']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads on the CPU (default: torch's)")
    parser.add_argument("--families", nargs="+", default=["sensor", "molecule"], choices=["sensor", "molecule"])
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    meta = {"epochs": args.epochs, "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None, "torch": torch.__version__}
    rows = []
    if "sensor" in args.families:
        rows += sensor_rows(params["sensor"], args.epochs, devices)
    if "molecule" in args.families:
        rows += molecule_rows(params["molecule"], args.epochs, devices)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "training_devices.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    table = markdown(rows, meta)
    (RESULTS / "training_devices.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
