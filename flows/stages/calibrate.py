"""Stage `<family>_calibrate`: the family's calibration, fitted on validation (with `calibrate.mask_passes`, on every
member's fixed-mask MC-dropout passes, which export builds again inside the graph)."""

from __future__ import annotations

import mlflow
from prefect import flow

from flows.family import pipeline_family
from flows.json_io import write_json
from flows.params import load_params
from flows.tasks import stage_cli
from flows.tracking import stage_run


@flow(name="calibrate", flow_run_name="{family}-calibrate")
def calibrate(family: str, params_file: str = "params.yaml") -> dict:
    """Fit the calibration of `<family>.calibrate` on validation."""
    params = load_params(params_file)
    parts = pipeline_family(family)
    cfg = parts.settings(params)
    result, figures, line = parts.calibrate(cfg)
    write_json(parts.paths.calibration, result)
    with stage_run(params.tracking, family, "calibrate", {"calibrate": cfg.calibrate.model_dump()},
                   {family: parts.paths.prepared}):
        mlflow.set_tag("calibration_method", result["method"])
        mlflow.log_metrics({k: v for k, v in result.items() if isinstance(v, float)})
        mlflow.log_metrics({f"cv_nll_{k}": v for k, v in result.get("cv_nll", {}).items()})
        for figure in figures:
            mlflow.log_artifact(str(figure))
    print(f"{family} calibration: {line}")
    return result


if __name__ == "__main__":
    stage_cli(calibrate)
