"""Relative channels through the real service: a sensor version whose featurizer also gives each channel relative
to its unit's level (data/sensors/featurize.py), without a novelty score, registered through the gate and served.
It takes unit references; a unit's windows are answered against its own level (the predictor's answers with the
unit's reference), a unit without one with its relative channels masked, and each answer says which."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from contract.manifest import sha256_file
from data.sensors.featurize import WindowFeaturizer, reference_levels
from models.export import export_onnx
from models.sensor.calibrated import calibrated_ensemble
from models.sensor.config import SensorModelConfig
from models.sensor.network import SensorClassifier
from serving.app import create_app
from serving.settings import ServingSettings
from serving.served_models import ServedModels
from tests.integration.test_serving import LIMITS, window_json
from tests.integration.test_serving_registry import CHANNELS, WINDOW, register_alone

pytestmark = pytest.mark.integration
TINY = SensorModelConfig(hidden=8, layers=2, dropout=0.0, attention_layers=0, projection=4, statistics_bins=0)


@pytest.fixture(scope="session")
def prefect_api():
    """No flow runs here: no Prefect server (overrides the integration conftest's)."""


def pump(n: int, level: float, rng: np.random.Generator) -> np.ndarray:
    """(n, C, T) noisy readings around `level` on every channel."""
    return (level + rng.normal(size=(n, len(CHANNELS), WINDOW))).astype(np.float32)


@pytest.fixture(scope="module")
def relative_store(tmp_path_factory) -> ServedModels:
    """A registry holding one sensor version with relative channels (members untrained: only how the service feeds
    them is judged here), trained on two pumps, at levels 0 and 10."""
    root = tmp_path_factory.mktemp("relative-registry")
    rng = np.random.default_rng(0)
    train = np.concatenate([pump(32, 0.0, rng), pump(32, 10.0, rng)])
    units, times = np.repeat(["low", "high"], 32), np.tile(np.arange(32), 2)
    featurizer = WindowFeaturizer(CHANNELS, relative=True).fit(train, reference_levels(train, units, times, 8))
    torch.manual_seed(0)
    members = [SensorClassifier(featurizer.width, TINY).eval() for _ in range(2)]
    model = calibrated_ensemble(members, {"method": "temperature", "temperature": 1.0}).eval()
    onnx_path = export_onnx(model, {"features": torch.from_numpy(featurizer.transform(train[:4]))},
                            {"features": {0: "batch", 2: "time"}}, ["probability", "uncertainty"], root / "model.onnx")
    card = {"family": "sensor", "task": "classification", "target": "failure within 8 steps", "channels": CHANNELS,
            "window": WINDOW, "horizon": 8, "featurizer": featurizer.to_dict(), "threshold": 0.5, "ensemble_size": 2,
            "reference_steps": 40, "reference_windows": 8, "inputs": ["features"],
            "outputs": ["probability", "uncertainty"], "test_metrics": {"pr_auc": 0.5, "ece": 0.1},
            "calibration_error": 0.1, "onnx_sha256": sha256_file(onnx_path)}
    return register_alone(root, card, onnx_path)


def test_a_units_windows_are_answered_against_its_own_level_or_without_one(relative_store, tmp_path):
    rng = np.random.default_rng(1)
    reference, later = pump(6, 25.0, rng), pump(4, 25.0, rng)  # a pump at a level no training pump ran at
    settings = ServingSettings(**{**LIMITS, "prediction_store": f"sqlite:///{tmp_path / 'store.db'}"})
    with TestClient(create_app(settings, store=relative_store)) as client:
        kept = client.put("/v1/sensor/units/pump-9/reference", json={"windows": [window_json(w) for w in reference]})
        assert kept.status_code == 200, kept.text
        answer = client.post("/v1/sensor/predict", json={"windows": [window_json(w) for w in later],
                                                        "units": ["pump-9", "pump-9", "pump-0", "pump-0"]})
        assert answer.status_code == 200, answer.text
    rows = answer.json()["predictions"]
    assert [r["reference"] for r in rows] == ["unit", "unit", "fleet", "fleet"]
    assert all("novelty_score" not in r for r in rows)
    predictor = relative_store.get("sensor").predictor
    own = predictor.reference(reference)
    np.testing.assert_allclose(own.levels, reference.astype(np.float64).mean(axis=(0, 2)), rtol=1e-6)
    assert own.departure is None
    with_own = predictor.predict(later, [own] * 4)["probability"]
    without = predictor.predict(later)["probability"]
    got = np.array([r["failure_probability"] for r in rows])
    np.testing.assert_allclose(got[:2], with_own[:2], atol=1e-6)
    np.testing.assert_allclose(got[2:], without[2:], atol=1e-6)
    assert np.abs(with_own - without).max() > 1e-4  # the unit's level changes what the members see
