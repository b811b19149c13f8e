"""Stage `<family>_register`: the model's serving cost measured on this machine (models/serving_cost.py) and added
to the card it registers, a new signed registry version, the promotion gate, metrics/<family>.json (the decision)
and metrics/<family>/ (test metrics per model)."""

from __future__ import annotations

import functools
from pathlib import Path

import mlflow
import typer
from prefect import flow

from contract.reference import REFERENCE
from flows.family import PipelineFamily, pipeline_family
from flows.json_io import read_json, write_json, write_metrics_by_model
from flows.params import load_params
from flows.registry import register_and_gate
from flows.tasks import io_task, stage_cli
from flows.tracking import signing_key, stage_run
from models.serving_cost import THREADS, cost_line, cost_metrics, serving_cost


@io_task(name="register-and-gate")
def register_task(parts: PipelineFamily, registry, signing: Path, card: dict, prepared, new_task: bool,
                  baseline: dict[str, float]) -> dict:
    return register_and_gate(registry, card, parts.paths.onnx, parts.signature(card),
                             functools.partial(parts.champion_metrics, prepared), signing, new_task,
                             extra_files={REFERENCE: parts.paths.reference}, baseline=baseline,
                             test_positives=parts.test_positives(prepared, card))


@flow(name="register", flow_run_name="{family}-register")
def register(family: str, params_file: str = "params.yaml", new_task: bool = False) -> dict:
    """Register the exported model; promote it to `champion` if it passes the gate. `new_task`: the model predicts
    another task than the champion (another target or inputs) and may replace it."""
    params = load_params(params_file)
    parts = pipeline_family(family)
    paths, registry = parts.paths, parts.settings(params).registry
    card, baseline = read_json(paths.model_card), read_json(paths.baseline)
    others = baseline.get("baselines", [baseline])
    prepared = parts.load_prepared()
    cost = serving_cost(parts.predictor(paths.onnx, card, threads=THREADS), parts.serving_items(prepared, card),
                        paths.onnx)
    card = {**card, "serving_cost": cost}  # the registered card's, beside the exported one (which stays reproducible)
    print(f"{family}: {cost_line(cost)}")
    with stage_run(params.tracking, family, "register", {"registry": registry.model_dump()}, {family: paths.prepared}):
        outcome = register_task(parts, registry, signing_key(params.tracking), card, prepared, new_task,
                                baseline["test"])
        mlflow.log_metrics({**{f"test_{k}": v for k, v in card["test_metrics"].items()}, **cost_metrics(cost)})
        mlflow.log_metrics({f"baseline_test_{k}": v for k, v in baseline["test"].items()})
        for other in others:
            mlflow.log_metrics({f"baseline_{other['name']}_test_{k}": v for k, v in other["test"].items()})
        for figure in parts.test_figures(prepared, card, baseline):
            mlflow.log_artifact(str(figure))
    # `baseline`: the one the gate compares with (what the summary table shows); `baselines`: every baseline
    summary = {"model": card["test_metrics"], "model_val": card["val_metrics"], "serving_cost": cost,
               "baseline": {"name": baseline["name"], **baseline["test"]},
               "baselines": {o["name"]: o["test"] for o in others}, **outcome}
    write_json(paths.metrics, summary)
    write_metrics_by_model(paths.test_metrics, {"ours": card["test_metrics"], **summary["baselines"]})
    verdict = "promoted to champion" if outcome["promoted"] else "kept as challenger"
    print(f"{family} model version {outcome['registered_version']} {verdict}: {'; '.join(outcome['reasons'])}")
    return summary


if __name__ == "__main__":
    stage_cli(register, new_task=typer.Option(
        False, "--new-task", help="the model predicts another task than the champion (another target or inputs): "
        "judge it on calibration alone and let it replace the champion"))
