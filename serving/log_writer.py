"""The prediction store's writer: a bounded queue that never blocks the caller, and one background thread that
builds the rows, inserts them in batches and prunes the store now and then. A batch is written when it holds
BATCH_ROWS rows or its first row has waited LINGER_S (at once when someone flushes), so one transaction carries
many predictions.

A full queue drops the new rows; a store that cannot be written drops the batch; both are counted by reason
(`serving_prediction_log_dropped_rows_total`) and each kind of store failure is logged once until the store is
written again. Callers only ever take a lock held for a few list operations.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from sqlalchemy.engine import Engine

from contract.prediction_store import create_tables, insert_predictions, prune, utc_now
from serving.metrics import ServiceMetrics

log = logging.getLogger("serving")
BATCH_ROWS = 500  # rows per INSERT transaction at most
LINGER_S = 0.5  # how long the first queued row waits for others to share its transaction


class Record(Protocol):
    """One answered request, whose rows are built in the writer thread; its length is its number of rows."""

    def __len__(self) -> int: ...


RowBuilder = Callable[[list[Record]], Sequence[dict]]  # a batch of records -> their rows


class StoreWriter:
    """Hold records of at most `capacity_rows` rows in all (queued or being written); write their rows (made by
    `build_rows`) to `engine` from a thread; every `prune_every_s` (first right after the first write) delete predictions older than `retention_days` and the
    oldest beyond `max_rows`. The store's tables are created by the first write, not before."""

    def __init__(self, engine: Engine, build_rows: RowBuilder, *, capacity_rows: int, retention_days: float, max_rows: int,
                 prune_every_s: float, metrics: ServiceMetrics):
        self.engine, self.build_rows, self.capacity_rows = engine, build_rows, capacity_rows
        self.retention = datetime.timedelta(days=retention_days)
        self.max_rows, self.prune_every_s, self.metrics = max_rows, prune_every_s, metrics
        self._queue: deque[Record] = deque()
        self._queued_rows = 0
        self._first_queued_at = 0.0  # when the oldest record in the queue came
        self._hurry = False  # a flush is waiting: write without lingering
        self._accepted = self._finished = 0  # records taken by submit / written or dropped by the thread
        self._condition = threading.Condition()
        self._closing = False
        self._tables_ready = False
        self._failures: set[str] = set()  # kinds of store failure logged since the last good write
        self._thread = threading.Thread(target=self._run, name="prediction-log-writer", daemon=True)
        metrics.log_queue_rows.set_function(lambda: self._queued_rows)

    def submit(self, record: Record) -> bool:
        """Queue `record`; False (its rows dropped and counted) when the queue is full or closing."""
        with self._condition:
            refused = "shutdown" if self._closing else "queue_full" if (
                self._queued_rows + len(record) > self.capacity_rows) else None
            if refused is None:
                if not self._queue:
                    self._first_queued_at = time.monotonic()
                    self._condition.notify()
                self._queue.append(record)
                self._queued_rows += len(record)
                self._accepted += 1
                if self._queued_rows >= BATCH_ROWS:
                    self._condition.notify()
        if refused is not None:
            self.metrics.log_dropped_rows.labels(refused).inc(len(record))
        return refused is None

    def flush(self, timeout_s: float) -> bool:
        """Wait until the records submitted so far are written (or dropped); False if `timeout_s` passed first."""
        with self._condition:
            target = self._accepted
            self._hurry = True
            self._condition.notify()
            return self._condition.wait_for(lambda: self._finished >= target, timeout=timeout_s)

    def ensure_tables(self) -> None:
        """Create the store's tables once (raises the store's error when it cannot)."""
        if not self._tables_ready:
            create_tables(self.engine)
            self._tables_ready = True

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        """Refuse new records, write what is queued within `timeout_s`; what is left then is dropped and counted."""
        with self._condition:
            self._closing = True
            self._condition.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if self._thread.is_alive():
            left = self._queued_rows
            log.warning("prediction log: %d rows not written at shutdown", left)
            self.metrics.log_dropped_rows.labels("shutdown").inc(left)
        else:
            self.engine.dispose()

    def _run(self) -> None:
        next_prune = time.monotonic()  # due at once, but only once the store exists: the first write creates it
        while True:
            with self._condition:
                while (wait_s := self._wait_s(next_prune)) is None or wait_s > 0:
                    self._condition.wait(timeout=wait_s)
                batch, rows = [], 0
                while self._queue and (not batch or rows + len(self._queue[0]) <= BATCH_ROWS):
                    batch.append(self._queue.popleft())
                    rows += len(batch[-1])
                self._first_queued_at = time.monotonic()
                self._hurry = self._hurry and bool(self._queue)
                done = self._closing and not self._queue
            if batch:
                self._write(batch)
                with self._condition:
                    self._queued_rows -= rows
                    self._finished += len(batch)
                    self._condition.notify_all()
            if done:
                return
            if self._tables_ready and time.monotonic() >= next_prune:
                self._prune()
                next_prune = time.monotonic() + self.prune_every_s

    def _wait_s(self, next_prune: float) -> float | None:
        """How long the thread may still sleep (None: until woken; <= 0: work now). Called under the lock."""
        now = time.monotonic()
        if self._closing or (self._queue and (self._hurry or self._queued_rows >= BATCH_ROWS)):
            return 0.0
        prune_in = next_prune - now if self._tables_ready else None
        if not self._queue:
            return prune_in
        write_in = self._first_queued_at + LINGER_S - now
        return write_in if prune_in is None else min(write_in, prune_in)

    def _write(self, batch: list[Record]) -> None:
        count = sum(len(record) for record in batch)
        try:
            self.ensure_tables()
            insert_predictions(self.engine, self.build_rows(batch))
        except Exception as error:  # any store or driver error: the rows are lost, the service goes on
            self.metrics.log_dropped_rows.labels("store_error").inc(count)
            self._failed("cannot write to the prediction store, dropping rows", error)
            return
        self.metrics.log_written_rows.inc(count)
        if self._failures:
            log.info("prediction log: the store is written again")
            self._failures.clear()

    def _prune(self) -> None:
        try:
            deleted = prune(self.engine, utc_now() - self.retention, self.max_rows)
        except Exception as error:
            self._failed("cannot prune the prediction store", error)
            return
        self.metrics.log_pruned_rows.inc(deleted)

    def _failed(self, what: str, error: Exception) -> None:
        """Log `error` once per kind (its first line) until the next good write."""
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
        kind = f"{what}: {first_line}"
        if kind not in self._failures:
            self._failures.add(kind)
            log.warning("prediction log: %s (%s); further failures of this kind are only counted in "
                        "serving_prediction_log_dropped_rows_total", kind, type(error).__name__)
