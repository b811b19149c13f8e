"""The prediction store (contract/prediction_store.py): SQLite rows go to the driver exactly as SQLAlchemy's insert
would write them; a store made before the rollout columns gets them, keeps its rows, and takes the new rows; the
rollout reader pairs shadow rows with outcomes; two threads creating the tables of a new store at the same
moment both succeed."""

from __future__ import annotations

import datetime
import sqlite3
import threading

from sqlalchemy import inspect

from contract.prediction_store import ADDED_COLUMNS, connect, create_tables, engine_for, insert_predictions, predictions, read_predictions, \
    read_rollout, record_outcomes

OLD_SCHEMA = """CREATE TABLE predictions (id VARCHAR(32) PRIMARY KEY, created_at DATETIME NOT NULL,
family VARCHAR(16) NOT NULL, model_name VARCHAR(256) NOT NULL, model_version VARCHAR(32) NOT NULL,
role VARCHAR(16) NOT NULL, request_id VARCHAR(32) NOT NULL, unit VARCHAR(256), time FLOAT,
input_digest VARCHAR(64) NOT NULL, input_summary JSON NOT NULL, output JSON NOT NULL)"""
NOW = datetime.datetime(2026, 12, 1, 8, tzinfo=datetime.timezone.utc)


def row(key: str, role: str, version: str, request: str, digest: str, **extra) -> dict:
    return {"id": key, "created_at": NOW, "family": "sensor", "model_name": "m", "model_version": version,
            "role": role, "request_id": request, "input_digest": digest, "input_summary": {},
            "output": {"failure_probability": 0.5}, **extra}


def test_sqlite_rows_are_stored_as_sqlalchemys_insert_stores_them(tmp_path):
    rows = [row("a", "champion", "1", "r", "d", unit="pump-1", time=104.5, latency_ms=4.5, failed=True,
                input_summary={"channels": ["t"], "mean": [None], "missing": [1.0]}),
            {**row("b", "shadow", "2", "r", "e", unit=None, time=None, latency_ms=None, failed=None),
             "created_at": NOW + datetime.timedelta(microseconds=7)}]
    ours, core = connect(f"sqlite:///{tmp_path / 'ours.db'}"), connect(f"sqlite:///{tmp_path / 'core.db'}")
    insert_predictions(ours, rows)
    with core.begin() as connection:
        connection.execute(predictions.insert(), rows)
    stored = [sqlite3.connect(tmp_path / name).execute("SELECT * FROM predictions ORDER BY id").fetchall()
              for name in ("ours.db", "core.db")]
    assert stored[0] == stored[1] and len(stored[0]) == 2
    assert [r["id"] for r in read_predictions(ours, since=NOW + datetime.timedelta(microseconds=1))] == ["b"]


def test_a_store_made_before_the_rollout_columns_gets_them_and_keeps_its_rows(tmp_path):
    path = tmp_path / "predictions.db"
    with sqlite3.connect(path) as old:
        old.execute(OLD_SCHEMA)
        old.execute("INSERT INTO predictions VALUES ('a', '2026-11-30 10:00:00', 'sensor', 'm', '1', 'champion', "
                    "'r', NULL, NULL, 'd', '{}', '{}')")
    engine = connect(f"sqlite:///{path}")
    assert set(ADDED_COLUMNS) <= {c["name"] for c in inspect(engine).get_columns("predictions")}
    assert "predictions_request" in {i["name"] for i in inspect(engine).get_indexes("predictions")}
    insert_predictions(engine, [row("b", "champion", "1", "s", "e", latency_ms=4.5, failed=False)])
    stored = {r["id"]: r for r in read_predictions(engine)}
    assert (stored["a"]["latency_ms"], stored["a"]["failed"]) == (None, None)
    assert (stored["b"]["latency_ms"], stored["b"]["failed"]) == (4.5, False)
    connect(f"sqlite:///{path}")  # a second start finds nothing to add


def test_a_shadow_row_takes_the_outcome_of_the_answered_row_of_its_request_and_input(tmp_path):
    engine = connect(f"sqlite:///{tmp_path / 'predictions.db'}")
    insert_predictions(engine, [
        row("c1", "champion", "1", "r1", "x"), row("c2", "champion", "1", "r1", "y"),
        row("s1", "shadow", "2", "r1", "x"), row("s2", "shadow", "2", "r1", "y"),
        row("s3", "shadow", "2", "r2", "z"), row("k1", "challenger", "2", "r3", "x")])
    record_outcomes(engine, {"c1": ("sensor", 1.0), "k1": ("sensor", 0.0)})
    rows = {r["id"]: r for r in read_rollout(engine, "sensor", "m", "2", ["shadow", "challenger"], limit=100)}
    assert {key: r["observed"] for key, r in rows.items()} == {"s1": 1.0, "s2": None, "s3": None, "k1": 0.0}
    assert [r["id"] for r in read_rollout(engine, "sensor", "m", "1", ["champion"], limit=1)] in (["c1"], ["c2"])


def test_two_threads_creating_the_tables_of_a_new_store_at_once_both_succeed(tmp_path):
    """The service's monitoring round and a /v1/feedback call may both be the first to use the store."""
    for attempt in range(5):
        engine = engine_for(f"sqlite:///{tmp_path / f'store-{attempt}.db'}")
        start, errors = threading.Barrier(2), []

        def create() -> None:
            start.wait()
            try:
                create_tables(engine)
            except Exception as error:  # noqa: BLE001 (the test reports it)
                errors.append(error)

        threads = [threading.Thread(target=create) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert set(inspect(engine).get_table_names()) == {"predictions", "outcomes", "rejected_predictions"}
        assert {i["name"] for i in inspect(engine).get_indexes("predictions")} == {i.name for i in predictions.indexes}
