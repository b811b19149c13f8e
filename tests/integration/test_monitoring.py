"""The monitor end to end on the drift scenario (bench/drift_scenario.py): a logistic sensor ensemble trained
on a plant's reference fleet is registered with its training reference and served (the real app, ONNX Runtime);
a drifted fleet (another operating point, another failure prevalence) is replayed through the HTTP API with its
units and times, and its outcomes sent to /v1/feedback by unit and time, so they reach the real SQLite prediction
store as in production; the `monitor` flow (real Prefect, MLflow) raises the calibration alarm, recalibrates,
gates and promotes, and the new version is calibrated on drifted windows none of the models saw.
bench/monitoring.py measures the figures."""

from __future__ import annotations

import json

import numpy as np
import pytest
from mlflow import MlflowClient

from contract.manifest import load_verify_key, public_key_path
from contract.registry import CHAMPION, alias_version
from flows.monitor import monitor
from bench.drift_scenario import Scenario, fleet_stream, register_model, train_reference_model, write_params
from flows.params import load_params
from flows.tracking import signing_key, use_tracking
from models.metrics import expected_calibration_error
from serving.loading import load_version
from tests.integration.replay import predict, send_outcomes, service

pytestmark = pytest.mark.integration

OUTCOMES = 1000
PER_REQUEST = 50


@pytest.fixture(scope="module")
def monitored(tmp_path_factory):
    root = tmp_path_factory.mktemp("monitor")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)  # the flow's workspace
        params_file = write_params(root, {"window": OUTCOMES, "min_outcomes": 200})
        params = load_params(params_file)
        use_tracking(params.tracking)
        scenario = Scenario()
        first = register_model(params, train_reference_model(scenario, root / "export"))
        client, name = MlflowClient(), params.sensor.registry.model_name
        key = load_verify_key(public_key_path(signing_key(params.tracking)))
        champion = load_version(client, "sensor", name, str(first["registered_version"]), CHAMPION, key, False)
        stream = fleet_stream(scenario, seed=101, drifted=True).head(OUTCOMES)
        with service(params_file, params.monitor.store_url) as served:
            answers = [predict(served, stream, start, PER_REQUEST) for start in range(0, OUTCOMES, PER_REQUEST)]
            windows = stream.windows
            send_outcomes(served, [{"unit": str(unit), "time": float(time_), "label": float(label)}
                                   for unit, time_, label in zip(windows.unit, windows.time, windows.y)])
        first_run = monitor(params_file=str(params_file))
        second_run = monitor(params_file=str(params_file))
        yield {"params": params, "client": client, "name": name, "key": key, "champion": champion,
               "scenario": scenario, "answers": answers, "first": first_run, "second": second_run}


def test_the_registered_version_carries_its_signed_training_reference(monitored):
    champion = monitored["champion"]
    assert champion.reference is not None
    assert champion.reference["channels"].tolist() == champion.card.channels
    assert champion.reference["psi_proportions"].sum(axis=1) == pytest.approx(np.ones(len(champion.card.channels)))


def test_the_served_champion_answered_the_replayed_fleet(monitored):
    answered = [p for answer in monitored["answers"] for p in answer["predictions"]]
    assert len(answered) == OUTCOMES and len({p["prediction_id"] for p in answered}) == OUTCOMES
    assert {answer["model"]["version"] for answer in monitored["answers"]} == {monitored["champion"].version}


def test_the_drift_raises_the_calibration_and_input_alarms(monitored):
    report = monitored["first"]["sensor"]
    assert report["outcomes"]["n"] == OUTCOMES and report["outcomes"]["metrics"]["ece"] > 0.1
    assert any(a.startswith("calibration: ECE") for a in report["alarms"])
    assert any(a.startswith("input drift: PSI") for a in report["alarms"])
    assert monitored["first"]["molecule"] == {"skipped": f"{monitored['params'].molecule.registry.model_name} has no champion"}


def test_the_recalibrated_version_passes_the_gate_with_lineage_to_its_outcomes(monitored):
    client, name = monitored["client"], monitored["name"]
    recalibration = monitored["first"]["sensor"]["recalibration"]
    assert recalibration["promoted"] and recalibration["calibration_error_after"] < recalibration["calibration_error_before"]
    version = str(recalibration["registered_version"])
    assert alias_version(client, name, CHAMPION) == version
    tags = client.get_model_version(name, version).tags
    assert tags["data.outcomes.outcomes"] == str(OUTCOMES) and tags["data.outcomes.base_version"] == "1"
    assert tags["data.outcomes.store"] == monitored["params"].monitor.store_url
    assert tags["data.outcomes.fitted_on"] == "700" and tags["data.outcomes.held_out"] == "300"


def test_the_new_champion_is_calibrated_on_drifted_windows_it_never_saw(monitored):
    old = monitored["champion"]
    new = load_version(monitored["client"], "sensor", monitored["name"],
                       alias_version(monitored["client"], monitored["name"], CHAMPION), CHAMPION, monitored["key"], False)
    assert new.reference is not None and np.array_equal(new.reference["summary_sample"], old.reference["summary_sample"])
    assert new.card.recalibrations[0]["base_version"] == "1" and new.card.threshold != old.card.threshold
    fresh = fleet_stream(monitored["scenario"], seed=202, drifted=True).windows
    before = expected_calibration_error(fresh.y, old.predictor.predict(fresh.X)["probability"])
    after = expected_calibration_error(fresh.y, new.predictor.predict(fresh.X)["probability"])
    assert before > 0.08 and after < 0.05


def test_the_monitor_runs_are_logged_and_a_quiet_champion_is_left_alone(monitored):
    client = monitored["client"]
    experiment = client.get_experiment_by_name("sensor")
    runs = client.search_runs([experiment.experiment_id], "tags.stage = 'monitor'", order_by=["attributes.start_time"])
    assert len(runs) == 2 and runs[0].data.metrics["outcome_ece"] > 0.1
    report = json.loads(open(client.download_artifacts(runs[0].info.run_id, "monitor_report.json")).read())
    assert report["version"] == "1" and report["alarms"]
    # the new champion has answered nothing yet: no outcomes, no alarm, no new version
    second = monitored["second"]["sensor"]
    assert second["version"] == str(monitored["first"]["sensor"]["recalibration"]["registered_version"])
    assert second["alarms"] == [] and "recalibration" not in second
