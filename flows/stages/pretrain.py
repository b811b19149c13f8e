"""Stage `<family>_pretrain`: self-supervised pretraining on the train split's items, labelled or not (validation,
which chooses the fine-tuning epochs and fits the calibration, and test stay unseen); the weights are a DVC output
and an MLflow artifact."""

from __future__ import annotations

import mlflow
from prefect import flow

from flows.family import pipeline_family
from flows.params import load_params
from flows.tasks import stage_cli
from flows.tracking import stage_run
from models.serialization import save_state


@flow(name="pretrain", flow_run_name="{family}-pretrain")
def pretrain(family: str, params_file: str = "params.yaml") -> None:
    """Pretrain the family's encoders (`<family>.model`, `<family>.pretrain`)."""
    params = load_params(params_file)
    parts = pipeline_family(family)
    cfg, path = parts.settings(params), parts.paths.pretrained
    path.parent.mkdir(parents=True, exist_ok=True)
    logged = {"model": cfg.model.model_dump(), "pretrain": cfg.pretrain.model_dump(mode="json")}
    with stage_run(params.tracking, family, "pretrain", logged, {family: parts.paths.prepared}):
        if not cfg.pretrain.enabled:
            save_state(parts.no_pretraining(), path)
            print(f"{family} pretraining disabled")
            return
        state, history, what = parts.pretrain(cfg)
        for record in history:
            mlflow.log_metric("pretrain_loss", record["train_loss"], step=record["epoch"])
        save_state(state, path)
        mlflow.log_artifact(str(path))
        print(f"{family} {what}; final loss {history[-1]['train_loss']:.4f}")


if __name__ == "__main__":
    stage_cli(pretrain)
