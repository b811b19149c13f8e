"""The novelty score through the real service: a sensor version whose ONNX graph holds the pretrained scorer
(models/sensor/alert.py), registered through the gate and served; unit references put, read, removed, kept in the
store across service restarts; windows scored against their unit's reference or, without one, the fleet's normal
(and the answer says which); the reference endpoint's validation and limits; a store that cannot be used (503 for
references, the fleet's normal for scoring); a version without the score refuses
references."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from contract.manifest import sha256_file
from data.sensors.featurize import WindowFeaturizer
from models.export import export_onnx
from models.sensor.alert import INPUT_AXES, OUTPUTS, AlertModel
from models.sensor.calibrated import calibrated_ensemble
from models.sensor.config import SensorModelConfig, SensorPretrainConfig
from models.sensor.departure import fit_fleet_reference, reference_to_dict
from models.sensor.network import SensorClassifier
from models.sensor.novelty import NoveltyScorer, score_windows
from models.sensor.training import MASK_SPAN, pretrain_encoder
from serving.app import create_app
from serving.settings import ServingSettings
from serving.served_models import ServedModels
from tests.integration.test_serving import LIMITS, models, registry, store, window_json  # noqa: F401
from tests.integration.test_serving_registry import CHANNELS, WINDOW, register_alone

pytestmark = pytest.mark.integration
TINY = SensorModelConfig(hidden=8, layers=2, dropout=0.0, attention_layers=1, heads=2, projection=4,
                         statistics_bins=0)


@pytest.fixture(scope="session")
def prefect_api():
    """No flow runs here: no Prefect server (overrides the integration conftest's)."""


def healthy(n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, C, T) smooth cycles with noise, a random phase per window and channel."""
    t = np.arange(WINDOW)
    phase = rng.uniform(0, 2 * np.pi, (n, len(CHANNELS), 1))
    return (np.sin(2 * np.pi * t / 8 + phase) + 0.05 * rng.normal(size=(n, len(CHANNELS), WINDOW))).astype(np.float32)


@pytest.fixture(scope="module")
def novelty_store(tmp_path_factory) -> ServedModels:
    """A registry holding one sensor version with the novelty score (scorer pretrained on healthy windows, members
    untrained: the failure part is not judged here)."""
    root = tmp_path_factory.mktemp("novelty-registry")
    rng = np.random.default_rng(0)
    train = healthy(256, rng)
    featurizer = WindowFeaturizer(CHANNELS).fit(train)
    features = featurizer.transform(train)
    encoder, decoder, _ = pretrain_encoder(features, TINY, SensorPretrainConfig(epochs=4, batch_size=64, lr=0.003),
                                           torch.device("cpu"))
    scorer = NoveltyScorer(encoder, decoder, len(CHANNELS), MASK_SPAN).eval()
    torch.manual_seed(0)
    members = [SensorClassifier(2 * len(CHANNELS), TINY).eval() for _ in range(2)]
    calibration = {"weights": [1.0, 1.0, 1.0], "intercept": -2.0}
    combination = {"rule": "max", "weights": [0.0, 0.0, 1.0], "intercept": 0.0}
    model = AlertModel(calibrated_ensemble(members, {"method": "temperature", "temperature": 1.0}), scorer,
                       calibration, combination).eval()
    fleet = fit_fleet_reference(*score_windows(scorer, features), np.repeat(np.arange(16), 16),
                                np.tile(np.arange(16) < 8, 16))
    example = {"features": features[:4], "reference_mean": np.tile(fleet.mean, (4, 1)),
               "reference_scale": np.tile(fleet.scale, (4, 1)),
               "reference_log_error": np.full(4, fleet.log_error, np.float32)}
    onnx_path = export_onnx(model, {k: torch.from_numpy(v) for k, v in example.items()}, INPUT_AXES, OUTPUTS,
                            root / "model.onnx")
    card = {"family": "sensor", "task": "classification", "target": "failure within 8 steps", "channels": CHANNELS,
            "window": WINDOW, "horizon": 8, "featurizer": featurizer.to_dict(), "threshold": 0.5, "ensemble_size": 2,
            "reference_steps": 40, "reference_windows": 8, "inputs": list(INPUT_AXES), "outputs": OUTPUTS,
            "novelty": {"fleet_reference": reference_to_dict(fleet),
                        "thresholds": {"novelty": 0.5, "combined": 0.5}, "calibration": calibration,
                        "combination": combination},
            "test_metrics": {"pr_auc": 0.5, "ece": 0.1}, "calibration_error": 0.1,
            "onnx_sha256": sha256_file(onnx_path)}
    return register_alone(root, card, onnx_path)


def settings(tmp_path, **extra) -> ServingSettings:
    return ServingSettings(**{**LIMITS, "prediction_store": f"sqlite:///{tmp_path / 'store.db'}", **extra})


def predict(client: TestClient, windows: np.ndarray, **extra) -> list[dict]:
    answer = client.post("/v1/sensor/predict", json={"windows": [window_json(w) for w in windows], **extra})
    assert answer.status_code == 200, answer.text
    return answer.json()["predictions"]


def put(client: TestClient, unit: str, windows: np.ndarray):
    return client.put(f"/v1/sensor/units/{unit}/reference", json={"windows": [window_json(w) for w in windows]})


def test_a_window_without_a_unit_reference_is_scored_against_the_fleet_and_says_so(novelty_store, tmp_path):
    windows = healthy(3, np.random.default_rng(1))
    with TestClient(create_app(settings(tmp_path), store=novelty_store)) as client:
        for extra in ({}, {"unit": "never-seen"}):
            for answer in predict(client, windows, **extra):
                assert answer["reference"] == "fleet"
                assert 0 <= answer["novelty_score"] <= 1 and 0 <= answer["alert_probability"] <= 1
                assert answer["alert"] == (answer["alert_probability"] >= 0.5)
                assert (answer["alert_source"] is None) == (not answer["alert"])


def test_a_units_reference_scores_its_windows_and_outlives_the_service(novelty_store, tmp_path):
    rng = np.random.default_rng(2)
    reference, later = healthy(8, rng), healthy(4, rng)
    faulty = later.copy()
    faulty[:, 1] *= 3.0  # one channel's swing tripled: no healthy window shows it
    with TestClient(create_app(settings(tmp_path), store=novelty_store)) as client:
        kept = put(client, "pump-1", reference)
        assert kept.status_code == 200, kept.text
        assert kept.json()["windows"] == 8 and kept.json()["channels"] == CHANNELS and kept.json()["steps"] == WINDOW
        assert client.get("/v1/sensor/units/pump-1/reference").json()["windows"] == 8
        answers = predict(client, np.concatenate([later, faulty]), unit="pump-1")
    assert all(a["reference"] == "unit" for a in answers)
    predictor = novelty_store.get("sensor").predictor  # the same graph, run directly
    own = predictor.reference(reference)
    expected = predictor.predict(np.concatenate([later, faulty]), [own] * 8)["novelty"]
    assert np.allclose([a["novelty_score"] for a in answers], expected, atol=1e-6)
    scores = np.array([a["novelty_score"] for a in answers])
    assert scores[4:].mean() > scores[:4].mean()
    with TestClient(create_app(settings(tmp_path), store=novelty_store)) as restarted:  # kept in the store
        assert restarted.get("/v1/sensor/units/pump-1/reference").status_code == 200
        again = predict(restarted, later, units=["pump-1"] * 2 + ["pump-2"] * 2)
    assert [a["reference"] for a in again] == ["unit"] * 2 + ["fleet"] * 2
    assert np.allclose([a["novelty_score"] for a in again[:2]], expected[:2], atol=1e-6)


def test_the_reference_endpoint_checks_shapes_and_limits(novelty_store, tmp_path):
    rng = np.random.default_rng(3)
    with TestClient(create_app(settings(tmp_path, max_units=2), store=novelty_store)) as client:
        short = [window_json(w)[:-1] for w in healthy(2, rng)]
        answer = client.put("/v1/sensor/units/a/reference", json={"windows": short})
        assert answer.status_code == 422 and f"exactly {WINDOW}" in answer.json()["detail"]
        answer = put(client, "a", healthy(LIMITS["max_items"] + 1, rng))
        assert answer.status_code == 422 and "SERVING_MAX_ITEMS" in answer.json()["detail"]
        assert client.put("/v1/sensor/units/a/reference", json={"windows": []}).status_code == 422
        assert put(client, "u" * 257, healthy(1, rng)).status_code == 422
        assert put(client, "a", healthy(2, rng)).status_code == 200
        assert put(client, "b", healthy(2, rng)).status_code == 200
        assert put(client, "a", healthy(3, rng)).json()["windows"] == 3  # replacing one is not a new unit
        full = put(client, "c", healthy(2, rng))
        assert full.status_code == 409 and "SERVING_MAX_UNITS=2" in full.json()["detail"]
        assert client.delete("/v1/sensor/units/b/reference").status_code == 204
        assert client.get("/v1/sensor/units/b/reference").status_code == 404
        assert client.delete("/v1/sensor/units/b/reference").status_code == 404
        assert put(client, "c", healthy(2, rng)).status_code == 200
        both = client.post("/v1/sensor/predict", json={"windows": [window_json(healthy(1, rng)[0])], "unit": "a",
                                                       "units": ["a"]})
        assert both.status_code == 422 and "not both" in both.json()["detail"]


def test_a_version_without_the_novelty_score_refuses_references(store, models, tmp_path):
    with TestClient(create_app(settings(tmp_path), store=store)) as client:
        answer = put(client, "a", models.test_windows[:1])
        assert answer.status_code == 409 and "takes no unit references" in answer.json()["detail"]
        assert "novelty_score" not in predict(client, models.test_windows[:1], unit="a")[0]


def test_a_store_that_cannot_be_used_refuses_references_and_scores_against_the_fleet(novelty_store, tmp_path):
    (tmp_path / "file").write_text("not a folder")
    broken = ServingSettings(**{**LIMITS, "prediction_store": f"sqlite:///{tmp_path / 'file' / 'store.db'}"})
    rng = np.random.default_rng(4)
    with TestClient(create_app(broken, store=novelty_store)) as client:
        refused = put(client, "pump-1", healthy(2, rng))
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "5"
        assert "cannot be used now" in refused.json()["detail"]
        assert client.get("/v1/sensor/units/pump-1/reference").status_code == 503
        answers = predict(client, healthy(2, rng), unit="pump-1")
    assert [a["reference"] for a in answers] == ["fleet", "fleet"]
