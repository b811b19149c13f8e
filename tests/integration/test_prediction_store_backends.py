"""The prediction store on both backends: the SQLite default and a real PostgreSQL cluster started here. The
service writes its predictions there, feedback lands, the contract's readers return both, prune deletes; a store
made before the rollout columns gets them. On the same PostgreSQL server, MLflow's tracking store and registry:
versions registered through the gate and served from there."""

from __future__ import annotations

import datetime

import numpy as np
import pytest
from fastapi.testclient import TestClient

from sqlalchemy import Column, DateTime, Float, MetaData, String, Table, create_engine, inspect, text
from sqlalchemy.engine import make_url

from contract.prediction_store import (ADDED_COLUMNS, connect, insert_predictions, predictions, prune, read_outcomes,
                                       read_predictions, record_outcomes, utc_now)
from serving.app import create_app
from serving.settings import ServingSettings
from tests.integration.postgres import throwaway_cluster
from tests.integration.test_serving import LIMITS, models, registry, store, wait_ready, window_json  # noqa: F401
from serving.served_models import ServedModels
from tests.integration.test_serving_registry import CHANNELS, MOLECULE_NAME, SENSOR_NAME, build_registry

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def prefect_api():
    """No flow runs here: no Prefect server (overrides the integration conftest's)."""


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def store_url(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "sqlite":
        yield f"sqlite:///{folder / 'predictions.db'}"
    else:
        with throwaway_cluster(folder) as url:
            yield url


def test_the_service_logs_feedback_lands_and_the_readers_return_both(store, store_url, models):
    windows = models.test_windows[:2].copy()
    windows[1, 0, :] = np.nan  # a channel with no reading at all: its statistics are null in JSON
    settings = ServingSettings(**LIMITS, prediction_store=store_url)
    with TestClient(create_app(settings, store=store)) as client:
        wait_ready(client)
        sensor = client.post("/v1/sensor/predict", json={"windows": [window_json(w) for w in windows],
                                                         "units": ["pump-1", "pump-2"], "times": [10.0, 10.0]})
        molecule = client.post("/v1/molecule/predict", json={"smiles": ["CCO", "c1ccccc1O"]})
        assert sensor.status_code == molecule.status_code == 200, (sensor.text, molecule.text)
        (first, second), (ethanol, phenol) = sensor.json()["predictions"], molecule.json()["predictions"]
        answer = client.post("/v1/feedback", json={"outcomes": [
            {"unit": "pump-2", "time": 10.0, "label": 1},
            {"prediction_id": ethanol["prediction_id"], "observed": 0.5},
            {"prediction_id": "0" * 32, "observed": 1}]}).json()
        assert (answer["accepted"], answer["replaced"], answer["unknown"]) == (2, 0, 1)
        again = client.post("/v1/feedback", json={"outcomes": [
            {"prediction_id": second["prediction_id"], "observed": 1},
            {"prediction_id": ethanol["prediction_id"], "observed": -1.25}]}).json()
        assert (again["accepted"], again["replaced"]) == (1, 1)
        assert again["items"][1]["previous"] == {ethanol["prediction_id"]: 0.5}

    engine = connect(store_url)
    rows = {row["id"]: row for row in read_predictions(engine)}
    assert set(rows) == {p["prediction_id"] for p in (first, second, ethanol, phenol)}
    summary = rows[second["prediction_id"]]["input_summary"]
    assert summary["channels"] == CHANNELS and summary["missing"][0] == 1.0
    assert [summary[stat][0] for stat in ("mean", "std", "min", "max")] == [None] * 4
    assert rows[first["prediction_id"]]["unit"] == "pump-1" and rows[first["prediction_id"]]["observed"] is None
    assert rows[second["prediction_id"]]["observed"] == 1.0
    assert rows[ethanol["prediction_id"]]["observed"] == -1.25
    assert rows[phenol["prediction_id"]]["input_summary"] == {  # phenol is one of the tiny model's training molecules
        "canonical_smiles": "Oc1ccccc1", "nearest_similarity": 1.0, "in_domain": True, "descriptors_out_of_range": 0.0}
    assert {row["model_version"] for row in rows.values() if row["family"] == "sensor"} == {"2"}
    assert all(row["created_at"].tzinfo is not None for row in rows.values())
    assert {o["prediction_id"]: o["observed"] for o in read_outcomes(engine, family="molecule")} == {
        ethanol["prediction_id"]: -1.25}
    assert len(read_outcomes(engine)) == 2

    old = {**rows[first["prediction_id"]], "id": "old", "created_at": utc_now() - datetime.timedelta(days=400)}
    insert_predictions(engine, [{k: v for k, v in old.items() if k not in ("observed", "received_at")}])
    record_outcomes(engine, {"old": ("sensor", 0.0)})
    assert prune(engine, utc_now() - datetime.timedelta(days=90), max_rows=3) == 2  # "old", then the oldest of 4
    left = read_predictions(engine)
    assert len(left) == 3 and "old" not in {row["id"] for row in left}
    assert "old" not in {o["prediction_id"] for o in read_outcomes(engine)}
    engine.dispose()


def test_a_store_made_before_the_rollout_columns_gets_them_and_keeps_its_rows(store_url, tmp_path):
    url = make_url(store_url)
    if url.get_backend_name() == "sqlite":
        old_url = f"sqlite:///{tmp_path / 'old.db'}"
    else:
        with create_engine(url, isolation_level="AUTOCOMMIT").connect() as server:
            server.execute(text("CREATE DATABASE old_store"))
        old_url = url.set(database="old_store").render_as_string(hide_password=False)
    before = MetaData()
    Table("predictions", before, *[Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
                                   for c in predictions.columns if c.name not in ADDED_COLUMNS])
    Table("outcomes", before, Column("prediction_id", String(32), primary_key=True),
          Column("family", String(16), nullable=False), Column("observed", Float, nullable=False),
          Column("received_at", DateTime(timezone=True), nullable=False))
    engine = create_engine(old_url)
    before.create_all(engine)
    row = {"id": "a", "created_at": utc_now(), "family": "sensor", "model_name": "m", "model_version": "1",
           "role": "champion", "request_id": "r", "input_digest": "d", "input_summary": {}, "output": {}}
    with engine.begin() as connection:
        connection.execute(before.tables["predictions"].insert(), [row])
    engine.dispose()

    migrated = connect(old_url)
    assert set(ADDED_COLUMNS) <= {c["name"] for c in inspect(migrated).get_columns("predictions")}
    insert_predictions(migrated, [{**row, "id": "b", "latency_ms": 3.5, "failed": True}])
    stored = {r["id"]: (r["latency_ms"], r["failed"]) for r in read_predictions(migrated)}
    assert stored == {"a": (None, None), "b": (3.5, True)}
    connect(old_url).dispose()  # a second start finds nothing to add
    migrated.dispose()


def test_mlflow_registers_and_the_service_serves_from_postgresql_too(store_url, models, tmp_path):
    if not store_url.startswith("postgresql"):
        pytest.skip("every other test's registry is SQLite")
    server = make_url(store_url)
    with create_engine(server, isolation_level="AUTOCOMMIT").connect() as connection:
        connection.execute(text("CREATE DATABASE mlflow_registry"))
    registry_url = server.set(database="mlflow_registry").render_as_string(hide_password=False)
    registry = build_registry(tmp_path / "registry", models, uri=registry_url)
    assert [o["promoted"] for o in registry.sensor_outcomes] == [True, True, False]  # the gate, on PostgreSQL
    served = ServedModels(registry_url, {"sensor": SENSOR_NAME, "molecule": MOLECULE_NAME}, "champion",
                        registry.verify_key, prefer_cuda=False)
    served.refresh()
    assert served.ready and served.get("sensor").version == "2" and served.get("molecule").version == "1"
    assert inspect(create_engine(registry_url)).has_table("model_versions")  # MLflow's own schema, in PostgreSQL
