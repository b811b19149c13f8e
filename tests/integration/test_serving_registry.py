"""A real MLflow sqlite registry with tiny real ONNX models, the promotion gate on it, and a service to run
against it. The other serving and rollback tests import `tiny_models`, `build_registry` and `serve` from here.

The ONNX graphs are written with onnx.helper (no torch): the sensor graph takes the WindowFeaturizer's
(n, 2C, T) features like the exported ensemble, the molecule graph the arrays of `batch_graphs`. Each version
carries its training reference (reference.npz, as flows/registry.py registers it): sensor windows drawn like
`sensor_windows`, and the molecules of TRAINING_SMILES.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import mlflow
import numpy as np
import onnx
import pytest
import uvicorn
from mlflow import MlflowClient
from onnx import TensorProto, helper, numpy_helper

from data.molecules.featurize import FEATURIZER_VERSION, batch_inputs, encode_tokens, featurize_smiles
from data.molecules.tokenizer import SmilesTokenizer
from data.sensors.featurize import WindowFeaturizer
from contract.manifest import load_verify_key, public_key_path, sha256_file
from contract.reference import REFERENCE, write_reference
from contract.registry import CHAMPION, download_verified
from data.molecules.standardize import canonical_smiles
from flows.config import RegistryConfig
from flows.params import load_params
from flows.registry import register_and_gate
from models.metrics import classification_metrics
from models.monitoring import molecule_reference, sensor_reference
from models.predictors import IncompatibleModelError, SensorPredictor
from serving.served_models import ServedModels

pytestmark = pytest.mark.integration

PARAMS = load_params(Path(__file__).resolve().parents[2] / "params.yaml")
SENSOR_NAME, MOLECULE_NAME = PARAMS.sensor.registry.model_name, PARAMS.molecule.registry.model_name
CHANNELS, WINDOW = ["vibration", "temperature", "pressure"], 16
TRAINING_SMILES = ["CCO", "c1ccccc1O", "CC(=O)N", "ClCBr", "CCCO", "CCN", "c1ccccc1"]
# Random, uncalibrated toy models: the gate here judges the primary metric only.
SENSOR_GATE = RegistryConfig(model_name=SENSOR_NAME, primary_metric="pr_auc", mode="max", max_calibration_error=1.0)
MOLECULE_GATE = RegistryConfig(model_name=MOLECULE_NAME, primary_metric="rmse", mode="min", max_calibration_error=1.0)


def _model(nodes, inputs, outputs, initializers, path: Path) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


def sensor_onnx(path: Path, seed: int) -> Path:
    """features (n, 2C, T) -> mean over time -> 2 logistic members -> probability, uncertainty (std over members)."""
    weights = np.random.default_rng(seed).normal(size=(2 * len(CHANNELS), 2)).astype(np.float32)
    c = numpy_helper.from_array
    nodes = [
        helper.make_node("ReduceMean", ["features", "time_axis"], ["pooled"], keepdims=0),
        helper.make_node("MatMul", ["pooled", "weights"], ["logits"]),
        helper.make_node("Sigmoid", ["logits"], ["members"]),
        helper.make_node("ReduceMean", ["members", "member_axis"], ["probability"], keepdims=0),
        helper.make_node("ReduceMean", ["members", "member_axis"], ["mean_kept"], keepdims=1),
        helper.make_node("Sub", ["members", "mean_kept"], ["deviation"]),
        helper.make_node("Mul", ["deviation", "deviation"], ["squared"]),
        helper.make_node("ReduceMean", ["squared", "member_axis"], ["variance"], keepdims=0),
        helper.make_node("Sqrt", ["variance"], ["uncertainty"]),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 2 * len(CHANNELS), "time"])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch"]) for n in ("probability", "uncertainty")],
        [c(weights, "weights"), c(np.array([2], np.int64), "time_axis"), c(np.array([1], np.int64), "member_axis")],
        path,
    )


def molecule_onnx(path: Path, tokenizer: SmilesTokenizer) -> Path:
    """Per molecule: 0.5 * sum of its atoms' element indices - 1 (value) and 10% of |value| (uncertainty).

    Declares every array MoleculePredictor feeds (ONNX Runtime refuses unknown inputs) and uses three of them."""
    graphs = [featurize_smiles("CCO")]
    sample = batch_inputs(graphs, encode_tokens(graphs, tokenizer))
    types = {np.dtype(np.int64): TensorProto.INT64, np.dtype(np.float32): TensorProto.FLOAT}
    inputs = [helper.make_tensor_value_info(name, types[a.dtype], [f"{name}_{i}" for i in range(a.ndim)])
              for name, a in sample.items()]
    c = numpy_helper.from_array
    nodes = [
        helper.make_node("Gather", ["atom_features", "element_column"], ["element"], axis=1),
        helper.make_node("Cast", ["element"], ["element_float"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["graph_mask", "zero"], ["zeros"]),
        helper.make_node("ScatterElements", ["zeros", "batch", "element_float"], ["sums"], reduction="add"),
        helper.make_node("Mul", ["sums", "half"], ["scaled"]),
        helper.make_node("Sub", ["scaled", "one"], ["value"]),
        helper.make_node("Abs", ["value"], ["magnitude"]),
        helper.make_node("Mul", ["magnitude", "tenth"], ["uncertainty"]),
    ]
    scalars = {"zero": 0.0, "half": 0.5, "one": 1.0, "tenth": 0.1}
    return _model(
        nodes, inputs,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["molecules"]) for n in ("value", "uncertainty")],
        [c(np.array(0, np.int64), "element_column"), *(c(np.array(v, np.float32), k) for k, v in scalars.items())],
        path,
    )


def sensor_windows(n: int, seed: int, shift: np.ndarray | None = None) -> np.ndarray:
    """(n, C, WINDOW) windows: each channel of each window around its own level drawn from N(0, 1), plus `shift`
    (C,) on every reading."""
    rng = np.random.default_rng(seed)
    levels = rng.normal(size=(n, len(CHANNELS), 1)) + (0.0 if shift is None else shift[None, :, None])
    return rng.normal(loc=levels, size=(n, len(CHANNELS), WINDOW))


@dataclass
class TinyModels:
    """ONNX files, their model cards (without test metrics), the sensor test split the gate uses and the
    training reference files."""

    good_sensor: Path
    bad_sensor: Path
    molecule: Path
    sensor_card: dict
    molecule_card: dict
    test_windows: np.ndarray
    test_labels: np.ndarray
    sensor_reference: Path
    molecule_reference: Path


@functools.cache
def tiny_models(root: Path) -> TinyModels:
    """Two sensor models and one molecule model; the test labels are the good model's own alerts, so
    the good model scores PR-AUC 1 and the other one less."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    train = rng.normal(size=(64, len(CHANNELS), WINDOW))
    featurizer = WindowFeaturizer(CHANNELS).fit(train)
    sensor_card = {"family": "sensor", "task": "classification", "target": "failure within 8 steps",
                   "channels": CHANNELS, "window": WINDOW,
                   "horizon": 8, "featurizer": featurizer.to_dict(), "threshold": 0.5, "ensemble_size": 2}
    good, bad = sensor_onnx(root / "good.onnx", seed=1), sensor_onnx(root / "bad.onnx", seed=2)
    windows = sensor_windows(96, seed=1)
    probability = SensorPredictor(good, sensor_card, prefer_cuda=False).predict(windows)["probability"]
    labels = (probability >= np.median(probability)).astype(np.int64)
    tokenizer = SmilesTokenizer.build(["CCO", "c1ccccc1O", "CC(=O)N", "ClCBr"], max_length=32)
    molecule_card = {"family": "molecule", "task": "regression", "target": "solubility",
                     "featurizer_version": FEATURIZER_VERSION,
                     "tokenizer": tokenizer.to_dict(), "ensemble_size": 1, "outputs": ["value", "uncertainty"],
                     "smiles_only": True}
    molecule = molecule_onnx(root / "molecule.onnx", tokenizer)
    sensor_file = write_reference(root / "sensor-reference.npz",
                                  sensor_reference(sensor_windows(2000, seed=2), CHANNELS))
    molecule_file = write_reference(root / "molecule-reference.npz",
                                    molecule_reference([canonical_smiles(s) for s in TRAINING_SMILES]))
    return TinyModels(good, bad, molecule, sensor_card, molecule_card, windows, labels, sensor_file, molecule_file)


@dataclass
class Registry:
    """A populated registry: its tracking URI, the key that signed its versions and each registration's outcome,
    in order."""

    uri: str
    signing_key: Path
    sensor_outcomes: list[dict]
    molecule_outcome: dict

    @property
    def verify_key(self) -> Path:
        return public_key_path(self.signing_key)


def _sensor_card(models: TinyModels, onnx_path: Path) -> dict:
    predictor = SensorPredictor(onnx_path, models.sensor_card, prefer_cuda=False)
    metrics = classification_metrics(models.test_labels, predictor.predict(models.test_windows)["probability"], 0.5)
    return {**models.sensor_card, "test_metrics": metrics, "calibration_error": metrics["ece"],
            "onnx_sha256": sha256_file(onnx_path)}


def register_alone(root: Path, card: dict, onnx_path: Path) -> ServedModels:
    """A new MLflow registry under `root` holding only this sensor version, promoted through the real gate (the
    champion check passes: there is none), and a store serving its champion."""
    uri = f"sqlite:///{root / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.create_experiment(root.name, artifact_location=(root / "artifacts").as_uri())
    key = root / "keys" / "signing.key"
    with mlflow.start_run(experiment_id=experiment):
        outcome = register_and_gate(SENSOR_GATE, card, onnx_path, None, lambda *_: {"pr_auc": 0.0}, key)
    assert outcome["promoted"]
    return ServedModels(uri, {"sensor": SENSOR_NAME}, "champion", public_key_path(key), prefer_cuda=False)


def build_registry(root: Path, models: TinyModels, references: bool = True, uri: str | None = None) -> Registry:
    """Register, through the real gate: the bad sensor model (first champion), the good one (promoted over
    it), the bad one again (refused); and the molecule model (first champion). Each with its training reference
    unless not `references`. The store is `uri` (default: SQLite in `root`); artifacts and keys are in `root`."""
    root.mkdir(parents=True, exist_ok=True)
    uri = uri or f"sqlite:///{root / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.create_experiment("serving-tests", artifact_location=(root / "artifacts").as_uri())
    key = root / "keys" / "signing.key"

    def sensor_metrics(onnx_path: Path, card: dict) -> dict[str, float]:
        out = SensorPredictor(onnx_path, card, prefer_cuda=False).predict(models.test_windows)
        return classification_metrics(models.test_labels, out["probability"], card["threshold"])

    sensor_outcomes = []
    for onnx_path in (models.bad_sensor, models.good_sensor, models.bad_sensor):
        with mlflow.start_run(experiment_id=experiment):
            sensor_outcomes.append(register_and_gate(
                SENSOR_GATE, _sensor_card(models, onnx_path), onnx_path, None, sensor_metrics, key,
                extra_files={REFERENCE: models.sensor_reference} if references else None))
    molecule_card = {**models.molecule_card, "test_metrics": {"rmse": 1.0, "mae": 0.8}, "calibration_error": 0.0,
                     "onnx_sha256": sha256_file(models.molecule)}
    with mlflow.start_run(experiment_id=experiment):
        molecule_outcome = register_and_gate(MOLECULE_GATE, molecule_card, models.molecule, None,
                                             lambda *_: {"rmse": 9.0}, key,
                                             extra_files={REFERENCE: models.molecule_reference} if references else None)
    return Registry(uri, key, sensor_outcomes, molecule_outcome)


@functools.cache
def shared_registry(root: Path) -> Registry:
    """One registry for the tests that do not move aliases (built once per test session)."""
    return build_registry(root / "registry", tiny_models(root / "models"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(app, ready_timeout: float = 30.0) -> Iterator[str]:
    """Run `app` under uvicorn on a free loopback port in a thread; yields its base URL once /ready is 200."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.config.port}"
    deadline = time.monotonic() + ready_timeout
    try:
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/ready").status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the service at {url} was not ready within {ready_timeout} s")
            time.sleep(0.1)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> Registry:
    return shared_registry(tmp_path_factory.getbasetemp())


def test_first_sensor_version_becomes_champion(registry):
    first = registry.sensor_outcomes[0]
    assert first["registered_version"] == 1 and first["promoted"] and first["champion_before"] is None


def test_a_version_names_the_packages_that_load_it(registry, tmp_path):
    version = download_verified(MlflowClient(registry.uri), SENSOR_NAME, "1", tmp_path,
                                load_verify_key(registry.verify_key))
    requirements = (version.directory / "requirements.txt").read_text().split()
    assert {line.split("==")[0] for line in requirements} == {"mlflow", "onnx", "onnxruntime", "numpy"}
    assert all("==" in line for line in requirements)  # pinned to what registered it


def test_better_challenger_is_promoted_and_remembers_the_previous_champion(registry):
    better = registry.sensor_outcomes[1]
    assert better["registered_version"] == 2 and better["promoted"], better["reasons"]
    assert str(better["champion_before"]) == "1"
    assert any("at least as good as" in reason for reason in better["reasons"])
    client = MlflowClient(registry.uri)
    assert client.get_model_version(SENSOR_NAME, "2").tags["previous_champion"] == "1"


def test_worse_challenger_is_refused_and_champion_stays(registry):
    worse = registry.sensor_outcomes[2]
    assert worse["registered_version"] == 3 and not worse["promoted"]
    assert any("worse than" in reason for reason in worse["reasons"])
    client = MlflowClient(registry.uri)
    assert str(client.get_model_version_by_alias(SENSOR_NAME, CHAMPION).version) == "2"
    assert client.get_model_version(SENSOR_NAME, "3").tags["promotion"] == "refused"


def test_a_champion_this_code_cannot_run_does_not_block_promotion(tmp_path):
    """After a featurisation change the old champion cannot be evaluated (nor served): the new version
    is compared with nothing, promoted, and the reason says why."""
    models = tiny_models(tmp_path / "models")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = mlflow.create_experiment("incompatible", artifact_location=(tmp_path / "artifacts").as_uri())
    card = {**models.molecule_card, "test_metrics": {"rmse": 1.0, "mae": 0.8}, "calibration_error": 0.0,
            "onnx_sha256": sha256_file(models.molecule)}

    def old_featurisation(*_):
        raise IncompatibleModelError("model needs featurizer version 1, this code has 2")

    outcomes = []
    for _ in range(2):
        with mlflow.start_run(experiment_id=experiment):
            outcomes.append(register_and_gate(MOLECULE_GATE, card, models.molecule, None, old_featurisation,
                                              tmp_path / "signing.key"))
    assert outcomes[1]["promoted"] and str(outcomes[1]["champion_before"]) == "1"
    assert "champion v1 cannot run on this code" in outcomes[1]["reasons"][0]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert str(client.get_model_version_by_alias(MOLECULE_GATE.model_name, CHAMPION).version) == "2"
