"""The prediction log and /v1/feedback against the real service and a SQLite store: ids, the rows written
(read back through the contract), outcomes by id and by unit and time, idempotency, replacement, unknown ids,
validation, a store that cannot be written, the log switched off, and the API key."""

from __future__ import annotations

import hashlib
import threading
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from contract.prediction_store import connect, insert_predictions, read_outcomes, read_predictions, utc_now
from serving.app import create_app
from serving.prediction_log import _new_ids
from serving.settings import ServingSettings
from tests.integration.test_serving import LIMITS, models, registry, store, wait_ready, window_json  # noqa: F401
from tests.integration.test_serving_registry import CHANNELS, MOLECULE_NAME, SENSOR_NAME

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def prefect_api():
    """No flow runs here: no Prefect server (overrides the integration conftest's)."""


@pytest.fixture(scope="module")
def store_url(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('prediction-log') / 'predictions.db'}"


@pytest.fixture(scope="module")
def client(store, store_url):
    with TestClient(create_app(ServingSettings(**LIMITS, prediction_store=store_url), store=store)) as client:
        wait_ready(client)
        yield client


def written(client: TestClient, store_url: str) -> dict[str, dict]:
    """Every row in the store once the queued ones are written: {id: row with its outcome}."""
    assert client.app.state.service.log.writer.flush(timeout_s=30)
    return {row["id"]: row for row in read_predictions(connect(store_url))}


def outcomes(store_url: str) -> dict[str, float]:
    return {o["prediction_id"]: o["observed"] for o in read_outcomes(connect(store_url))}


def sensor(client: TestClient, windows: np.ndarray, **extra) -> list[dict]:
    answer = client.post("/v1/sensor/predict", json={"windows": [window_json(w) for w in windows], **extra})
    assert answer.status_code == 200, answer.text
    return answer.json()["predictions"]


def feedback(client: TestClient, *items: dict, status: int = 200) -> dict:
    answer = client.post("/v1/feedback", json={"outcomes": list(items)})
    assert answer.status_code == status, answer.text
    return answer.json()


def test_every_answer_has_its_own_id_and_its_row_in_the_store(client, store_url, models):
    windows = models.test_windows[:3].copy()
    windows[1, 2, 5:9] = np.nan  # four missing readings of the third channel
    answered = sensor(client, windows, units=["pump-1", "pump-2", "pump-3"], times=[100.0, 100.0, 104.5])
    molecules = client.post("/v1/molecule/predict", json={"smiles": ["OCC", "not a molecule", "c1ccccc1"]})
    ethanol, broken, benzene = molecules.json()["predictions"]
    ids = [p["prediction_id"] for p in answered] + [ethanol["prediction_id"], benzene["prediction_id"]]
    assert len(set(ids)) == 5 and all(len(key) == 32 for key in ids)
    assert "prediction_id" not in broken and ethanol["canonical_smiles"] == "CCO"

    rows = written(client, store_url)
    for answer, window, unit, at in zip(answered, windows, ["pump-1", "pump-2", "pump-3"], [100.0, 100.0, 104.5]):
        row = rows[answer["prediction_id"]]
        assert (row["family"], row["model_name"], row["model_version"], row["role"]) == (
            "sensor", SENSOR_NAME, "2", "champion")
        assert (row["unit"], row["time"]) == (unit, at)
        assert row["output"] == {k: v for k, v in answer.items() if k != "prediction_id"}
        as_sent = np.array(window_json(window), dtype=np.float32)  # (T, C)
        assert row["input_digest"] == hashlib.sha256(as_sent.tobytes()).hexdigest()
        summary = row["input_summary"]
        assert summary["channels"] == CHANNELS
        for c in range(len(CHANNELS)):
            readings = as_sent[:, c][~np.isnan(as_sent[:, c])].astype(np.float64)
            assert summary["mean"][c] == pytest.approx(readings.mean(), rel=1e-5)
            assert summary["std"][c] == pytest.approx(readings.std(), rel=1e-5)
            assert (summary["min"][c], summary["max"][c]) == pytest.approx((readings.min(), readings.max()), rel=1e-5)
    assert rows[answered[1]["prediction_id"]]["input_summary"]["missing"] == [0.0, 0.0, 4 / 16]
    assert len({rows[p["prediction_id"]]["request_id"] for p in answered}) == 1

    logged = rows[ethanol["prediction_id"]]
    assert (logged["family"], logged["model_name"], logged["model_version"]) == ("molecule", MOLECULE_NAME, "1")
    # ethanol is a training molecule of the version's reference: its applicability domain goes with the input
    assert logged["input_summary"] == {"canonical_smiles": "CCO", "nearest_similarity": 1.0, "in_domain": True,
                                       "descriptors_out_of_range": 0.0}
    assert logged["input_digest"] == hashlib.sha256(b"OCC").hexdigest()
    assert ethanol["modality"] == "fused"  # which views answered is part of the output
    assert logged["output"] == {"value": ethanol["value"], "uncertainty": ethanol["uncertainty"], "modality": "fused"}
    assert (logged["unit"], logged["time"]) == (None, None)


def test_feedback_by_id_is_idempotent_and_a_changed_outcome_replaces_the_old(client, store_url, models):
    first, second = sensor(client, models.test_windows[3:5])
    molecule = client.post("/v1/molecule/predict", json={"smiles": ["CCN"]}).json()["predictions"][0]
    items = [{"prediction_id": first["prediction_id"], "observed": 1},
             {"prediction_id": second["prediction_id"], "observed": 0.0},
             {"prediction_id": molecule["prediction_id"], "observed": -2.75}]
    answer = feedback(client, *items)
    assert (answer["accepted"], answer["replaced"], answer["unknown"]) == (3, 0, 0)
    assert [item["prediction_ids"] for item in answer["items"]] == [[i["prediction_id"]] for i in items]
    assert feedback(client, *items) == answer  # sent again: the same answer, still one row each
    stored = outcomes(store_url)
    assert [stored[i["prediction_id"]] for i in items] == [1.0, 0.0, -2.75]

    changed = feedback(client, {"prediction_id": first["prediction_id"], "observed": 0}, items[1])
    assert (changed["accepted"], changed["replaced"], changed["unknown"]) == (1, 1, 0)
    assert changed["items"][0] == {"status": "replaced", "prediction_ids": [first["prediction_id"]],
                                   "previous": {first["prediction_id"]: 1.0}}
    assert outcomes(store_url)[first["prediction_id"]] == 0.0
    rows = written(client, store_url)
    assert rows[first["prediction_id"]]["observed"] == 0.0 and rows[molecule["prediction_id"]]["observed"] == -2.75


def test_feedback_by_unit_and_time_applies_to_every_prediction_of_that_unit_then(client, store_url, models):
    window = models.test_windows[5:6]
    (a,) = sensor(client, window, units=["press-9"], times=[1_764_547_200.0])
    (b,) = sensor(client, window, units=["press-9"], times=[1_764_547_200.0])  # the same window sent again
    (other,) = sensor(client, window, units=["press-9"], times=[1_764_547_260.0])
    answer = feedback(client, {"unit": "press-9", "time": 1_764_547_200.0, "label": 1})
    assert answer["accepted"] == 1 and sorted(answer["items"][0]["prediction_ids"]) == sorted(
        [a["prediction_id"], b["prediction_id"]])
    stored = outcomes(store_url)
    assert stored[a["prediction_id"]] == stored[b["prediction_id"]] == 1.0 and other["prediction_id"] not in stored
    unknown = feedback(client, {"unit": "press-9", "time": 5.0, "label": 0})
    assert unknown["unknown"] == 1 and "unit 'press-9' at time 5" in unknown["items"][0]["detail"]


def test_unknown_ids_are_reported_per_item_and_the_others_stored(client, store_url, models):
    (known,) = sensor(client, models.test_windows[6:7])
    answer = feedback(client, {"prediction_id": "f" * 32, "observed": 1},
                      {"prediction_id": known["prediction_id"], "observed": 1})
    assert (answer["accepted"], answer["replaced"], answer["unknown"]) == (1, 0, 1)
    assert answer["items"][0]["status"] == "unknown" and "f" * 32 in answer["items"][0]["detail"]
    assert outcomes(store_url)[known["prediction_id"]] == 1.0 and "f" * 32 not in outcomes(store_url)


@pytest.mark.parametrize(("items", "message"), [
    ([{"prediction_id": "x", "observed": 2}, {"unit": "u", "time": 1, "label": 2}],
     "body.outcomes.1: Value error, `label` is 2; a sensor label is 0 or 1"),
    ([{"prediction_id": "x"}], "body.outcomes.0: Value error, give either `prediction_id` and `observed`"),
    ([{"prediction_id": "x", "observed": 1, "unit": "u"}], "give either"),
    ([{"unit": "u", "time": 1}], "give either"),
    ([{"prediction_id": "x", "observed": True}], "body.outcomes.0.observed: Input should be a valid number"),
    ([{"prediction_id": "x", "observed": "1"}], "valid number"),
    ([{"prediction_id": "x", "observed": 1, "note": "?"}], "Extra inputs"),
    ([], "at least 1 item"),
    ([{"prediction_id": "x", "observed": 1}] * 9, "9 outcomes in one request; at most 8"),
])
def test_malformed_feedback_is_a_422_naming_the_item(client, items, message):
    answer = feedback(client, *items, status=422)
    assert message in answer["detail"]


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_outcomes_are_refused(client, literal):
    body = '{"outcomes": [{"prediction_id": "x", "observed": %s}]}' % literal
    answer = client.post("/v1/feedback", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 422 and "finite number" in answer.json()["detail"]


def test_a_classifier_outcome_that_is_not_0_or_1_is_a_422_and_nothing_is_stored(client, store_url, models):
    first, second = sensor(client, models.test_windows[7:9])
    answer = feedback(client, {"prediction_id": first["prediction_id"], "observed": 1},
                      {"prediction_id": second["prediction_id"], "observed": 0.7}, status=422)
    assert answer["detail"] == (f"outcomes[1].observed is 0.7, but prediction {second['prediction_id']} is a "
                                f"classifier's (sensor): send 0 or 1")
    conflicting = feedback(client, {"prediction_id": first["prediction_id"], "observed": 1},
                           {"prediction_id": first["prediction_id"], "observed": 0}, status=422)
    assert "outcomes[1] gives prediction" in conflicting["detail"] and "outcomes[0]" in conflicting["detail"]
    assert first["prediction_id"] not in outcomes(store_url)


def test_units_and_times_are_one_per_window(client, models):
    body = {"windows": [window_json(w) for w in models.test_windows[:2]], "units": ["pump-1"]}
    answer = client.post("/v1/sensor/predict", json=body)
    assert answer.status_code == 422 and "`units` has 1 entries for 2 windows" in answer.json()["detail"]
    body = {"windows": [window_json(models.test_windows[0])], "times": ["2026-12-01"]}
    assert client.post("/v1/sensor/predict", json=body).status_code == 422


def test_the_log_shows_in_the_metrics(client, models):
    sensor(client, models.test_windows[:1])
    assert client.app.state.service.log.writer.flush(timeout_s=30)
    text = client.get("/metrics").text
    written_rows = next(line for line in text.splitlines() if line.startswith("serving_prediction_log_written_rows_total"))
    assert float(written_rows.split()[-1]) >= 1
    assert "serving_prediction_log_queue_rows 0.0" in text


def test_a_store_that_cannot_be_written_leaves_the_answers_alone_and_the_log_resumes(store, models, tmp_path, caplog):
    """While the store's folder is a file: answers as usual, /ready and /v1/monitoring say the log is failing,
    feedback is a 503 to retry; once the folder can be made, every row is written without a restart."""
    blocker = tmp_path / "store"
    blocker.write_text("not a folder")
    url = f"sqlite:///{blocker / 'p.db'}"
    with TestClient(create_app(ServingSettings(**LIMITS, prediction_store=url), store=store)) as broken:
        wait_ready(broken)
        answered = [p for _ in range(3) for p in sensor(broken, models.test_windows[:2])]
        assert all(p["prediction_id"] and 0 <= p["failure_probability"] <= 1 for p in answered)
        writer = broken.app.state.service.log.writer
        deadline = time.monotonic() + 60
        while writer.failing is None:
            assert time.monotonic() < deadline, "the log never said the store is failing"
            time.sleep(0.05)
        ready = broken.get("/ready")
        assert ready.status_code == 200 and ready.json()["prediction_log"].startswith("the store cannot be written")
        assert broken.get("/v1/monitoring").json()["prediction_log"] == ready.json()["prediction_log"]
        refused = broken.post("/v1/feedback", json={"outcomes": [{"prediction_id": answered[0]["prediction_id"],
                                                                   "observed": 1}]})
        assert refused.status_code == 503 and "retry" in refused.json()["detail"]
        assert refused.headers["Retry-After"]
        blocker.unlink()
        blocker.mkdir()
        assert writer.flush(timeout_s=60)
        assert broken.get("/ready").json()["prediction_log"] == "ok"
        assert feedback(broken, {"prediction_id": answered[0]["prediction_id"], "observed": 1})["accepted"] == 1
        assert 'serving_prediction_log_dropped_rows_total{reason="store_error"}' not in broken.get("/metrics").text
    assert {row["id"] for row in read_predictions(connect(url))} == {p["prediction_id"] for p in answered}
    warnings = [r for r in caplog.records if "cannot write to the prediction store" in r.getMessage()]
    assert len(warnings) == 1


def test_feedback_waits_for_a_prediction_another_worker_still_holds(client, store_url):
    """A prediction made just now by another worker reaches the store a moment later: feedback sent at once finds
    it (the id says when it was made), where an id of long ago is unknown at once."""
    [fresh, old] = _new_ids(1) + [f"{0:012x}" + "0" * 20]
    row = {"id": fresh, "created_at": utc_now(), "family": "sensor", "model_name": SENSOR_NAME, "model_version": "1",
           "role": "champion", "request_id": fresh, "unit": None, "time": None, "input_digest": "0" * 64,
           "input_summary": {}, "output": {"failure_probability": 0.5}}
    other_worker = threading.Timer(0.5, insert_predictions, args=(connect(store_url), [row]))
    other_worker.start()
    answer = feedback(client, {"prediction_id": fresh, "observed": 1}, {"prediction_id": old, "observed": 0})
    other_worker.join()
    assert [item["status"] for item in answer["items"]] == ["accepted", "unknown"], answer


def test_with_the_log_off_answers_carry_no_id_and_feedback_says_so(store, models, tmp_path):
    settings = ServingSettings(**LIMITS, prediction_log=False, prediction_store=f"sqlite:///{tmp_path / 'p.db'}")
    with TestClient(create_app(settings, store=store)) as unlogged:
        wait_ready(unlogged)
        assert "prediction_id" not in sensor(unlogged, models.test_windows[:1])[0]
        answer = unlogged.post("/v1/feedback", json={"outcomes": [{"prediction_id": "x", "observed": 1}]})
        assert answer.status_code == 404 and "SERVING_PREDICTION_LOG=false" in answer.json()["detail"]
    assert not (tmp_path / "p.db").exists()


def test_feedback_needs_the_api_key(store, tmp_path):
    settings = ServingSettings(**LIMITS, api_key="s3cret", prediction_store=f"sqlite:///{tmp_path / 'p.db'}")
    with TestClient(create_app(settings, store=store)) as guarded:
        body = {"outcomes": [{"prediction_id": "x", "observed": 1}]}
        assert guarded.post("/v1/feedback", json=body).status_code == 401
        answer = guarded.post("/v1/feedback", json=body, headers={"Authorization": "Bearer s3cret"})
        assert answer.status_code == 200 and answer.json()["unknown"] == 1


def test_the_feedback_route_is_documented(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert "/v1/feedback" in paths
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    assert "prediction_id" in schemas["SensorPrediction"]["properties"]
    assert "prediction_id" in schemas["MoleculePrediction"]["properties"]
