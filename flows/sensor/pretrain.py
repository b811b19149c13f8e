"""Stage `sensor_pretrain`: self-supervised masked reconstruction + SimCLR contrastive learning on unlabelled
windows of the train split, labelled or not (as molecule pretraining: validation, which chooses the fine-tuning epochs and fits the
calibration, stays unseen, so its scores are not flattered); the encoder is a DVC output and an MLflow artifact."""

from __future__ import annotations

import mlflow
import numpy as np
from prefect import flow

from flows.params import load_params
from flows.paths import SENSOR
from flows.sensor.prepared import load_windows
from flows.tasks import compute_task, stage_cli
from flows.tracking import stage_run
from models.device import pick_device
from models.sensor.training import pretrain_encoder
from models.serialization import save_state


@compute_task(name="self-supervised-pretraining")
def pretrain(features: np.ndarray, model_cfg, cfg):
    return pretrain_encoder(features, model_cfg, cfg, pick_device())


@flow(name="sensor-pretrain")
def sensor_pretrain(params_file: str = "params.yaml") -> None:
    """Pretrain the sensor encoder (`sensor.model`, `sensor.pretrain`) on the train windows alone, with the training
    windows that have no label."""
    params = load_params(params_file)
    cfg = params.sensor
    SENSOR.pretrained.parent.mkdir(parents=True, exist_ok=True)
    logged = {"model": cfg.model.model_dump(), "pretrain": cfg.pretrain.model_dump()}
    with stage_run(params.tracking, "sensor", "pretrain", logged, {"sensor": SENSOR.prepared}):
        if not cfg.pretrain.enabled:
            save_state({"encoder": None, "decoder": None}, SENSOR.pretrained)
            print("sensor pretraining disabled")
            return
        prepared = load_windows()
        featurizer = prepared.fit_featurizer(cfg.model.relative_channels)
        unlabelled = np.concatenate([prepared.features(featurizer, split, cfg.model.level_dropout)
                                     for split in ("train", "unlabelled")])
        encoder, decoder, result = pretrain(unlabelled, cfg.model, cfg.pretrain)
        for record in result.history:
            mlflow.log_metric("pretrain_loss", record["train_loss"], step=record["epoch"])
        save_state({"encoder": encoder.state_dict(), "decoder": decoder.state_dict(), "model": cfg.model.model_dump(),
                    "history": result.history}, SENSOR.pretrained)
        mlflow.log_artifact(str(SENSOR.pretrained))
        print(f"sensor encoder pretrained on {len(unlabelled)} windows; final loss {result.history[-1]['train_loss']:.4f}")


if __name__ == "__main__":
    stage_cli(sensor_pretrain)
