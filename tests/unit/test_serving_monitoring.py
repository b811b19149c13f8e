"""The service's monitoring wiring (serving/monitoring.py): drift per channel read by name from the stored window
summaries, the out-of-domain share of the stored molecules, and the outcome figures with their alarms."""

from __future__ import annotations

import numpy as np
import pytest

from contract.card import ModelCard
from contract.prediction_store import window_summaries
from flows.config import MonitorConfig
from models.drift import window_means
from models.monitoring import sensor_reference
from serving.loading import LoadedModel
from serving.families.molecule.monitoring import domain_report
from serving.families.sensor import SensorFamily
from serving.families.sensor.monitoring import sensor_drift_report
from serving.monitoring import outcome_report
from serving.settings import ServingSettings

CHANNELS = ["vibration", "temperature", "pressure"]
SETTINGS = ServingSettings(monitor_min_items=100)


def _windows(n: int, seed: int, shift=(0.0, 0.0, 0.0)) -> np.ndarray:
    """(n, T, C), the service's layout."""
    rng = np.random.default_rng(seed)
    levels = rng.normal(size=(n, 1, len(CHANNELS))) + np.array(shift)
    return rng.normal(loc=levels, size=(n, 16, len(CHANNELS))).astype(np.float32)


def _model(card: dict, reference: dict | None = None, version: str = "1") -> LoadedModel:
    return LoadedModel(card["family"], "model", version, "champion", "0" * 64, ModelCard.model_construct(**card), None,
                       reference)


def test_the_sensor_drift_reads_the_stored_summaries_of_the_recent_windows():
    """What the log stores of each window (its per-channel summary) is what the drift is computed from."""
    reference = sensor_reference(_windows(2000, 0).transpose(0, 2, 1), CHANNELS)
    model = _model({"family": "sensor", "task": "classification", "channels": CHANNELS}, reference)
    windows = _windows(300, 1, shift=(0.0, 2.0, 0.0))
    rows = [{"input_summary": summary, "output": {}} for summary in window_summaries(windows, CHANNELS)]
    family = SensorFamily.__new__(SensorFamily)
    family.settings = SETTINGS
    key, report, note = family.input_report(model, rows)
    assert key == "input_drift" and note is None and report["windows"] == 300 and report["alarm"]
    direct = sensor_drift_report(model, CHANNELS, window_means(windows.transpose(0, 2, 1)), SETTINGS)
    assert [r["psi"] for r in report["channels"]] == pytest.approx([r["psi"] for r in direct["channels"]], abs=1e-3)


def test_drift_is_read_by_channel_name_and_flags_the_shifted_channel_once_enough_windows_came():
    reference = sensor_reference(_windows(2000, 0).transpose(0, 2, 1), CHANNELS)
    model = _model({"family": "sensor", "task": "classification", "channels": CHANNELS}, reference)
    shifted = _windows(300, 1, shift=(0.0, 2.0, 0.0))[..., ::-1]  # sent in another channel order
    means = window_means(shifted.transpose(0, 2, 1))
    report = sensor_drift_report(model, CHANNELS[::-1], means, SETTINGS)
    drift = {row["channel"]: row for row in report["channels"]}
    assert list(drift) == CHANNELS and report["windows"] == 300 and report["alarm"]
    assert drift["temperature"]["psi"] > 1 and drift["temperature"]["ks"] > 0.5 and drift["temperature"]["alarm"]
    assert all(drift[c]["psi"] < 0.1 and not drift[c]["alarm"] for c in ("vibration", "pressure"))
    few = sensor_drift_report(model, CHANNELS[::-1], means[:50], SETTINGS)
    assert not few["alarm"] and next(r for r in few["channels"] if r["channel"] == "temperature")["psi"] > 1
    missing = sensor_drift_report(model, CHANNELS[:2], means[:, :2], SETTINGS)
    assert missing["channels"][2] == {"channel": "pressure", "psi": None, "ks": None, "n": 0, "alarm": False}


def test_the_out_of_domain_share_counts_the_molecules_with_a_domain():
    inside = {"canonical_smiles": "CCO", "nearest_similarity": 0.9, "in_domain": True, "descriptors_out_of_range": 0.0}
    outside = {"canonical_smiles": "C", "nearest_similarity": 0.1, "in_domain": False, "descriptors_out_of_range": 0.25}
    rows = [{"input_summary": summary, "output": {}} for summary in [inside] * 3 + [outside] + [{"smiles": "x"}]]
    report = domain_report(rows, SETTINGS)
    assert report["molecules"] == 4 and report["out_of_domain"] == 0.25 and report["out_of_range_any"] == 0.25
    assert report["nearest_similarity_mean"] == pytest.approx(0.7) and not report["alarm"]  # fewer than 100


def _labelled(outputs: list[dict], observed: list[float]) -> list[dict]:
    return [{"output": o, "observed": y} for o, y in zip(outputs, observed)]


def test_classifier_outcomes_give_brier_ece_and_pr_auc_and_the_calibration_alarm():
    card = {"family": "sensor", "task": "classification"}
    rows = _labelled([{"failure_probability": 0.9}] * 100 + [{"failure_probability": 0.1}] * 100, [0.0] * 200)
    rows[0]["observed"] = 1.0
    report = outcome_report(_model(card), rows, SETTINGS)
    assert report["outcomes"] == 200
    assert report["metrics"]["brier"] == pytest.approx((0.01 + 99 * 0.81 + 100 * 0.01) / 200)
    assert report["metrics"]["ece"] == pytest.approx(0.5 * 0.89 + 0.5 * 0.1) and report["calibration_error"] > 0.07
    assert report["metrics"]["pr_auc"] == pytest.approx(0.01) and report["alarm"]
    assert not outcome_report(_model(card), rows[:99], SETTINGS)["alarm"]  # fewer than monitor_min_items


def test_regression_outcomes_give_rmse_and_the_interval_coverage():
    card = {"family": "molecule", "task": "regression", "calibration": {"interval_z": 2.0, "nominal_coverage": 0.95}}
    outputs = [{"value": 1.0, "uncertainty": 0.5}] * 4 + [{"error": "unparsed"}]
    report = outcome_report(_model(card), _labelled(outputs, [1.0, 1.5, 2.0, 3.0, 0.0]), SETTINGS)
    assert report["outcomes"] == 4 and report["metrics"]["rmse"] == pytest.approx(np.sqrt((0.25 + 1 + 4) / 4))
    assert report["metrics"]["coverage"] == 0.75 and report["calibration_error"] == pytest.approx(0.2)
    plain = outcome_report(_model({"family": "molecule", "task": "regression"}), _labelled(outputs[:1], [2.0]),
                           SETTINGS)
    assert plain["metrics"] == {"rmse": 1.0} and plain["calibration_error"] is None and not plain["alarm"]


def test_the_alarm_thresholds_default_to_the_monitor_flows():
    defaults, flow = ServingSettings(), MonitorConfig()
    assert (defaults.monitor_max_psi, defaults.monitor_min_similarity, defaults.monitor_max_out_of_domain,
            defaults.monitor_max_ece, defaults.monitor_max_coverage_error, defaults.monitor_min_items,
            defaults.monitor_drift_window, defaults.monitor_outcome_window) == (
        flow.max_psi, flow.min_similarity, flow.max_out_of_domain, flow.max_ece, flow.max_coverage_error,
        flow.min_outcomes, flow.drift_window, flow.window)


class _Store:
    """The two things the monitor asks a ServedModels: the families and the model served for one."""

    def __init__(self, model: LoadedModel):
        self.names, self.model = {"molecule": "model"}, model

    def get(self, family: str) -> LoadedModel:
        return self.model


def test_a_store_that_cannot_be_read_keeps_the_last_outcome_figures_with_a_note(tmp_path):
    from contract.prediction_store import connect, insert_predictions, record_outcomes, utc_now
    from serving.metrics import ServiceMetrics
    from serving.families.molecule import MoleculeFamily
    from serving.monitoring import Monitor
    from serving.prediction_log import PredictionLog

    url = f"sqlite:///{tmp_path / 'predictions.db'}"
    model = _model({"family": "molecule", "task": "regression"})
    insert_predictions(connect(url), [{
        "id": "a" * 32, "created_at": utc_now(), "family": "molecule", "model_name": "model", "model_version": "1",
        "role": "champion", "request_id": "r", "input_digest": "0" * 64, "input_summary": {},
        "output": {"value": 1.0}}])
    record_outcomes(connect(url), {"a" * 32: ("molecule", 3.0)})
    settings = ServingSettings(prediction_store=url)
    metrics = ServiceMetrics()
    monitor = Monitor(_Store(model), settings, metrics, PredictionLog.from_settings(settings, metrics),
                      {"molecule": MoleculeFamily(settings, metrics)})
    monitor.refresh()
    first = monitor.answer()["families"]["molecule"]
    assert first["outcomes"]["metrics"] == {"rmse": 2.0} and first["notes"][0].startswith("no applicability domain")
    monitor.prediction_log.writer.engine.dispose()
    for path in tmp_path.glob("predictions.db*"):  # the database and its write-ahead log (not the journal's folder)
        if path.is_file():
            path.unlink()
    (tmp_path / "predictions.db").write_bytes(b"not a database" * 512)
    monitor.refresh()
    second = monitor.answer()["families"]["molecule"]
    assert second["outcomes"] == first["outcomes"]  # the same figures, with the time they were computed
    assert "the prediction store cannot be read" in second["notes"][-1]
    assert 'serving_outcome_metric{family="molecule",metric="rmse"} 2.0' in metrics.render().decode()
