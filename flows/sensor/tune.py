"""Stage `sensor_tune` (opt-in: `sensor.tune.trials`): Optuna over the sensor fine-tuning (flows/tune.py), one
member per trial scored by its best validation PR-AUC; the best settings go to tuned/sensor.yaml."""

from __future__ import annotations

from prefect import flow

from flows.params import Params
from flows.paths import SENSOR
from flows.sensor.finetune import FinetuneInputs, load_inputs
from flows.tasks import stage_cli
from flows.tune import TrialRecord, Tunable, tune
from models.device import pick_device
from models.sensor.training import finetune_member
from models.training import TrainResult


def inputs(params: Params) -> FinetuneInputs:
    """The windows and the pretrained encoder, as the finetune stage loads them."""
    return load_inputs(params.sensor.finetune.use_pretrained, params.sensor.model)


def train_trial(cfg, data: FinetuneInputs, on_epoch) -> TrainResult:
    """One member with the trial's `sensor` settings `cfg`, from the pretrained encoder where finetune would."""
    encoder = data.encoder_state if cfg.finetune.use_pretrained else None
    _, result = finetune_member(data.train_x, data.train_y, data.val_x, data.val_y, cfg.model, cfg.finetune, encoder,
                                cfg.finetune.seed, pick_device(), on_epoch=on_epoch,
                                unlabelled_x=data.unlabelled_x)
    return result


def metric(_: FinetuneInputs) -> tuple[str, float]:
    return "val_pr_auc", 1.0


TUNABLE = Tunable(SENSOR, inputs, metric, train_trial)


@flow(name="sensor-tune")
def sensor_tune(params_file: str = "params.yaml") -> list[TrialRecord]:
    """Tune within `sensor.tune`'s trials and budget; returns the trials, best first."""
    return tune(TUNABLE, params_file)


if __name__ == "__main__":
    stage_cli(sensor_tune)
