"""The prediction log's writer process (started by serving.log_writer): it reads batches of records from its
socket, builds their rows, writes them to the prediction store and acknowledges each batch; it prunes the store
on schedule. It imports only the store's contract and the module of its row builder, so it starts light.

    python -c "from serving.log_process import main; main()" <socket fd> <row builder, module:function>

The first message is its configuration (JSON); an empty message, or the service going away, ends it. Its answers
are JSON too. A batch is a pickled list of pickled records, read by an unpickler that resolves no name but those
the row builder's module lists in RECORD_GLOBALS (its record types), so bytes on the socket can never name code
to run; the row builder itself comes from the command line.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import io
import logging
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

import orjson
from sqlalchemy.engine import Engine

from contract.prediction_store import create_tables, engine_for, insert_predictions, prune, utc_now

NICENESS = 5  # the writer yields the CPU to the service's answers under load

RowBuilder = Callable[[list], Sequence[dict]]  # a batch of records -> their rows


@dataclass(frozen=True)
class Config:
    """What the writer is told first: the store's URL and its limits."""

    url: str
    retention_days: float
    max_rows: int
    prune_every_s: float


@dataclass
class Ack:
    """The writer's answer to one batch (or to a prune): how many rows it wrote (the others of a batch are lost),
    and what to log."""

    batch: bool = False  # the answer to a batch (else to a prune)
    written: int = 0
    pruned: int = 0
    logs: list[tuple[int, str]] = field(default_factory=list)  # (level, message)


def encode(message: Config | Ack) -> bytes:
    return orjson.dumps(dataclasses.asdict(message))


def decode(kind: type[Config] | type[Ack], data: bytes) -> Config | Ack:
    """A Config or Ack from its JSON; TypeError for any other field."""
    return kind(**orjson.loads(data))


class _RecordUnpickler(pickle.Unpickler):
    """Resolves only the names in `allowed` ((module, name) pairs); anything else is an UnpicklingError."""

    def __init__(self, data: bytes, allowed: frozenset[tuple[str, str]]):
        super().__init__(io.BytesIO(data))
        self.allowed = allowed

    def find_class(self, module: str, name: str):
        if (module, name) not in self.allowed:
            raise pickle.UnpicklingError(f"a prediction log record may not refer to {module}.{name}")
        return super().find_class(module, name)


def read_batch(message: bytes, allowed: frozenset[tuple[str, str]]) -> list:
    """The records of one batch (a pickled list of pickled records), resolving no names but `allowed`."""
    return [_RecordUnpickler(record, allowed).load() for record in _RecordUnpickler(message, frozenset()).load()]


def main() -> None:
    """Serve the socket whose descriptor is the first argument with the row builder named by the second, until told
    to end or the service is gone. Ctrl-C reaches the whole process group: the service decides when this ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.nice(NICENESS)
    connection = Connection(int(sys.argv[1]))
    try:
        config = decode(Config, connection.recv_bytes())
    except (EOFError, OSError):
        return
    write_forever(connection, config, sys.argv[2])


def load_builder(reference: str) -> tuple[RowBuilder, frozenset[tuple[str, str]]]:
    """The row builder "module:function" and the names its records may refer to (its module's RECORD_GLOBALS)."""
    module_name, _, name = reference.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, name), frozenset((module_name, each) for each in module.RECORD_GLOBALS)


def write_forever(connection: Connection, config: Config, build_rows: str) -> None:
    """Write each batch that comes through `connection` with the row builder `build_rows` ("module:function") and
    acknowledge it; prune every `prune_every_s` (first right after the first write)."""
    builder, allowed = load_builder(build_rows)
    writer = _Writer(engine_for(config.url), builder, datetime.timedelta(days=config.retention_days),
                     config.max_rows)
    next_prune = time.monotonic()  # due at once, but only once the store exists: the first write creates it
    while True:
        wait_s = max(0.0, next_prune - time.monotonic()) if writer.tables_ready else None
        try:
            if connection.poll(wait_s):
                message = connection.recv_bytes()
                if not message:
                    break
                connection.send_bytes(encode(writer.write(message, allowed)))
            if writer.tables_ready and time.monotonic() >= next_prune:
                connection.send_bytes(encode(writer.prune()))
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

    def write(self, message: bytes, allowed: frozenset[tuple[str, str]]) -> Ack:
        """Read, build and insert one batch (records resolving only `allowed` names)."""
        ack = Ack(batch=True)
        try:
            batch = read_batch(message, allowed)
        except Exception as error:  # not records of ours: nothing of it is run or written
            self._failed(ack, "refused a batch it cannot read, dropping its rows", error)
            return ack
        try:
            if not self.tables_ready:
                create_tables(self.engine)
                self.tables_ready = True
            insert_predictions(self.engine, self.build_rows(batch))
        except Exception as error:  # any store or driver error: the rows are lost, the service goes on
            self._failed(ack, "cannot write to the prediction store, dropping rows", error)
            return ack
        ack.written = sum(len(record) for record in batch)
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
