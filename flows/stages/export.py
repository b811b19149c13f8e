"""Stage `<family>_export`: the calibrated ensemble to ONNX (the calibration inside the graph), checked against
PyTorch, evaluated on test; the model card, the monitor's training reference (contract/reference.py) and the test
predictions."""

from __future__ import annotations

import mlflow
from prefect import flow

from contract.manifest import sha256_file
from contract.reference import write_reference
from flows.family import pipeline_family
from flows.json_io import write_json
from flows.params import load_params
from flows.tasks import stage_cli
from flows.tracking import stage_run
from models.uncertainty_quality import uncertainty_metrics


@flow(name="export", flow_run_name="{family}-export")
def export(family: str, params_file: str = "params.yaml") -> dict:
    """Export, verify parity, evaluate the ONNX model on the test split, write the model card."""
    params = load_params(params_file)
    parts = pipeline_family(family)
    paths, cfg = parts.paths, parts.settings(params)
    exported = parts.export(cfg)
    card = {**exported.card, "onnx_sha256": sha256_file(paths.onnx)}
    write_json(paths.model_card, card)
    write_reference(paths.reference, exported.reference)
    paths.predictions.parent.mkdir(parents=True, exist_ok=True)
    exported.predictions.to_csv(paths.predictions, index=False)
    with stage_run(params.tracking, family, "export", {"export": cfg.export.model_dump()}, {family: paths.prepared}):
        mlflow.log_metrics({"parity_max_abs_diff": card["parity_max_abs_diff"],
                            **{f"test_{k}": v for k, v in card["test_metrics"].items()},
                            **{f"val_{k}": v for k, v in card["val_metrics"].items()},
                            **uncertainty_metrics(card["uncertainty_quality"]), **exported.metrics})
        mlflow.log_artifact(str(paths.model_card))
    print(exported.message)
    return card


if __name__ == "__main__":
    stage_cli(export)
