"""The prediction log's writer process (started by serving.log_writer): it reads batches of records from its
socket, builds their rows, writes them to the prediction store and acknowledges each batch; it prunes the store
on schedule. It imports only the store's contract and the module of its row builder, so it starts light.

    python -c "from serving.log_process import main; main()" <socket fd>

The first message is its configuration; an empty message, or the service going away, ends it.
"""

from __future__ import annotations

import datetime
import importlib
import logging
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from sqlalchemy.engine import Engine

from contract.prediction_store import create_tables, engine_for, insert_predictions, prune, utc_now

NICENESS = 5  # the writer yields the CPU to the service's answers under load

RowBuilder = Callable[[list], Sequence[dict]]  # a batch of records -> their rows


@dataclass(frozen=True)
class Config:
    """What the writer is told first: the store's URL, its row builder ("module:function"), its limits."""

    url: str
    build_rows: str
    retention_days: float
    max_rows: int
    prune_every_s: float


@dataclass
class Ack:
    """The writer's answer to one batch (or to a prune): how its rows went, and what to log."""

    records: int = 0  # records of the batch finished (written or dropped)
    rows: int = 0
    written: int = 0
    dropped: int = 0  # rows dropped for a store error
    pruned: int = 0
    logs: list[tuple[int, str]] = field(default_factory=list)  # (level, message)


def main() -> None:
    """Serve the socket whose descriptor is the first argument, until told to end or the service is gone. Ctrl-C
    reaches the whole process group: the service decides when this ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.nice(NICENESS)
    connection = Connection(int(sys.argv[1]))
    try:
        config: Config = connection.recv()
    except (EOFError, OSError):
        return
    write_forever(connection, config)


def load_builder(reference: str) -> RowBuilder:
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def write_forever(connection: Connection, config: Config) -> None:
    """Write each batch that comes through `connection` and acknowledge it; prune every `prune_every_s` (first
    right after the first write)."""
    writer = _Writer(engine_for(config.url), load_builder(config.build_rows),
                     datetime.timedelta(days=config.retention_days), config.max_rows)
    next_prune = time.monotonic()  # due at once, but only once the store exists: the first write creates it
    while True:
        wait_s = max(0.0, next_prune - time.monotonic()) if writer.tables_ready else None
        try:
            if connection.poll(wait_s):
                message = connection.recv_bytes()
                if not message:
                    break
                # our own service's records (a list of each one pickled), over our socket
                connection.send(writer.write([pickle.loads(record) for record in pickle.loads(message)]))
            if writer.tables_ready and time.monotonic() >= next_prune:
                connection.send(writer.prune())
                next_prune = time.monotonic() + config.prune_every_s
        except (EOFError, OSError):  # the service is gone
            break
    writer.engine.dispose()


class _Writer:
    """The writer's state: its engine, and the kinds of failure logged since the last good write."""

    def __init__(self, engine: Engine, build_rows: RowBuilder, retention: datetime.timedelta, max_rows: int):
        self.engine, self.build_rows, self.retention, self.max_rows = engine, build_rows, retention, max_rows
        self.tables_ready = False
        self._failures: set[str] = set()

    def write(self, batch: list) -> Ack:
        ack = Ack(records=len(batch), rows=sum(len(record) for record in batch))
        try:
            if not self.tables_ready:
                create_tables(self.engine)
                self.tables_ready = True
            insert_predictions(self.engine, self.build_rows(batch))
        except Exception as error:  # any store or driver error: the rows are lost, the service goes on
            ack.dropped = ack.rows
            self._failed(ack, "cannot write to the prediction store, dropping rows", error)
            return ack
        ack.written = ack.rows
        if self._failures:
            ack.logs.append((logging.INFO, "the store is written again"))
            self._failures.clear()
        return ack

    def prune(self) -> Ack:
        ack = Ack()
        try:
            ack.pruned = prune(self.engine, utc_now() - self.retention, self.max_rows)
        except Exception as error:
            self._failed(ack, "cannot prune the prediction store", error)
        return ack

    def _failed(self, ack: Ack, what: str, error: Exception) -> None:
        """Log `error` once per kind (its first line) until the next good write."""
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
        kind = f"{what}: {first_line}"
        if kind not in self._failures:
            self._failures.add(kind)
            ack.logs.append((logging.WARNING, f"{kind} ({type(error).__name__}); further failures of this kind are "
                                              "only counted in serving_prediction_log_dropped_rows_total"))
