"""Stage `molecule_tune` (opt-in: `molecule.tune.trials`): Optuna over the molecule fine-tuning (flows/tune.py),
one member per trial scored on validation (RMSE in standardised units, or ROC-AUC); the best settings go to
tuned/molecule.yaml."""

from __future__ import annotations

from prefect import flow

from flows.molecule.finetune import FinetuneInputs, load_inputs
from flows.params import Params
from flows.paths import MOLECULE
from flows.tasks import stage_cli
from flows.tune import TrialRecord, Tunable, tune
from models.device import pick_device
from models.molecule.training import finetune_member
from models.training import TrainResult


def inputs(params: Params) -> FinetuneInputs:
    """The featurised splits and the pretrained model, as the finetune stage loads them."""
    return load_inputs(params.molecule)


def metric(data: FinetuneInputs) -> tuple[str, float]:
    """Regression: the training loop's score is -RMSE (standardised), shown as RMSE; classification: ROC-AUC."""
    return ("val_rmse_standardised", -1.0) if data.task == "regression" else ("val_roc_auc", 1.0)


def train_trial(cfg, data: FinetuneInputs, on_epoch) -> TrainResult:
    """One member with the trial's `molecule` settings `cfg`, from the pretrained model where finetune would."""
    pretrained = data.pretrained_state if cfg.finetune.use_pretrained else None
    _, result = finetune_member(data.train_data, data.train_y, data.val_data, data.val_y, data.task, cfg.model,
                                cfg.finetune, pretrained, len(data.tokenizer), data.tokenizer.max_length,
                                cfg.finetune.seed, pick_device(), on_epoch=on_epoch)
    return result


def inert(params: Params) -> set[str]:
    """The other task's loss settings: a classifier has no regression loss, a regressor no classification loss."""
    if params.molecule.data.task == "classification":
        return {"finetune.regression_loss", "finetune.huber_delta"}
    return {"finetune.classification_loss", "finetune.focal_gamma"}


TUNABLE = Tunable(MOLECULE, inputs, metric, train_trial, inert)


@flow(name="molecule-tune")
def molecule_tune(params_file: str = "params.yaml") -> list[TrialRecord]:
    """Tune within `molecule.tune`'s trials and budget; returns the trials, best first."""
    return tune(TUNABLE, params_file)


if __name__ == "__main__":
    stage_cli(molecule_tune)
