"""The drift scenario of docs/how-to/monitor.md, shared by bench/monitoring.py and the integration tests.

A plant's reference fleet trains a small logistic ensemble on per-window channel means (written as an ONNX graph
that takes the WindowFeaturizer's (n, 2C, T) features, like the exported detector); it is registered with its
training reference. A drifted fleet of the same plant (another operating point, `regime_shift`, and another
failure prevalence, `failure_fraction`) then streams windows: each prediction of the served model goes into the
prediction store with its input summary, and each window's outcome (failure within the horizon or not) follows
`horizon` steps later (one step = one minute). A deliberately broken version of the same model (negated weights:
it ranks failures last, yet has the same layout and is signed like any other) is the rollout test's challenger."""

from __future__ import annotations

import datetime
import uuid
from dataclasses import dataclass
from pathlib import Path

import mlflow
import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper
from sklearn.linear_model import LogisticRegression
from sqlalchemy import insert

from contract.prediction_store import connect, outcomes, predictions, window_summaries
from contract.reference import REFERENCE, write_reference
from data.sensors.config import SensorDataConfig, SimulatorConfig
from data.sensors.featurize import WindowFeaturizer
from data.sensors.prepare import prepare_sensor_frame
from data.sensors.simulator import simulate_fleet
from data.sensors.windows import Windows, make_windows
from flows.params import Params, load_params
from flows.registry import register_and_gate
from flows.tracking import experiment_id, signing_key
from models.calibration import choose_threshold
from models.metrics import classification_metrics
from models.monitoring import sensor_reference
from models.predictors import SensorPredictor

START = datetime.datetime(2026, 11, 1, tzinfo=datetime.timezone.utc)
PROJECT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Scenario:
    """A plant, its reference fleet and the drift (defaults: the scenario the bench measures)."""

    plant_seed: int = 11
    n_units: int = 40
    n_steps: int = 600
    window: int = 32
    stride: int = 4
    horizon: int = 48
    reference_failure_fraction: float = 0.45
    regime_shift: float = 0.6  # in units of 10% of each channel's level
    drifted_failure_fraction: float = 0.8
    members: int = 2

    def simulator(self, drifted: bool, n_units: int | None = None) -> SimulatorConfig:
        return SimulatorConfig(n_units=n_units or self.n_units, n_steps=self.n_steps, plant_seed=self.plant_seed,
                               regime_shift=self.regime_shift if drifted else 0.0,
                               failure_fraction=self.drifted_failure_fraction if drifted else self.reference_failure_fraction)

    def data_config(self) -> SensorDataConfig:
        return SensorDataConfig(window=self.window, stride=self.stride, horizon=self.horizon, drop_constant=False)


@dataclass
class Stream:
    """A fleet's windows in the order they arrive, and the minute each arrives (n,). A steady-state fleet: each
    machine's life is shifted by a random offset and wrapped around a period of `n_steps` minutes (a machine that
    fails or retires is replaced by the next of its slot), so young and ageing machines report side by side."""

    windows: Windows
    minute: np.ndarray

    def head(self, n: int) -> "Stream":
        """The first `n` windows to arrive."""
        w = self.windows
        return Stream(Windows(X=w.X[:n], y=w.y[:n], unit=w.unit[:n], time=w.time[:n]), self.minute[:n])


def fleet_stream(scenario: Scenario, seed: int, drifted: bool, n_units: int | None = None) -> Stream:
    """Every window of one simulated fleet (n, C, T), in arrival order."""
    frame = simulate_fleet(scenario.simulator(drifted, n_units), seed)
    channels = scenario.simulator(drifted).channels
    split = make_windows(frame, channels, scenario.window, scenario.stride, scenario.horizon,
                         np.full(len(frame), "test"))["test"]
    units, index = np.unique(split.unit, return_inverse=True)
    started = np.random.default_rng([seed, 1]).integers(0, scenario.n_steps, size=len(units))
    minute = (started[index] + split.time) % scenario.n_steps
    order = np.lexsort((split.unit, minute))
    windows = Windows(X=split.X[order], y=split.y[order], unit=split.unit[order], time=split.time[order])
    return Stream(windows, minute[order])


def logistic_onnx(path: Path, weights: np.ndarray, bias: np.ndarray) -> Path:
    """features (n, 2C, T) -> mean over time -> members' sigmoid(x @ weights (2C, M) + bias (M,)) -> probability
    (mean over members), uncertainty (std over members)."""
    c = numpy_helper.from_array
    nodes = [
        helper.make_node("ReduceMean", ["features", "time_axis"], ["pooled"], keepdims=0),
        helper.make_node("MatMul", ["pooled", "weights"], ["scores"]),
        helper.make_node("Add", ["scores", "bias"], ["logits"]),
        helper.make_node("Sigmoid", ["logits"], ["members"]),
        helper.make_node("ReduceMean", ["members", "member_axis"], ["probability"], keepdims=0),
        helper.make_node("ReduceMean", ["members", "member_axis"], ["mean_kept"], keepdims=1),
        helper.make_node("Sub", ["members", "mean_kept"], ["deviation"]),
        helper.make_node("Mul", ["deviation", "deviation"], ["squared"]),
        helper.make_node("ReduceMean", ["squared", "member_axis"], ["variance"], keepdims=0),
        helper.make_node("Sqrt", ["variance"], ["uncertainty"]),
    ]
    graph = helper.make_graph(
        nodes, "logistic-ensemble",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", weights.shape[0], "time"])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch"]) for n in ("probability", "uncertainty")],
        [c(weights.astype(np.float32), "weights"), c(bias.astype(np.float32), "bias"),
         c(np.array([2], np.int64), "time_axis"), c(np.array([1], np.int64), "member_axis")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return path


@dataclass
class TrainedModel:
    """The exported model: ONNX file, model card (with test metrics) and training reference file."""

    onnx: Path
    card: dict
    reference: Path


def train_reference_model(scenario: Scenario, folder: Path, seed: int = 0, broken: bool = False) -> TrainedModel:
    """Fit the logistic ensemble on the reference fleet's train split (bootstrap members), choose the alert
    threshold on validation (precision 0.8), evaluate on test, write ONNX, card and reference into `folder`.
    `broken`: the fitted weights and biases negated before export (its metrics are measured like any other's)."""
    frame = simulate_fleet(scenario.simulator(drifted=False), seed)
    prepared = prepare_sensor_frame(frame, scenario.data_config().model_copy(update={"seed": seed}), "simulator")
    train, val, test = (prepared.windows[s] for s in ("train", "val", "test"))
    featurizer = WindowFeaturizer(prepared.channels).fit(train.X)
    pooled = featurizer.transform(train.X).mean(axis=2)
    rng = np.random.default_rng(seed)
    weights, bias = [], []
    for _ in range(scenario.members):
        rows = rng.choice(len(pooled), size=len(pooled), replace=True)
        member = LogisticRegression(C=1.0, max_iter=2000).fit(pooled[rows], train.y[rows])
        weights.append(member.coef_[0]), bias.append(member.intercept_[0])
    sign = -1.0 if broken else 1.0
    onnx_path = logistic_onnx(folder / "model.onnx", sign * np.stack(weights, axis=1), sign * np.array(bias))
    card = {"family": "sensor", "task": "classification", "target": f"failure within {scenario.horizon} steps",
            "channels": prepared.channels, "window": scenario.window, "horizon": scenario.horizon,
            "featurizer": featurizer.to_dict(), "ensemble_size": scenario.members, "threshold": 0.5,
            "calibration": {"method": "none (logistic regression)"}, "outputs": ["probability", "uncertainty"]}
    predictor = SensorPredictor(onnx_path, card, prefer_cuda=False)
    card["threshold"] = choose_threshold(val.y, predictor.predict(val.X)["probability"], 0.8)
    metrics = classification_metrics(test.y, predictor.predict(test.X)["probability"], card["threshold"])
    card.update(test_metrics=metrics, calibration_error=metrics["ece"])
    reference = write_reference(folder / "reference.npz", sensor_reference(train.X, prepared.channels))
    return TrainedModel(onnx_path, card, reference)


def write_predictions(url: str, predictor: SensorPredictor, stream: Stream, name: str, version: str,
                      horizon: int) -> int:
    """Predict every window of `stream` with `predictor` and store it with its outcome, as the service would:
    prediction at START + its minute, outcome `horizon` minutes later. Returns the rows written."""
    windows = stream.windows
    out = predictor.predict(windows.X)
    summaries = window_summaries(windows.X.transpose(0, 2, 1), predictor.card["channels"])
    prediction_rows, outcome_rows = [], []
    for i in range(len(windows)):
        created = START + datetime.timedelta(minutes=int(stream.minute[i]))
        identifier = uuid.uuid5(uuid.NAMESPACE_URL, f"{name}/{version}/{windows.unit[i]}/{stream.minute[i]}").hex
        prediction_rows.append({
            "id": identifier, "created_at": created, "family": "sensor", "model_name": name,
            "model_version": str(version), "role": "champion", "request_id": identifier,
            "unit": str(windows.unit[i]), "time": float(windows.time[i]), "input_digest": "0" * 64,
            "input_summary": summaries[i],
            "output": {"failure_probability": float(out["probability"][i]), "alert": bool(out["alert"][i]),
                       "uncertainty": float(out["uncertainty"][i])}})
        outcome_rows.append({"prediction_id": identifier, "family": "sensor", "observed": float(windows.y[i]),
                             "received_at": created + datetime.timedelta(minutes=horizon)})
    engine = connect(url)
    with engine.begin() as connection:
        connection.execute(insert(predictions), prediction_rows)
        connection.execute(insert(outcomes), outcome_rows)
    engine.dispose()
    return len(windows)


def write_params(root: Path, monitor: dict | None = None) -> Path:
    """params.yaml of a scratch workspace `root`: the project's, with the MLflow store, the signing key and the
    prediction store inside `root`, and `monitor` settings overridden."""
    params = load_params(PROJECT / "params.yaml").model_dump(mode="json")
    params["tracking"].update(uri=f"sqlite:///{root / 'mlflow' / 'mlflow.db'}",
                              artifact_root=str(root / "mlflow" / "artifacts"), signing_key=str(root / "keys" / "signing.key"))
    params["monitor"].update(store_url=f"sqlite:///{root / 'predictions.db'}", **(monitor or {}))
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def register_model(params: Params, model: TrainedModel) -> dict:
    """Register the trained model with its reference through the real gate: the registry's first champion, or a
    later version compared with the champion's test metrics (the scenario's models share one test split)."""
    with mlflow.start_run(experiment_id=experiment_id(params.tracking, "sensor"), run_name="sensor.register"):
        return register_and_gate(params.sensor.registry, model.card, model.onnx, None,
                                 lambda _, champion_card: champion_card["test_metrics"],
                                 signing_key(params.tracking), extra_files={REFERENCE: model.reference})
