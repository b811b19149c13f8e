"""Stage `sensor_calibrate`: temperature scaling or isotonic regression (the better by cross-fitted
validation NLL) and the alert threshold, all fitted on validation; with `mask_passes`, on every member's fixed-mask
MC-dropout passes."""

from __future__ import annotations

import mlflow
import numpy as np
from prefect import flow

from flows import plots
from flows.json_io import write_json
from flows.params import load_params
from flows.paths import SENSOR
from flows.sensor.artifacts import load_ensemble
from flows.sensor.prepared import load_windows
from flows.tasks import compute_task, stage_cli
from flows.tracking import stage_run
from models.calibration import binary_nll, choose_threshold, ensemble_probability, select_calibration
from models.device import pick_device
from models.metrics import expected_calibration_error
from models.sensor.training import ensemble_logits


@compute_task(name="member-logits")
def member_logits(members, features: np.ndarray, mask_passes: int = 0, mask_seed: int = 0) -> np.ndarray:
    """(n, F, T) -> (n, members), or (n, members * mask_passes) with fixed-mask passes (the exported graph's)."""
    return ensemble_logits(members, features, pick_device(), mask_passes, mask_seed)


@flow(name="sensor-calibrate")
def sensor_calibrate(params_file: str = "params.yaml") -> dict:
    """Choose and fit the calibration on validation and pick the alert threshold for `target_precision`."""
    params = load_params(params_file)
    cfg = params.sensor.calibrate
    members, featurizer, _ = load_ensemble(SENSOR.finetuned)
    prepared = load_windows()
    val = prepared.windows["val"]
    logits = member_logits(members, prepared.features(featurizer, "val"), cfg.mask_passes, cfg.mask_seed)
    calibration, cv_nll = select_calibration(logits, val.y, val.unit, cfg.methods)
    before, after = ensemble_probability(logits), calibration.probability(logits)
    threshold = choose_threshold(val.y, after, cfg.target_precision)
    result = {
        **calibration.to_dict(),
        "threshold": threshold,
        "target_precision": cfg.target_precision,
        "cv_nll": cv_nll,
        "val_nll_before": binary_nll(val.y, before),
        "val_nll_after": binary_nll(val.y, after),
        "val_ece_before": expected_calibration_error(val.y, before),
        "val_ece_after": expected_calibration_error(val.y, after),
        "mask_passes": cfg.mask_passes, "mask_seed": cfg.mask_seed,  # the sub-networks novelty and export build again
    }
    write_json(SENSOR.calibration, result)
    with stage_run(params.tracking, "sensor", "calibrate", {"calibrate": cfg.model_dump()}, {"sensor": SENSOR.prepared}):
        mlflow.set_tag("calibration_method", calibration.method)
        mlflow.log_metrics({k: v for k, v in result.items() if isinstance(v, float)})
        mlflow.log_metrics({f"cv_nll_{k}": v for k, v in cv_nll.items()})
        figure = plots.reliability_diagram(
            val.y, {"before": before, f"after {calibration.method}": after}, SENSOR.plots / "reliability_val.png"
        )
        mlflow.log_artifact(str(figure))
    print(f"sensor calibration: {calibration.method} (cross-fitted NLL {cv_nll}), threshold={threshold:.3f}, "
          f"validation ECE {result['val_ece_before']:.4f} -> {result['val_ece_after']:.4f}")
    return result


if __name__ == "__main__":
    stage_cli(sensor_calibrate)
