"""Stage `sensor_register`: a new registry version, the promotion gate, metrics/sensor.json (the decision) and
metrics/sensor/ (test metrics per model)."""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np
from mlflow.models import ModelSignature
from mlflow.types import Schema, TensorSpec
import typer
from prefect import flow

from data.sensors.featurize import WindowFeaturizer, first_windows
from flows import plots
from flows.json_io import read_json, write_json, write_metrics_by_model
from flows.params import load_params
from flows.paths import SENSOR
from contract.reference import REFERENCE
from flows.registry import register_and_gate
from flows.sensor.prepared import load_windows
from flows.tasks import io_task, stage_cli
from flows.tracking import signing_key, stage_run
from models.metrics import classification_metrics
from models.predictors import SensorPredictor


def signature(card: dict) -> ModelSignature:
    """Dynamic batch and time; the featurizer's feature channels (values, relative values with relative channels,
    then observed-masks); with the novelty score, each window's unit reference (its D description dimensions) in, the
    novelty outputs out."""
    float32 = np.dtype(np.float32)
    channels = WindowFeaturizer.from_dict(card["featurizer"]).width
    description = len(card["novelty"]["fleet_reference"]["mean"]) if "novelty" in card else None
    input_shapes = {"features": (-1, channels, -1), "reference_mean": (-1, description),
                    "reference_scale": (-1, description), "reference_log_error": (-1,)}
    return ModelSignature(
        inputs=Schema([TensorSpec(float32, input_shapes[name], name) for name in card["inputs"]]),
        outputs=Schema([TensorSpec(float32, (-1, description) if name == "description" else (-1,), name)
                        for name in card["outputs"]]),
    )


@io_task(name="register-and-gate")
def register(params, card: dict, test, reference_windows: int, new_task: bool, baseline: dict[str, float]) -> dict:
    def champion_metrics(onnx_path: Path, champion_card: dict) -> dict[str, float]:
        """The champion on the test windows, each unit against its first `reference_windows` (as the export's)."""
        champion = SensorPredictor(onnx_path, champion_card, prefer_cuda=False)
        marked = first_windows(test.unit, test.time, reference_windows)
        out = champion.predict(test.X, champion.own_references(test.X, test.unit, marked))
        return classification_metrics(test.y, out["probability"], champion_card["threshold"])

    return register_and_gate(params.sensor.registry, card, SENSOR.onnx, signature(card),
                             champion_metrics, signing_key(params.tracking), new_task,
                             extra_files={REFERENCE: SENSOR.reference}, baseline=baseline,
                             test_positives=int(test.y.sum()))


@flow(name="sensor-register")
def sensor_register(params_file: str = "params.yaml", new_task: bool = False) -> dict:
    """Register the exported model; promote it to `champion` if it passes the gate. `new_task`: the model predicts
    another task than the champion (another target or inputs) and may replace it."""
    params = load_params(params_file)
    card = read_json(SENSOR.model_card)
    baseline = read_json(SENSOR.baseline)
    prepared = load_windows()
    test = prepared.windows["test"]
    with stage_run(params.tracking, "sensor", "register", {"registry": params.sensor.registry.model_dump()},
                   {"sensor": SENSOR.prepared}):
        outcome = register(params, card, test, prepared.report["reference_windows"], new_task, baseline["test"])
        mlflow.log_metrics({f"test_{k}": v for k, v in card["test_metrics"].items()})
        mlflow.log_metrics({f"baseline_test_{k}": v for k, v in baseline["test"].items()})
        others = baseline.get("baselines", [baseline])
        for other in others:
            mlflow.log_metrics({f"baseline_{other['name']}_test_{k}": v for k, v in other["test"].items()})
        model_probability = np.loadtxt(SENSOR.predictions, delimiter=",", skiprows=1, usecols=3, ndmin=1)
        figure = plots.pr_curves(test.y, {"ensemble (ours)": model_probability,
                                          **{o["name"]: np.asarray(o["test_probability"]) for o in others}},
                                 SENSOR.plots / "pr_curve_test.png")
        mlflow.log_artifact(str(figure))
    # `baseline`: HistGradientBoosting (what the summary table shows); `baselines`: every baseline of the run
    summary = {"model": card["test_metrics"], "model_val": card["val_metrics"],
               "baseline": {"name": baseline["name"], **baseline["test"]},
               "baselines": {o["name"]: o["test"] for o in others}, **outcome}
    write_json(SENSOR.metrics, summary)
    write_metrics_by_model(SENSOR.test_metrics, {"ours": card["test_metrics"], **summary["baselines"]})
    verdict = "promoted to champion" if outcome["promoted"] else "kept as challenger"
    print(f"sensor model version {outcome['registered_version']} {verdict}: {'; '.join(outcome['reasons'])}")
    return summary


if __name__ == "__main__":
    stage_cli(sensor_register, new_task=typer.Option(
        False, "--new-task", help="the model predicts another task than the champion (another target or inputs): "
        "judge it on calibration alone and let it replace the champion"))
