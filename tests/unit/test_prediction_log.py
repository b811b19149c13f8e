"""The prediction store's contract functions on SQLite, the window summaries, and the background writer: a full
queue drops and counts instead of blocking, an unwritable store warns once, pruning keeps the store bounded."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from pathlib import Path

import numpy as np

from contract.prediction_store import (connect, engine_for, find_unit_times, insert_predictions, prune, read_outcomes,
                                       read_predictions, read_rejected, record_outcomes, resolve_url, utc_now,
                                       window_summaries)
from serving.journal import Journal, Segment, locations
from serving.log_writer import StoreWriter
from serving.metrics import ServiceMetrics
from serving.log_rows import Answered, MoleculesRecord, WindowsRecord
from serving.log_rows import rows_of as rows_of_records
from serving.prediction_log import _new_ids, new_request_id


def prediction(key: str, age_days: float = 0.0, unit: str | None = None, time_: float | None = None) -> dict:
    return {"id": key, "created_at": utc_now() - datetime.timedelta(days=age_days), "family": "sensor",
            "model_name": "detector", "model_version": "3", "role": "champion", "request_id": "r" * 32,
            "unit": unit, "time": time_, "input_digest": "0" * 64, "input_summary": {"c": {"mean": None}},
            "output": {"failure_probability": 0.25, "alert": False, "uncertainty": 0.01}}


class Rows:
    """A record of ready-made prediction rows, as the writer takes them."""

    def __init__(self, *keys: str):
        self.keys = keys

    def __len__(self) -> int:
        return len(self.keys)

    def rows(self) -> list[dict]:
        return [prediction(key) for key in self.keys]


def rows_of(batch: list[Rows]) -> list[dict]:
    return [row for record in batch for row in record.rows()]


RECORD_GLOBALS = ("Rows",)  # what the writer process may resolve when it reads this module's records


class Runs:
    """A record that would run `command` when unpickled: what a forged batch on the socket could carry."""

    def __init__(self, command: str):
        self.command = command

    def __len__(self) -> int:
        return 1

    def __reduce__(self):
        return os.system, (self.command,)


def dropped(metrics: ServiceMetrics, reason: str) -> float:
    return metrics.registry.get_sample_value("serving_prediction_log_dropped_rows_total", {"reason": reason}) or 0.0


def test_a_relative_sqlite_store_lies_beside_the_params_file(tmp_path, monkeypatch):
    monkeypatch.delenv("SERVING_PREDICTION_STORE", raising=False)
    assert resolve_url(tmp_path) == f"sqlite:///{tmp_path / 'mlflow' / 'predictions.db'}"
    assert resolve_url(tmp_path, "sqlite:///logs/p.db") == f"sqlite:///{tmp_path / 'logs' / 'p.db'}"
    monkeypatch.setenv("SERVING_PREDICTION_STORE", "postgresql://db.example/predictions")
    assert resolve_url(tmp_path) == "postgresql://db.example/predictions"


def test_ids_are_distinct_hex_and_sort_in_the_order_they_were_made():
    """Time-ordered ids keep the store's indexes growing at their end."""
    first = _new_ids(200)
    time.sleep(0.002)
    later = [new_request_id() for _ in range(200)]
    assert len(set(first + later)) == 400 and all(len(key) == 32 and int(key, 16) >= 0 for key in first + later)
    assert max(first) < min(later)
    assert _new_ids(0) == []


def test_window_summaries_per_channel_with_missing_readings():
    windows = np.array([[[1.0, np.nan], [3.0, np.nan], [np.nan, np.nan], [2.0, np.nan]]], dtype=np.float32)  # (1, 4, 2)
    (summary,) = window_summaries(windows, ["speed", "heat"])
    assert summary == {"channels": ["speed", "heat"], "mean": [2.0, None], "std": [0.816497, None],
                       "min": [1.0, None], "max": [3.0, None], "missing": [0.25, 1.0]}


def test_a_batch_of_records_gets_each_window_its_own_summary_in_order():
    answered = Answered("sensor", "detector", "3", "champion", "r" * 32, utc_now())
    rng = np.random.default_rng(0)

    def windows_record(count: int, channels: list[str]) -> WindowsRecord:
        answers = [{"prediction_id": f"{len(channels)}-{count}-{i}", "failure_probability": 0.5} for i in range(count)]
        return WindowsRecord(answered, rng.normal(size=(count, 8, len(channels))).astype(np.float32), channels,
                             answers, [f"u{i}" for i in range(count)], None)

    batch = [windows_record(2, ["a", "b"]), MoleculesRecord(answered, [{"prediction_id": "m", "smiles": "OCC",
             "canonical_smiles": "CCO", "value": 1.5}]), windows_record(1, ["x", "y", "z"]), windows_record(3, ["a", "b"])]
    rows = rows_of_records(batch)
    assert [row["id"] for row in rows] == ["2-2-0", "2-2-1", "m", "3-1-0", "2-3-0", "2-3-1", "2-3-2"]
    windows = [w for record in (batch[0], batch[2], batch[3]) for w in record.windows]
    for row, window in zip([r for r in rows if r["id"] != "m"], windows):
        assert row["input_summary"] == window_summaries(window[None], row["input_summary"]["channels"])[0]
        assert row["input_digest"] == hashlib.sha256(window.tobytes()).hexdigest()
    assert rows[2]["input_summary"] == {"canonical_smiles": "CCO"} and rows[2]["output"] == {"value": 1.5}
    assert rows[4]["unit"] == "u0" and rows[4]["time"] is None


def test_outcomes_are_one_per_prediction_and_a_changed_one_replaces_it(tmp_path):
    engine = connect(f"sqlite:///{tmp_path / 'p.db'}")
    insert_predictions(engine, [prediction("a", unit="pump-7", time_=120.0), prediction("b", unit="pump-7", time_=124.0)])
    assert record_outcomes(engine, {"a": ("sensor", 1.0)}) == {"a": None}
    assert record_outcomes(engine, {"a": ("sensor", 1.0), "b": ("sensor", 0.0)}) == {"a": 1.0, "b": None}
    assert record_outcomes(engine, {"a": ("sensor", 0.0)}) == {"a": 1.0}
    assert sorted((o["prediction_id"], o["observed"]) for o in read_outcomes(engine)) == [("a", 0.0), ("b", 0.0)]
    joined = {row["id"]: row for row in read_predictions(engine, family="sensor")}
    assert joined["a"]["observed"] == 0.0 and joined["a"]["received_at"].tzinfo is not None
    assert joined["a"]["output"]["failure_probability"] == 0.25
    assert find_unit_times(engine, [("pump-7", 124.0), ("pump-7", 999.0)]) == {("pump-7", 124.0): ["b"]}


def test_prune_deletes_old_and_surplus_predictions_with_their_outcomes(tmp_path):
    engine = connect(f"sqlite:///{tmp_path / 'p.db'}")
    insert_predictions(engine, [prediction(f"old{i}", age_days=40 + i) for i in range(3)]
                       + [prediction(f"new{i}", age_days=i / 100) for i in range(5)])
    record_outcomes(engine, {"old0": ("sensor", 1.0), "new4": ("sensor", 0.0), "new0": ("sensor", 1.0)})
    assert prune(engine, utc_now() - datetime.timedelta(days=30), max_rows=3) == 5
    assert [row["id"] for row in read_predictions(engine)] == ["new2", "new1", "new0"]  # oldest first
    assert [o["prediction_id"] for o in read_outcomes(engine)] == ["new0"]
    assert prune(engine, utc_now() - datetime.timedelta(days=30), max_rows=3) == 0
    since = utc_now() - datetime.timedelta(days=0.015)
    assert [row["id"] for row in read_predictions(engine, since=since)] == ["new1", "new0"]


def test_a_full_queue_drops_and_counts_rather_than_blocks(tmp_path):
    """The store is locked by another connection, so the writer is stuck; the queue holds 4 rows."""
    path = tmp_path / "p.db"
    connect(f"sqlite:///{path}").dispose()
    lock = sqlite3.connect(path, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    metrics = ServiceMetrics()
    writer = StoreWriter(engine_for(f"sqlite:///{path}"), rows_of, capacity_rows=4, retention_days=30, max_rows=100,
                         prune_every_s=3600, metrics=metrics)
    writer.start()
    accepted: list[bool] = []
    submitting = threading.Thread(target=lambda: accepted.extend(writer.submit(Rows(f"p{i}")) for i in range(10)))
    submitting.start()
    submitting.join(timeout=60)
    assert not submitting.is_alive(), "submit blocked on a stuck store"
    assert [a.queued for a in accepted] == [True] * 4 + [False] * 6
    assert dropped(metrics, "queue_full") == 6
    deadline = time.monotonic() + 30  # the gauge follows the sender's batches (within LINGER_S), not each record
    while metrics.registry.get_sample_value("serving_prediction_log_queue_rows") != 4:
        assert time.monotonic() < deadline, "the queue gauge never showed the 4 queued rows"
        time.sleep(0.02)
    lock.execute("ROLLBACK")
    assert writer.flush(timeout_s=60)
    writer.stop(timeout_s=10)
    assert sorted(row["id"] for row in read_predictions(engine_for(f"sqlite:///{path}"))) == ["p0", "p1", "p2", "p3"]
    assert metrics.registry.get_sample_value("serving_prediction_log_written_rows_total") == 4
    assert metrics.registry.get_sample_value("serving_prediction_log_queue_rows") == 0


def test_a_store_that_cannot_be_written_is_retried_and_the_log_resumes_by_itself(tmp_path, caplog):
    """The store's folder is a file: nothing can be written. The rows wait, the writer says why and warns once;
    once the folder can be made, every row is written without a restart."""
    blocker = tmp_path / "store"
    blocker.write_text("not a folder")
    metrics = ServiceMetrics()
    writer = StoreWriter(engine_for(f"sqlite:///{blocker / 'p.db'}"), rows_of, capacity_rows=100,
                         retention_days=30, max_rows=100, prune_every_s=3600, metrics=metrics)
    writer.start()
    with caplog.at_level(logging.WARNING, logger="serving"):
        assert writer.submit(Rows("a0", "b0")).queued
        deadline = time.monotonic() + 60
        while writer.failing is None:
            assert time.monotonic() < deadline, "the writer never said the store is failing"
            time.sleep(0.02)
        assert metrics.registry.get_sample_value("serving_prediction_log_failing") == 1
        assert not writer.flush(timeout_s=1)  # still waiting for the store
        assert writer.submit(Rows("a1", "b1")).queued
        blocker.unlink()
        blocker.mkdir()
        assert writer.flush(timeout_s=60)
        writer.stop(timeout_s=10)
    assert writer.failing is None and metrics.registry.get_sample_value("serving_prediction_log_failing") == 0
    assert sorted(row["id"] for row in read_predictions(engine_for(f"sqlite:///{blocker / 'p.db'}"))) == [
        "a0", "a1", "b0", "b1"]
    assert dropped(metrics, "store_error") == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "cannot write to the prediction store, retrying" in warnings[0], warnings


def test_a_row_the_store_refuses_is_set_aside_and_the_rest_of_its_batch_written(tmp_path):
    """A lone surrogate cannot be encoded for the database: that row is kept in rejected_predictions with the
    reason, the rows beside it in the same batch are written."""
    url = f"sqlite:///{tmp_path / 'p.db'}"
    metrics = ServiceMetrics()
    writer = StoreWriter(engine_for(url), rows_of, capacity_rows=100, retention_days=30, max_rows=100,
                         prune_every_s=3600, metrics=metrics)
    writer.start()
    assert writer.submit(Rows("before", "bad\ud800", "after")).queued
    assert writer.flush(timeout_s=60)
    writer.stop(timeout_s=10)
    engine = engine_for(url)
    assert sorted(row["id"] for row in read_predictions(engine)) == ["after", "before"]
    [rejected] = read_rejected(engine)
    assert "UnicodeEncodeError" in rejected["reason"] and json.loads(rejected["row"])["id"] == "bad\ud800"
    assert metrics.registry.get_sample_value("serving_prediction_log_rejected_rows_total") == 1
    assert dropped(metrics, "store_error") == 0


def test_the_writer_prunes_the_store_to_its_limits(tmp_path):
    url = f"sqlite:///{tmp_path / 'p.db'}"
    insert_predictions(connect(url), [prediction(f"old{i}", age_days=10) for i in range(3)])
    metrics = ServiceMetrics()
    writer = StoreWriter(engine_for(url), rows_of, capacity_rows=100, retention_days=1, max_rows=4, prune_every_s=0.05,
                         metrics=metrics)
    writer.start()
    for i in range(6):
        writer.submit(Rows(f"new{i}"))
        writer.flush(timeout_s=60)
    deadline = time.monotonic() + 60
    while metrics.registry.get_sample_value("serving_prediction_log_pruned_rows_total") < 5:
        assert time.monotonic() < deadline, "the writer never pruned"
        time.sleep(0.02)
    writer.stop(timeout_s=10)
    kept = [row["id"] for row in read_predictions(engine_for(url))]
    assert len(kept) <= 4 and not [key for key in kept if key.startswith("old")]
    assert "new5" in kept


def test_records_submitted_after_stop_are_dropped_as_shutdown(tmp_path):
    metrics = ServiceMetrics()
    writer = StoreWriter(engine_for(f"sqlite:///{tmp_path / 'p.db'}"), rows_of, capacity_rows=10, retention_days=1,
                         max_rows=10, prune_every_s=3600, metrics=metrics)
    writer.start()
    assert writer.submit(Rows("kept")).queued
    writer.stop(timeout_s=30)
    assert not writer.submit(Rows("late")).queued
    assert dropped(metrics, "shutdown") == 1
    assert [row["id"] for row in read_predictions(engine_for(f"sqlite:///{tmp_path / 'p.db'}"))] == ["kept"]


def test_a_writer_process_that_dies_is_started_again_and_the_log_goes_on(tmp_path, caplog):
    url = f"sqlite:///{tmp_path / 'p.db'}"
    metrics = ServiceMetrics()
    writer = StoreWriter(engine_for(url), rows_of, capacity_rows=10, retention_days=1, max_rows=10,
                         prune_every_s=3600, metrics=metrics)
    writer.start()
    assert writer.submit(Rows("before")).queued and writer.flush(timeout_s=60)
    first = writer._process
    first.kill()
    first.wait(timeout=30)
    with caplog.at_level(logging.WARNING, logger="serving"):
        assert writer.submit(Rows("after")).queued and writer.flush(timeout_s=60)
    writer.stop(timeout_s=30)
    assert writer._process is not first and writer._process.returncode == 0
    assert sorted(row["id"] for row in read_predictions(engine_for(url))) == ["after", "before"]
    assert any("writer process ended" in r.getMessage() for r in caplog.records)
    assert metrics.registry.get_sample_value("serving_prediction_log_written_rows_total") == 2


def test_a_batch_whose_records_name_other_code_is_refused_and_nothing_of_it_runs(tmp_path, caplog):
    url = f"sqlite:///{tmp_path / 'p.db'}"
    marker = tmp_path / "ran"
    metrics = ServiceMetrics()
    writer = StoreWriter(engine_for(url), rows_of, capacity_rows=10, retention_days=1, max_rows=10,
                         prune_every_s=3600, metrics=metrics)
    writer.start()
    with caplog.at_level(logging.WARNING, logger="serving"):
        assert writer.submit(Runs(f"touch {marker}")).queued and writer.flush(timeout_s=60)
        assert writer.submit(Rows("after")).queued and writer.flush(timeout_s=60)
    writer.stop(timeout_s=30)
    assert not marker.exists()
    assert dropped(metrics, "store_error") == 1
    assert any("may not refer to posix.system" in r.getMessage() for r in caplog.records)
    assert [row["id"] for row in read_predictions(engine_for(url))] == ["after"]


def journal_writer(url: str, folder, metrics: ServiceMetrics | None = None) -> StoreWriter:
    return StoreWriter(engine_for(url), rows_of, capacity_rows=100, retention_days=30, max_rows=100,
                       prune_every_s=3600, metrics=metrics or ServiceMetrics(), journal=Journal(folder, "w"))


def test_a_record_is_on_disk_before_it_is_acknowledged_and_its_segment_goes_once_written(tmp_path):
    writer = journal_writer(f"sqlite:///{tmp_path / 'p.db'}", tmp_path / "journal")
    writer.start()
    writer.submit(Rows("a", "b")).pending.durable.result(timeout=30)
    [segment] = list((tmp_path / "journal").glob("*.journal"))
    [(payload, rows)] = records_in(segment)
    assert rows == 2 and payload  # the record as it was queued
    assert writer.flush(timeout_s=60)
    writer.stop(timeout_s=10)
    assert sorted(row["id"] for row in read_predictions(engine_for(f"sqlite:///{tmp_path / 'p.db'}"))) == ["a", "b"]
    assert list((tmp_path / "journal").glob("*.journal")) == []  # written: nothing left to replay


def test_rows_a_stopped_worker_could_not_write_are_written_at_the_next_start(tmp_path):
    """The store cannot be written until the first writer stops: its rows stay in the journal, and the next writer
    on the same journal writes them (the first writer's rows once each)."""
    blocker = tmp_path / "store"
    blocker.write_text("not a folder")
    url = f"sqlite:///{blocker / 'p.db'}"
    first = journal_writer(url, tmp_path / "journal")
    first.start()
    for key in ("a", "b", "c"):
        first.submit(Rows(key)).pending.durable.result(timeout=30)
    first.stop(timeout_s=2)
    assert len(list((tmp_path / "journal").glob("*.journal"))) == 1
    blocker.unlink()
    blocker.mkdir()
    insert_predictions(connect(url), [prediction("a")])  # written before the first writer stopped: not twice
    metrics = ServiceMetrics()
    second = journal_writer(url, tmp_path / "journal", metrics)
    second.start()
    assert second.flush(timeout_s=60)
    second.stop(timeout_s=10)
    assert sorted(row["id"] for row in read_predictions(engine_for(url))) == ["a", "b", "c"]
    assert list((tmp_path / "journal").glob("*.journal")) == []
    assert metrics.registry.get_sample_value("serving_prediction_log_rejected_rows_total") == 0


def test_a_record_cut_short_at_the_end_of_a_segment_is_left_out(tmp_path):
    journal = Journal(tmp_path, "w")
    for payload in (b"first", b"second"):
        journal.append(payload, 1).durable.result(timeout=30)
    journal.close()
    [path] = list(tmp_path.glob("*.journal"))
    path.write_bytes(path.read_bytes()[:-3])  # the process died while writing the last record
    assert [payload for payload, _ in records_in(path)] == [b"first"]


def records_in(path) -> list[tuple[bytes, int]]:
    """The (pickled record, rows) of the journal segment at `path`."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return [(location.read(), location.rows) for location in locations(Segment(Path(path), fd, closed=True))]
    finally:
        os.close(fd)


def test_a_journal_that_syncs_to_disk_writes_the_records_of_one_loop_turn_together(tmp_path):
    journal = Journal(tmp_path, "w", sync_to_disk=True)

    async def answer_many() -> list:
        pending = [journal.append(f"r{i}".encode(), 1) for i in range(20)]
        assert len({id(p.synced) for p in pending}) == 1 and not pending[0].durable.done()  # one group, not yet
        await pending[0].synced
        return pending

    pending = asyncio.run(answer_many())
    assert all(p.durable.done() and p.location.segment is pending[0].location.segment for p in pending)
    assert [payload for payload, _ in records_in(pending[0].location.segment.path)] == [
        f"r{i}".encode() for i in range(20)]
    journal.close()


def spilled(metrics: ServiceMetrics) -> float:
    return metrics.registry.get_sample_value("serving_prediction_log_spilled_rows")


def blocked_store_writer(tmp_path, capacity_rows: int) -> tuple[StoreWriter, str, ServiceMetrics]:
    """A started writer with a journal, on a store that cannot be written (its folder is a file)."""
    blocker = tmp_path / "store"
    blocker.write_text("not a folder")
    url, metrics = f"sqlite:///{blocker / 'p.db'}", ServiceMetrics()
    writer = StoreWriter(engine_for(url), rows_of, capacity_rows=capacity_rows, retention_days=30, max_rows=1000,
                         prune_every_s=3600, metrics=metrics, journal=Journal(tmp_path / "journal", "w"))
    writer.start()
    return writer, url, metrics


def unblock_when_failing(writer: StoreWriter, tmp_path, kill_writer: bool = False) -> None:
    """Once the writer says the store is failing (killing its writer process then, if asked), make the store
    writable."""
    deadline = time.monotonic() + 30
    while writer.failing is None:
        assert time.monotonic() < deadline, "the writer never said the store was failing"
        time.sleep(0.02)
    if kill_writer:
        writer._process.kill()
        writer._process.wait(timeout=30)
    (tmp_path / "store").unlink()
    (tmp_path / "store").mkdir()


def test_records_beyond_a_full_queue_wait_in_the_journal_and_are_written_when_the_store_recovers(tmp_path):
    """The store is down while 30 records come to a queue of 10 rows: none is dropped, the overflow waits in the
    journal, and once the store can be written every record is, without a restart."""
    writer, url, metrics = blocked_store_writer(tmp_path, capacity_rows=10)
    keys = [f"k{i}" for i in range(30)]
    assert all(writer.submit(Rows(key)).queued for key in keys)
    assert spilled(metrics) >= 20 and dropped(metrics, "queue_full") == 0
    unblock_when_failing(writer, tmp_path)
    assert writer.flush(timeout_s=60)
    writer.stop(timeout_s=10)
    assert sorted(row["id"] for row in read_predictions(engine_for(url))) == sorted(keys)
    assert spilled(metrics) == 0 and sum(dropped(metrics, reason) for reason in ("queue_full", "shutdown")) == 0
    assert list((tmp_path / "journal").glob("*.journal")) == []


def test_the_batches_of_a_writer_process_killed_while_the_store_was_down_are_read_back_from_the_journal(tmp_path):
    writer, url, metrics = blocked_store_writer(tmp_path, capacity_rows=100)
    keys = [f"k{i}" for i in range(5)]
    for key in keys:
        writer.submit(Rows(key))
    unblock_when_failing(writer, tmp_path, kill_writer=True)  # killed while it holds the batch and retries
    assert writer.submit(Rows("after")).queued and writer.flush(timeout_s=60)
    writer.stop(timeout_s=10)
    assert sorted(row["id"] for row in read_predictions(engine_for(url))) == sorted([*keys, "after"])
    assert dropped(metrics, "writer_exited") == 0
    assert list((tmp_path / "journal").glob("*.journal")) == []
