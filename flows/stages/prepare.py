"""Stage `<family>_prepare`: load, validate and split the family's data (a DVC output)."""

from __future__ import annotations

import mlflow
from prefect import flow

from flows.family import pipeline_family
from flows.params import load_params
from flows.tasks import io_task, stage_cli
from flows.tracking import log_json, stage_run


@io_task(name="save-prepared")
def save(family, prepared) -> None:
    family.save_prepared(prepared, family.paths.prepared)


@flow(name="prepare", flow_run_name="{family}-prepare")
def prepare(family: str, params_file: str = "params.yaml") -> dict:
    """Prepare the data of `<family>.data`."""
    params = load_params(params_file)
    parts = pipeline_family(family)
    cfg = parts.settings(params).data
    prepared = parts.prepare(cfg)
    save(parts, prepared)
    with stage_run(params.tracking, family, "prepare", {"data": cfg.model_dump(mode="json")},
                   {family: parts.paths.prepared}):
        mlflow.log_metrics(prepared.metrics)
        log_json(prepared.report, "prepare_report.json")
    print(prepared.message)
    return prepared.report


if __name__ == "__main__":
    stage_cli(prepare)
