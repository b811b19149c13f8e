"""Stage `sensor_finetune`: train the ensemble members on labelled windows, from the pretrained encoder.

Each member checkpoints every epoch under artifacts/sensor/checkpoints/; a killed stage resumes from
there when rerun with the same data and settings; the checkpoints are removed once the ensemble is saved.
"""

from __future__ import annotations

import shutil

import mlflow
import numpy as np
import torch
from prefect import flow

from data.sensors.featurize import WindowFeaturizer
from flows import plots
from flows.params import load_params
from flows.paths import SENSOR
from flows.sensor.artifacts import load_windows, save_ensemble
from flows.tasks import compute_task, stage_cli
from flows.tracking import stage_run
from models.device import pick_device
from models.sensor.training import finetune_member


@compute_task(name="finetune-member", task_run_name="finetune-member-{seed}")
def train_member(train_x, train_y, val_x, val_y, model_cfg, cfg, encoder_state, seed: int, checkpoint=None):
    return finetune_member(train_x, train_y, val_x, val_y, model_cfg, cfg, encoder_state, seed, pick_device(),
                           checkpoint=checkpoint)


@flow(name="sensor-finetune")
def sensor_finetune(params_file: str = "params.yaml") -> None:
    """Fine-tune `sensor.finetune.ensemble_size` members; early stopping on validation PR-AUC."""
    params = load_params(params_file)
    cfg = params.sensor
    prepared = load_windows()
    train, val = prepared.windows["train"], prepared.windows["val"]
    featurizer = WindowFeaturizer(prepared.channels).fit(train.X)
    train_x, val_x = featurizer.transform(train.X), featurizer.transform(val.X)
    encoder_state = None
    if cfg.finetune.use_pretrained:
        encoder_state = torch.load(SENSOR.pretrained, map_location="cpu", weights_only=False)["encoder"]
    checkpoints = SENSOR.artifacts / "checkpoints"
    logged = {"model": cfg.model.model_dump(), "finetune": cfg.finetune.model_dump()}
    with stage_run(params.tracking, "sensor", "finetune", logged, {"sensor": SENSOR.prepared}):
        mlflow.set_tag("started_from_pretrained", str(encoder_state is not None))
        members, histories = [], []
        for index in range(cfg.finetune.ensemble_size):
            seed = cfg.finetune.seed + index
            member, result = train_member(train_x, train.y, val_x, val.y, cfg.model, cfg.finetune, encoder_state, seed,
                                          checkpoints / f"member{index}.pt")
            if result.resumed_from is not None:
                print(f"member {index} resumed after epoch {result.resumed_from} from its checkpoint")
            members.append(member)
            histories.append(result.history)
            for record in result.history:
                mlflow.log_metric(f"member{index}_train_loss", record["train_loss"], step=record["epoch"])
                mlflow.log_metric(f"member{index}_val_pr_auc", record["val_score"], step=record["epoch"])
            mlflow.log_metric(f"member{index}_best_val_pr_auc", result.best_score)
        save_ensemble(SENSOR.finetuned, members, cfg.model, featurizer, histories)
        shutil.rmtree(checkpoints, ignore_errors=True)
        figure = plots.training_curves(
            {f"member {i}": h for i, h in enumerate(histories)}, SENSOR.plots / "training_curves.png", "PR-AUC"
        )
        mlflow.log_artifact(str(figure))
    best = [max(r["val_score"] for r in h) for h in histories]
    print(f"sensor ensemble of {len(members)} trained; best validation PR-AUC per member: {np.round(best, 4).tolist()}")


if __name__ == "__main__":
    stage_cli(sensor_finetune)
