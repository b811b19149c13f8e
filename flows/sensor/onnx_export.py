"""The sensor family's export (flows/stages/export.py): the calibrated ensemble to ONNX, checked against PyTorch,
evaluated on test; the training reference of the monitor (per-channel window-mean quantile bins and a sample,
contract/reference.py).

The calibration (temperature or the isotonic piecewise-linear map) is part of the ONNX graph, with the fixed-mask
MC-dropout passes it was fitted on (`sensor.calibrate.mask_passes`), so
SensorPredictor, evaluation and serving all read calibrated probabilities from the same graph. With the novelty score
(artifacts/sensor/novelty.json enabled) the graph is models/sensor/alert.py's: the pretrained scorer, the novelty
calibration and the combination rule inside, each window's unit reference as inputs. Validation and test units are
seen against their first `sensor.data.reference_steps` rows (the relative channels' levels, the novelty reference)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from data.sensors.featurize import first_windows
from flows.family import Exported
from flows.json_io import read_json
from flows.paths import StagePaths
from flows.sensor.artifacts import load_ensemble, load_scorer
from flows.tasks import compute_task
from models.export import check_parity, export_onnx
from models.mc_dropout import FixedMaskPasses
from models.metrics import classification_metrics
from models.monitoring import sensor_reference
from models.onnx_runtime import load_session, run
from models.predictors import SensorPredictor
from models.quantization import quantize_sensor_model
from models.uncertainty_quality import classification_uncertainty_quality
from models.sensor import alert
from models.sensor.calibrated import calibrated_ensemble
from models.sensor.departure import reference_from_dict
from models.sensor.training import fixed_mask_members

INPUTS = {"features": {0: "batch", 2: "time"}}
OUTPUTS = ["probability", "uncertainty"]


@compute_task(name="export-onnx")
def export(model: torch.nn.Module, example: dict[str, np.ndarray], path, opset: int) -> None:
    novelty = len(example) > 1
    export_onnx(model, {k: torch.from_numpy(v) for k, v in example.items()}, alert.INPUT_AXES if novelty else INPUTS,
                alert.OUTPUTS if novelty else OUTPUTS, path, opset)


@compute_task(name="parity-check")
def parity(model: torch.nn.Module, predictor: SensorPredictor, windows: np.ndarray, references=None) -> float:
    """Max |ONNX Runtime - PyTorch| over every output; raises when above the tolerance."""
    inputs = predictor.graph_inputs(windows, references)
    with torch.no_grad():
        expected = model(*(torch.from_numpy(v) for v in inputs.values()))
    got = run(predictor.session, inputs)
    return check_parity(expected, [got[name] for name in (alert.OUTPUTS if predictor.has_novelty else OUTPUTS)])


@compute_task(name="quantize-int8")
def quantize(path, inputs_val: dict[str, np.ndarray], max_diff: float) -> float:
    """Replace the ONNX file at `path` by its int8 version (calibrated on the graph's validation inputs); returns the
    max |int8 - float| over the probabilities on those windows. Above `max_diff` it raises and the float file stays."""
    candidate = path.with_name("model.int8.onnx")
    quantize_sensor_model(path, candidate, inputs_val)
    float_out = run(load_session(path, prefer_cuda=False)[0], inputs_val)
    int8_out = run(load_session(candidate, prefer_cuda=False)[0], inputs_val)
    diff = max(float(np.abs(int8_out[name] - float_out[name]).max()) for name in float_out
               if name in ("probability", "uncertainty", "novelty", "combined"))
    if diff > max_diff:
        candidate.unlink()
        raise ValueError(f"int8 model moves outputs by up to {diff:.3f} on validation windows, more than "
                         f"sensor.export.quantize_max_diff = {max_diff}; export without quantize or raise the bound")
    candidate.replace(path)
    return diff




def calibrated_graph(paths: StagePaths, prepared, members, featurizer, calibration: dict, novelty: dict):
    """The network the ONNX file holds and an example of its inputs (8 validation windows): the members (with the
    fixed-mask passes calibrate fitted on), the calibration and, with the novelty score, models/sensor/alert.py's
    graph around them."""
    example = {"features": prepared.features(featurizer, "val")[:8]}
    passes = calibration.get("mask_passes", 0)
    if passes:
        members = [FixedMaskPasses(m, passes)
                   for m in fixed_mask_members(members, passes, calibration["mask_seed"], example["features"])]
    model = calibrated_ensemble(members, calibration).eval()
    if novelty["enabled"]:
        model = alert.AlertModel(model, load_scorer(paths.pretrained), novelty["calibration"],
                                 novelty["combination"]).eval()
        fleet = reference_from_dict(novelty["fleet_reference"])
        example.update(reference_mean=np.tile(fleet.mean, (8, 1)), reference_scale=np.tile(fleet.scale, (8, 1)),
                       reference_log_error=np.full(8, fleet.log_error, np.float32))
    return model, example


def model_card(prepared, featurizer, calibration: dict, novelty: dict, ensemble_size: int) -> dict:
    """What serving needs next to the ONNX file (before the test figures): task, featurisation, calibration,
    threshold, the inputs and outputs of the graph."""
    report = prepared.report
    card = {
        "family": "sensor", "task": "classification", "target": f"failure within {int(report['horizon'])} steps",
        "channels": prepared.channels, "window": int(report["window"]), "horizon": int(report["horizon"]),
        "featurizer": featurizer.to_dict(), "calibration": calibration,
        "calibration_method": calibration.get("method", "temperature"), "threshold": calibration["threshold"],
        "ensemble_size": ensemble_size, "mask_passes": calibration.get("mask_passes", 0),
        "reference_steps": int(report["reference_steps"]), "reference_windows": int(report["reference_windows"]),
        "inputs": {"features": f"(batch, {featurizer.width}, time) float32 from WindowFeaturizer"},
        "outputs": OUTPUTS,
    }
    if novelty["enabled"]:
        card["novelty"] = {key: novelty[key] for key in ("fleet_reference", "thresholds", "calibration", "combination")}
        card["inputs"].update({"reference_mean": "(batch, description) float32: each window's unit reference",
                               "reference_scale": "(batch, description) float32",
                               "reference_log_error": "(batch,) float32"})
        card["outputs"] = alert.OUTPUTS
    return card


def export_model(cfg, paths: StagePaths, prepared) -> Exported:
    """Export, verify parity (fleet reference, and each test unit against its own), quantize where
    `export.quantize`, evaluate on test and validation (each unit against its first rows, as in training)."""
    members, featurizer, _ = load_ensemble(paths.finetuned)
    calibration, novelty = read_json(paths.calibration), read_json(paths.novelty)
    val, test = prepared.windows["val"], prepared.windows["test"]
    model, example = calibrated_graph(paths, prepared, members, featurizer, calibration, novelty)
    export(model, example, paths.onnx, cfg.export.opset)
    card = model_card(prepared, featurizer, calibration, novelty, len(members))
    predictor = SensorPredictor(paths.onnx, card, prefer_cuda=False)
    val_references, test_references = (
        predictor.own_references(w.X, w.unit, first_windows(w.unit, w.time, card["reference_windows"]))
        for w in (val, test))
    max_diff = parity(model, predictor, val.X[:256])  # the fleet's reference
    if predictor.takes_references:
        max_diff = max(max_diff, parity(model, predictor, test.X[:256], test_references[:256]))
    card["quantization"] = None
    if cfg.export.quantize:
        moved = quantize(paths.onnx, predictor.graph_inputs(val.X, val_references), cfg.export.quantize_max_diff)
        card["quantization"] = {"weights": "int8", "conv": "static, per channel, MinMax on validation windows",
                                "matmul": "dynamic, per channel", "max_abs_diff_vs_float": moved}
        predictor = SensorPredictor(paths.onnx, card, prefer_cuda=False)  # test metrics below are the int8 model's
    out = predictor.predict(test.X, test_references)
    metrics = classification_metrics(test.y, out["probability"], card["threshold"])
    # on validation too (which chose the epochs and fitted the calibration): far from the test figures, they say
    # the validation split is too small to choose by
    val_metrics = classification_metrics(val.y, predictor.predict(val.X, val_references)["probability"],
                                         card["threshold"])
    card.update({"test_metrics": metrics, "val_metrics": val_metrics, "calibration_error": metrics["ece"],
                 "uncertainty_quality": classification_uncertainty_quality(test.y, out["probability"], out["uncertainty"]),
                 "parity_max_abs_diff": max_diff})
    parts = ("novelty", "combined") if novelty["enabled"] else ()
    if parts:
        card["novelty"]["test_metrics"] = {
            part: classification_metrics(test.y, out[part], novelty["thresholds"][part]) for part in parts}
    predictions = pd.DataFrame({"unit": test.unit, "time": test.time, "label": test.y,
                                **{name: np.round(out[name], 6) for name in ("probability", "uncertainty", *parts)}})
    return Exported(card, sensor_reference(prepared.windows["train"].X, prepared.channels), predictions,
                    logged_metrics(card), message(card))


def logged_metrics(card: dict) -> dict[str, float]:
    """MLflow metrics besides the card's test and validation figures: the int8 model's departure, the novelty
    score's test figures."""
    metrics = {}
    if card["quantization"]:
        metrics["quantize_max_abs_diff"] = card["quantization"]["max_abs_diff_vs_float"]
    for part, values in card.get("novelty", {}).get("test_metrics", {}).items():
        metrics.update({f"test_{part}_{k}": v for k, v in values.items()})
    return metrics


def message(card: dict) -> str:
    metrics, kind = card["test_metrics"], "int8" if card["quantization"] else "float"
    lines = [f"sensor model exported ({kind}, parity of the float graph {card['parity_max_abs_diff']:.1e}); "
             f"test PR-AUC {metrics['pr_auc']:.4f}, ECE {metrics['ece']:.4f}; "
             f"validation PR-AUC {card['val_metrics']['pr_auc']:.4f}"]
    if "novelty" in card:
        parts = card["novelty"]["test_metrics"]
        lines.append(f"  with the novelty score: test PR-AUC {parts['novelty']['pr_auc']:.4f} alone, "
                     f"{parts['combined']['pr_auc']:.4f} combined ({card['novelty']['combination']['rule']}), "
                     f"ECE {parts['combined']['ece']:.4f}")
    return "\n".join(lines)
