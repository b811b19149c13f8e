"""The prediction store's writer, service side: a bounded queue of records, each pickled as it comes, that never
blocks the caller, a sender thread that sends them in batches into a socket, and a writer process
(serving.log_process) that builds the rows, inserts them and prunes the store now and then.

The rows are built and written in their own process, not in a thread of the service: Python runs one thread at a
time, and a writer thread turning rows into SQL held the event loop back far beyond its share of the CPU
(docs/decisions/0011-prediction-log-design.md). A record pickles as a few bytes per window (serving.log_rows),
and pickled it holds no objects for the garbage collector to walk while it waits; a receiver thread turns the
writer's acknowledgements into metrics and log lines.

A batch is sent when it holds BATCH_ROWS rows or its first row has waited LINGER_S (at once when someone flushes,
or while records wait in the journal), so one transaction carries many predictions. A store that cannot be written
is retried by the writer with back-off (`failing` says why meanwhile, and the log resumes by itself); rows the store refuses are set aside in the store's
`rejected_predictions` (`serving_prediction_log_rejected_rows_total`). A writer process that ends is started again
(at most once per RESTART_PAUSE_S). With a journal, records that find the queue full (the store down for long) and
the batches a writer process held when it ended wait in the journal alone (`serving_prediction_log_spilled_rows`)
and are read back from it as the queue drains; without one they are dropped and counted by reason
(`serving_prediction_log_dropped_rows_total`). Each kind of store failure is logged once until the store is written
again. Callers only ever take a lock held for a few list operations.
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Protocol

from sqlalchemy.engine import Engine

from contract.prediction_store import create_tables
from serving.journal import Journal, Location, Pending
from serving.log_process import Ack, Config, decode, encode

if TYPE_CHECKING:
    from serving.metrics import ServiceMetrics

log = logging.getLogger("serving")
BATCH_ROWS = 500  # rows per INSERT transaction at most
LINGER_S = 0.5  # how long the first queued row waits for others to share its transaction
SPILL_POLL_S = 0.05  # how often a spilled record whose journal write is still ahead is looked at again
RESTART_PAUSE_S = 1.0  # a writer process that ended is started again after this pause at the earliest
WRITER_COMMAND = "from serving.log_process import main; main()"  # + the socket's descriptor and the row builder


class Record(Protocol):
    """One answered request, whose rows are built in the writer process; its length is its number of rows. It
    pickles referring to no names but those its row builder's module lists in RECORD_GLOBALS."""

    def __len__(self) -> int: ...


RowBuilder = Callable[[list[Record]], Sequence[dict]]  # a batch of records -> their rows (a module-level function)


@dataclass(frozen=True)
class Submitted:
    """What became of a submitted record: on its way to the store (queued, or waiting in the journal) or dropped, and
    its way to the journal (None without one)."""

    queued: bool
    pending: Pending | None


class StoreWriter:
    """Hold records of at most `capacity_rows` rows in all (queued, in the socket or being written); write their
    rows (made by `build_rows`, a module-level function) to `engine`'s store from a writer process; every
    `prune_every_s` (first right after the first write) delete predictions older than `retention_days` and the
    oldest beyond `max_rows`. The store's tables are created by the first write, not before. `engine` stays for
    the service's own reads."""

    def __init__(self, engine: Engine, build_rows: RowBuilder, *, capacity_rows: int, retention_days: float,
                 max_rows: int, prune_every_s: float, metrics: ServiceMetrics, journal: Journal | None = None):
        self.engine, self.capacity_rows, self.metrics, self.journal = engine, capacity_rows, metrics, journal
        self._config = Config(engine.url.render_as_string(hide_password=False), retention_days, max_rows,
                              prune_every_s)
        self._build_rows = f"{build_rows.__module__}:{build_rows.__qualname__}"
        # (pickled record, its rows, its way to the journal, or where it is read back from)
        self._queue: deque[tuple[bytes, int, Pending | None, Location | None]] = deque()
        self._queued_rows = 0  # in the queue and in the writer process
        self._spilled: deque[Pending | Location] = deque()  # records in the journal alone, taken as the queue drains
        self._spilled_rows = 0
        self._waiting_rows = 0  # in the queue
        self._first_queued_at = 0.0  # when the oldest record in the queue came
        self._hurry = False  # a flush is waiting: send without lingering
        self._accepted = self._finished = 0  # records taken by submit / written or dropped
        self._condition = threading.Condition()
        self._closing = False
        self._tables_ready = False
        self.failing: str | None = None  # why the store cannot be written now (the writer retries it meanwhile)
        # per writer process (numbered): the (records, rows, journal locations) of each batch it holds, until it
        # acknowledges them
        self._generation = 0
        self._in_flight: dict[int, deque[tuple[int, int, list[Location]]]] = {}
        self._process: subprocess.Popen | None = None
        self._connection: Connection | None = None
        self._sender = threading.Thread(target=self._send, name="prediction-log-sender", daemon=True)
        metrics.log_failing.set(0)

    def submit(self, record: Record) -> Submitted:
        """Queue `record`, pickled at once, and append it to the journal (the answer's wait). When the queue is full
        it waits in the journal alone (without one its rows are dropped and counted); once closing, it is dropped
        (the journal keeps it for the next start). Pickled, a queued record holds no objects: records waiting for
        their batch used to survive into the garbage collector's oldest generation and made its full collections
        more frequent."""
        payload = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
        pending = self.journal.append(payload, len(record)) if self.journal is not None else None
        with self._condition:
            refused = "shutdown" if self._closing else "queue_full" if (
                self._queued_rows + len(record) > self.capacity_rows) else None
            if refused is None:
                self._enqueue((payload, len(record), pending, None))
            elif refused == "queue_full" and pending is not None:
                self._spill([pending])
                refused = None
        if refused is not None:
            self.metrics.log_dropped_rows.labels(refused).inc(len(record))
        return Submitted(refused is None, pending)

    def _enqueue(self, queued: tuple[bytes, int, Pending | None, Location | None]) -> None:
        """Called under the lock."""
        if not self._queue:
            self._first_queued_at = time.monotonic()
            self._condition.notify_all()
        self._queue.append(queued)
        self._queued_rows += queued[1]
        self._waiting_rows += queued[1]
        if queued[3] is None:  # a record read back from the journal was accepted when it was spilled
            self._accepted += 1
        if self._waiting_rows >= BATCH_ROWS:
            self._condition.notify_all()

    def _spill(self, records: list[Pending | Location], accepted: bool = False) -> None:
        """Leave `records` in the journal alone until the queue has room (`accepted`: counted already). Called under
        the lock."""
        self._spilled.extend(records)
        self._spilled_rows += sum(record.rows for record in records)
        self._accepted += 0 if accepted else len(records)
        self.metrics.log_spilled_rows.set(self._spilled_rows)

    def _take_spilled(self) -> None:
        """Read spilled records back from the journal while the queue is at most half full (new answers keep the
        other half). Called under the lock."""
        if not self._spilled:
            return
        while self._spilled and not self._closing and (
                self._queued_rows + self._spilled[0].rows <= max(self.capacity_rows // 2, self._spilled[0].rows)):
            record = self._spilled[0]
            if isinstance(record, Pending):
                if not record.durable.done():
                    return  # its write is still ahead (a sync on the event loop's next turn)
                if record.durable.exception() is not None:  # neither the queue nor the journal has it
                    self._spilled.popleft()
                    self._spilled_rows -= record.rows
                    self._settle(1, 0)
                    self.metrics.log_dropped_rows.labels("queue_full").inc(record.rows)
                    continue
                record = record.location
            try:
                payload = record.read()
            except OSError as error:
                log.error("prediction log: cannot read a record back from the journal (%s); dropped", error)
                payload = None
            self._spilled.popleft()
            self._spilled_rows -= record.rows
            if payload is None:
                self._settle(1, 0)
                self.metrics.log_dropped_rows.labels("journal_error").inc(record.rows)
            else:
                self._enqueue((payload, record.rows, None, record))
        self.metrics.log_spilled_rows.set(self._spilled_rows)

    def flush(self, timeout_s: float) -> bool:
        """Wait until the records submitted so far are written (or dropped); False if `timeout_s` passed first."""
        with self._condition:
            target = self._accepted
            self._hurry = True
            self._condition.notify_all()
            return self._condition.wait_for(lambda: self._finished >= target, timeout=timeout_s)

    def ensure_tables(self) -> None:
        """Create the store's tables once (raises the store's error when it cannot)."""
        if not self._tables_ready:
            create_tables(self.engine)
            self._tables_ready = True

    def start(self) -> None:
        """Start the writer process and the sender thread (records queue meanwhile); take the records of journal
        segments no live worker holds (a service stopped before they were written), to write them now."""
        if self.journal is not None:
            replayed = self.journal.replay()
            if replayed:
                log.info("prediction log: writing %d rows a stopped worker left in the journal",
                         sum(location.rows for location in replayed))
                with self._condition:
                    self._spill(replayed)
        self._start_writer()
        self._sender.start()

    def stop(self, timeout_s: float) -> None:
        """Refuse new records, write what is queued within `timeout_s`; what is left then is dropped and counted."""
        deadline = time.monotonic() + timeout_s
        with self._condition:
            self._closing = True
            self._condition.notify_all()
        if self._sender.is_alive():
            self._sender.join(max(0.0, deadline - time.monotonic()))
        if self._process is not None:
            try:
                self._process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        with self._condition:
            left, self._queued_rows = self._queued_rows + self._spilled_rows, 0
            self._spilled.clear()
            self._spilled_rows = 0
            self._in_flight.clear()
            self._finished = self._accepted
            self._condition.notify_all()
        if left:
            log.warning("prediction log: %d rows not written at shutdown%s", left,
                        "; the journal keeps them for the next start" if self.journal is not None else "")
            self.metrics.log_dropped_rows.labels("shutdown").inc(left)
        if self.journal is not None:
            self.journal.close()
        self.engine.dispose()

    def _start_writer(self) -> None:
        """A writer process on a new socket, told its configuration, and the thread that reads its answers."""
        ours, theirs = socket.socketpair()
        self._process = subprocess.Popen([sys.executable, "-c", WRITER_COMMAND, str(theirs.fileno()), self._build_rows],
                                         pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                         env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, sys.path))})
        theirs.close()
        connection = Connection(ours.detach())
        with self._condition:
            self._generation += 1
            self._in_flight[self._generation] = deque()
            self._connection = connection
        connection.send_bytes(encode(self._config))
        threading.Thread(target=self._receive, args=(self._generation, connection), name="prediction-log-receiver",
                         daemon=True).start()

    def _send(self) -> None:
        restart_at = 0.0
        while True:
            with self._condition:
                self._take_spilled()
                while (wait_s := self._wait_s()) is None or wait_s > 0:
                    self._condition.wait(timeout=wait_s)
                    self._take_spilled()
                batch, rows = [], 0
                while self._queue and (not batch or rows + self._queue[0][1] <= BATCH_ROWS):
                    queued = self._queue.popleft()
                    batch.append(queued)
                    rows += queued[1]
                self._waiting_rows -= rows
                self.metrics.log_queue_rows.set(self._queued_rows)  # per batch: off the request path
                self._first_queued_at = time.monotonic()
                self._hurry = self._hurry and bool(self._queue)
                done = self._closing and not self._queue
            if batch:
                if self._process.poll() is not None and time.monotonic() >= restart_at:
                    log.warning("prediction log: the writer process ended (exit code %s); starting another",
                                self._process.returncode)
                    self._start_writer()
                    restart_at = time.monotonic() + RESTART_PAUSE_S
                self._send_batch([payload for payload, _, _, _ in batch], rows, _locations(batch))
            if done:
                self._connection_send(b"")  # the writer finishes what it holds and ends
                return

    def _send_batch(self, batch: list[bytes], rows: int, locations: list[Location]) -> None:
        payload = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)  # a list of pickled records
        with self._condition:
            held = self._in_flight.get(self._generation)
            if held is not None:
                held.append((len(batch), rows, locations))
            else:  # the writer process has ended and is not started again yet
                self._writer_lost([(len(batch), rows, locations)])
        if held is not None:
            self._connection_send(payload)

    def _writer_lost(self, batches: Sequence[tuple[int, int, list[Location]]]) -> None:
        """A writer process ended holding `batches` (records, rows, journal locations): the records with a location
        wait in the journal again, the others are dropped and counted. Called under the lock."""
        spilled = [location for _, _, locations in batches for location in locations]
        records, rows = sum(batch[0] for batch in batches), sum(batch[1] for batch in batches)
        lost = rows - sum(location.rows for location in spilled)
        self._settle(records - len(spilled), rows)
        self._spill(spilled, accepted=True)
        if lost:
            self.metrics.log_dropped_rows.labels("writer_exited").inc(lost)

    def _connection_send(self, payload: bytes) -> None:
        try:
            self._connection.send_bytes(payload)
        except OSError:  # the writer process ended: its receiver counts what it held
            pass

    def _wait_s(self) -> float | None:
        """How long the sender may still sleep (None: until woken; <= 0: send now). Called under the lock."""
        if self._closing or (self._queue and (self._hurry or self._spilled or self._waiting_rows >= BATCH_ROWS)):
            return 0.0
        if not self._queue:
            return SPILL_POLL_S if self._spilled else None
        return self._first_queued_at + LINGER_S - time.monotonic()

    def _receive(self, generation: int, connection: Connection) -> None:
        while True:
            try:
                ack: Ack = decode(Ack, connection.recv_bytes())
            except (EOFError, OSError):  # the writer process ended: what it held goes back to the journal or is lost
                with self._condition:
                    self._writer_lost(self._in_flight.pop(generation, deque()))
                connection.close()
                return
            for level, message in ack.logs:
                log.log(level, "prediction log: %s", message)
            self.metrics.log_written_rows.inc(ack.written)
            self.metrics.log_rejected_rows.inc(ack.rejected)
            self.metrics.log_pruned_rows.inc(ack.pruned)
            if ack.failing is not None:
                self.failing = ack.failing or None
                self.metrics.log_failing.set(self.failing is not None)
            if ack.written:
                self._tables_ready = True
            if ack.batch:  # the oldest batch it holds is done: what it neither wrote nor set aside is lost
                with self._condition:
                    held = self._in_flight.get(generation)
                    records, rows, locations = held.popleft() if held else (0, 0, [])
                    self._settle(records, rows)
                for location in locations:  # in the store (or set aside): the journal need not keep them
                    self.journal.settle(location)
                if rows > ack.written + ack.rejected:
                    self.metrics.log_dropped_rows.labels("store_error").inc(rows - ack.written - ack.rejected)

    def _settle(self, records: int, rows: int) -> None:
        """`records` finished (written or dropped), `rows` left the queue or the writer's hands. Called under the
        lock."""
        if records or rows:
            self._queued_rows -= rows
            self._finished += records
            self._condition.notify_all()
            self.metrics.log_queue_rows.set(self._queued_rows)


def _locations(batch: list[tuple[bytes, int, Pending | None, Location | None]]) -> list[Location]:
    """The journal location of each record of `batch` (waiting until it is on disk), where it has one."""
    found = []
    for _, _, pending, replayed in batch:
        if pending is not None:
            try:
                pending.durable.result()
            except OSError:  # the journal could not write it: the store alone will have it
                continue
            found.append(pending.location)
        elif replayed is not None:
            found.append(replayed)
    return found
