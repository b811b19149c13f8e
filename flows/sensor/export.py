"""Stage `sensor_export`: the calibrated ensemble to ONNX, checked against PyTorch, evaluated on test; the training
reference of the monitor (per-channel window-mean quantile bins and a sample, contract/reference.py).

The calibration (temperature or the isotonic piecewise-linear map) is part of the ONNX graph, with the fixed-mask
MC-dropout passes it was fitted on (`sensor.calibrate.mask_passes`), so
SensorPredictor, evaluation and serving all read calibrated probabilities from the same graph. With the novelty score
(artifacts/sensor/novelty.json enabled) the graph is models/sensor/alert.py's: the pretrained scorer, the novelty
calibration and the combination rule inside, each window's unit reference as inputs. Validation and test units are
seen against their first `sensor.data.reference_steps` rows (the relative channels' levels, the novelty reference)."""

from __future__ import annotations

import mlflow
import numpy as np
import pandas as pd
import torch
from prefect import flow

from flows.json_io import read_json, write_json
from flows.params import load_params
from flows.paths import SENSOR
from contract.manifest import sha256_file
from contract.reference import write_reference
from data.sensors.featurize import first_windows
from flows.sensor.artifacts import load_ensemble, load_scorer
from flows.sensor.prepared import load_windows
from flows.tasks import compute_task, stage_cli
from flows.tracking import stage_run
from models.export import check_parity, export_onnx
from models.mc_dropout import FixedMaskPasses
from models.metrics import classification_metrics
from models.monitoring import sensor_reference
from models.onnx_runtime import load_session, run
from models.predictors import SensorPredictor
from models.quantization import quantize_sensor_model
from models.uncertainty_quality import classification_uncertainty_quality, uncertainty_metrics
from models.sensor import alert
from models.sensor.calibrated import calibrated_ensemble
from models.sensor.departure import reference_from_dict
from models.sensor.training import fixed_mask_members

INPUTS = {"features": {0: "batch", 2: "time"}}
OUTPUTS = ["probability", "uncertainty"]


@compute_task(name="export-onnx")
def export(model: torch.nn.Module, example: dict[str, np.ndarray], opset: int) -> None:
    novelty = len(example) > 1
    export_onnx(model, {k: torch.from_numpy(v) for k, v in example.items()}, alert.INPUT_AXES if novelty else INPUTS,
                alert.OUTPUTS if novelty else OUTPUTS, SENSOR.onnx, opset)


@compute_task(name="parity-check")
def parity(model: torch.nn.Module, predictor: SensorPredictor, windows: np.ndarray, references=None) -> float:
    """Max |ONNX Runtime - PyTorch| over every output; raises when above the tolerance."""
    inputs = predictor.graph_inputs(windows, references)
    with torch.no_grad():
        expected = model(*(torch.from_numpy(v) for v in inputs.values()))
    got = run(predictor.session, inputs)
    return check_parity(expected, [got[name] for name in (alert.OUTPUTS if predictor.has_novelty else OUTPUTS)])


@compute_task(name="quantize-int8")
def quantize(inputs_val: dict[str, np.ndarray], max_diff: float) -> float:
    """Replace SENSOR.onnx by its int8 version (calibrated on the graph's validation inputs); returns the max
    |int8 - float| over the probabilities on those windows. Above `max_diff` it raises and the float file stays."""
    candidate = SENSOR.onnx.with_name("model.int8.onnx")
    quantize_sensor_model(SENSOR.onnx, candidate, inputs_val)
    float_out = run(load_session(SENSOR.onnx, prefer_cuda=False)[0], inputs_val)
    int8_out = run(load_session(candidate, prefer_cuda=False)[0], inputs_val)
    diff = max(float(np.abs(int8_out[name] - float_out[name]).max()) for name in float_out
               if name in ("probability", "uncertainty", "novelty", "combined"))
    if diff > max_diff:
        candidate.unlink()
        raise ValueError(f"int8 model moves outputs by up to {diff:.3f} on validation windows, more than "
                         f"sensor.export.quantize_max_diff = {max_diff}; export without quantize or raise the bound")
    candidate.replace(SENSOR.onnx)
    return diff


@flow(name="sensor-export")
def sensor_export(params_file: str = "params.yaml") -> dict:
    """Export, verify parity, evaluate the ONNX model on the test windows, write the model card."""
    params = load_params(params_file)
    members, featurizer, _ = load_ensemble(SENSOR.finetuned)
    calibration = read_json(SENSOR.calibration)
    novelty = read_json(SENSOR.novelty)
    prepared = load_windows()
    val, test = prepared.windows["val"], prepared.windows["test"]
    example = {"features": prepared.features(featurizer, "val")[:8]}
    passes = calibration.get("mask_passes", 0)
    if passes:  # the passes calibrate fitted on, inside the graph
        members = [FixedMaskPasses(m, passes)
                   for m in fixed_mask_members(members, passes, calibration["mask_seed"], example["features"])]
    model = calibrated_ensemble(members, calibration).eval()  # calibration (temperature or isotonic) inside the graph
    if novelty["enabled"]:
        model = alert.AlertModel(model, load_scorer(SENSOR.pretrained), novelty["calibration"],
                                 novelty["combination"]).eval()
        fleet = reference_from_dict(novelty["fleet_reference"])
        example.update(reference_mean=np.tile(fleet.mean, (8, 1)), reference_scale=np.tile(fleet.scale, (8, 1)),
                       reference_log_error=np.full(8, fleet.log_error, np.float32))
    export(model, example, params.sensor.export.opset)

    card = {
        "family": "sensor",
        "task": "classification",
        "target": f"failure within {int(prepared.report['horizon'])} steps",
        "channels": prepared.channels,
        "window": int(prepared.report["window"]),
        "horizon": int(prepared.report["horizon"]),
        "featurizer": featurizer.to_dict(),
        "calibration": calibration,
        "calibration_method": calibration.get("method", "temperature"),
        "threshold": calibration["threshold"],
        "ensemble_size": len(members),
        "mask_passes": passes,
        "reference_steps": int(prepared.report["reference_steps"]),
        "reference_windows": int(prepared.report["reference_windows"]),
        "inputs": {"features": f"(batch, {featurizer.width}, time) float32 from WindowFeaturizer"},
        "outputs": OUTPUTS,
    }
    if novelty["enabled"]:
        card["novelty"] = {key: novelty[key] for key in ("fleet_reference", "thresholds", "calibration", "combination")}
        card["inputs"].update({"reference_mean": "(batch, description) float32: each window's unit reference",
                               "reference_scale": "(batch, description) float32",
                               "reference_log_error": "(batch,) float32"})
        card["outputs"] = alert.OUTPUTS
    predictor = SensorPredictor(SENSOR.onnx, card, prefer_cuda=False)
    val_references, test_references = (  # each unit against its first rows, as validation was in training
        predictor.own_references(w.X, w.unit, first_windows(w.unit, w.time, card["reference_windows"]))
        for w in (val, test))
    max_diff = parity(model, predictor, val.X[:256])  # the fleet's reference
    if predictor.takes_references:
        max_diff = max(max_diff, parity(model, predictor, test.X[:256], test_references[:256]))
    settings = params.sensor.export
    card["quantization"] = None
    if settings.quantize:
        moved = quantize(predictor.graph_inputs(val.X, val_references), settings.quantize_max_diff)
        card["quantization"] = {"weights": "int8", "conv": "static, per channel, MinMax on validation windows",
                                "matmul": "dynamic, per channel", "max_abs_diff_vs_float": moved}
        predictor = SensorPredictor(SENSOR.onnx, card, prefer_cuda=False)  # test metrics below are the int8 model's
    out = predictor.predict(test.X, test_references)
    metrics = classification_metrics(test.y, out["probability"], card["threshold"])
    if novelty["enabled"]:
        card["novelty"]["test_metrics"] = {
            part: classification_metrics(test.y, out[part], novelty["thresholds"][part]) for part in ("novelty", "combined")}
    # the same figures on validation (which chose the epochs and fitted the calibration): far apart from the test
    # figures, they say the validation split is too small to choose by
    val_metrics = classification_metrics(val.y, predictor.predict(val.X, val_references)["probability"],
                                         card["threshold"])
    card.update({"test_metrics": metrics, "val_metrics": val_metrics, "calibration_error": metrics["ece"],
                 "uncertainty_quality": classification_uncertainty_quality(test.y, out["probability"], out["uncertainty"]),
                 "parity_max_abs_diff": max_diff, "onnx_sha256": sha256_file(SENSOR.onnx)})
    write_json(SENSOR.model_card, card)
    write_reference(SENSOR.reference, sensor_reference(prepared.windows["train"].X, prepared.channels))
    SENSOR.predictions.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({
        "unit": test.unit, "time": test.time, "label": test.y,
        "probability": np.round(out["probability"], 6), "uncertainty": np.round(out["uncertainty"], 6),
        **({part: np.round(out[part], 6) for part in ("novelty", "combined")} if novelty["enabled"] else {}),
    }).to_csv(SENSOR.predictions, index=False)
    with stage_run(params.tracking, "sensor", "export", {"export": params.sensor.export.model_dump()}, {"sensor": SENSOR.prepared}):
        mlflow.log_metrics({"parity_max_abs_diff": max_diff, **{f"test_{k}": v for k, v in metrics.items()},
                            **{f"val_{k}": v for k, v in val_metrics.items()},
                            **uncertainty_metrics(card["uncertainty_quality"])})
        if card["quantization"]:
            mlflow.log_metric("quantize_max_abs_diff", card["quantization"]["max_abs_diff_vs_float"])
        if novelty["enabled"]:
            mlflow.log_metrics({f"test_{part}_{k}": v for part, values in card["novelty"]["test_metrics"].items()
                                for k, v in values.items()})
        mlflow.log_artifact(str(SENSOR.model_card))
    kind = "int8" if card["quantization"] else "float"
    print(f"sensor model exported ({kind}, parity of the float graph {max_diff:.1e}); "
          f"test PR-AUC {metrics['pr_auc']:.4f}, ECE {metrics['ece']:.4f}; validation PR-AUC {val_metrics['pr_auc']:.4f}")
    if novelty["enabled"]:
        parts = card["novelty"]["test_metrics"]
        print(f"  with the novelty score: test PR-AUC {parts['novelty']['pr_auc']:.4f} alone, "
              f"{parts['combined']['pr_auc']:.4f} combined ({novelty['combination']['rule']}), "
              f"ECE {parts['combined']['ece']:.4f}")
    return card


if __name__ == "__main__":
    stage_cli(sensor_export)
