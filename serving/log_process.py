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
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from contract.prediction_store import create_tables, engine_for, insert_predictions, prune, set_aside, utc_now

NICENESS = 5  # the writer yields the CPU to the service's answers under load
RETRY_FIRST_S, RETRY_MAX_S = 0.25, 5.0  # back-off between tries of a failing store

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
    """The writer's answer to one batch (or to a prune, or news of the store): how many rows it wrote and set aside
    (the others of a batch are lost), whether the store is failing, and what to log."""

    batch: bool = False  # the answer to a batch (else to a prune, or news)
    written: int = 0
    rejected: int = 0  # rows the store refused, kept in rejected_predictions
    pruned: int = 0
    failing: str | None = None  # why the store cannot be written now ("" once it is written again; None: no news)
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
                     config.max_rows, tell=lambda ack: connection.send_bytes(encode(ack)))
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
    """The writer's state: its engine, and the kinds of failure logged since the last good write.

    A batch is written whole; a store that cannot be written (unreachable, read-only, full, locked) is retried with
    back-off until it can, and the service is told meanwhile; a batch the store refuses for its content is written
    row by row, and the rows it refuses (and records whose rows cannot be built) are set aside with their reason."""

    def __init__(self, engine: Engine, build_rows: RowBuilder, retention: datetime.timedelta, max_rows: int,
                 tell: Callable[[Ack], None] = lambda ack: None):
        self.engine, self.build_rows, self.retention, self.max_rows = engine, build_rows, retention, max_rows
        self.tell, self.parent = tell, os.getppid()
        self.tables_ready = False
        self._failures: set[str] = set()
        self._failing = False

    def write(self, message: bytes, allowed: frozenset[tuple[str, str]]) -> Ack:
        """Read, build and insert one batch (records resolving only `allowed` names)."""
        ack = Ack(batch=True)
        try:
            batch = read_batch(message, allowed)
        except Exception as error:  # not records of ours: nothing of it is run or written
            self._failed(ack, "refused a batch it cannot read, dropping its rows", error)
            return ack
        rows, refused = self._rows(batch)
        written = self._insert(rows, refused)
        self._set_aside(refused, ack)
        ack.written, ack.rejected = written, len(refused)
        if self._failures:
            ack.logs.append((logging.INFO, "the store is written again"))
            self._failures.clear()
        if self._failing:
            ack.failing, self._failing = "", False
        return ack

    def _rows(self, batch: list) -> tuple[list[dict], list[tuple[object, str]]]:
        """The batch's rows, and (record, reason) for each record whose rows cannot be built."""
        try:
            return list(self.build_rows(batch)), []
        except Exception:  # find the records at fault, keep the others'
            rows, refused = [], []
            for record in batch:
                try:
                    rows.extend(self.build_rows([record]))
                except Exception as error:
                    refused.append((repr(record)[:2000], f"its rows cannot be built ({type(error).__name__}): "
                                                           f"{_first_line(error)}"))
            return rows, refused

    def _insert(self, rows: list[dict], refused: list[tuple[object, str]]) -> int:
        """Insert `rows` whole, or row by row when their content is at fault; adds the rows the store refuses to
        `refused`; how many were written."""
        try:
            self._until_written(lambda: self._ensure_tables() or insert_predictions(self.engine, rows))
            return len(rows)
        except Exception:  # something in the rows: find which
            return sum(self._insert_one(row, refused) for row in rows)

    def _insert_one(self, row: dict, refused: list[tuple[object, str]]) -> int:
        try:
            self._until_written(lambda: insert_predictions(self.engine, [row]))
            return 1
        except Exception as error:
            refused.append((row, f"the store refused it ({type(error).__name__}): {_first_line(error)}"))
            return 0

    def _ensure_tables(self) -> None:
        if not self.tables_ready:
            create_tables(self.engine)
            self.tables_ready = True

    def _until_written(self, write: Callable[[], None]) -> None:
        """Run `write` until it succeeds, with back-off while the store is at fault; raises an error of the rows'."""
        delay = RETRY_FIRST_S
        while True:
            try:
                return write()
            except Exception as error:
                if rows_at_fault(error):
                    raise
                self._store_down(error)
            if os.getppid() != self.parent:  # the service is gone (killed outright): nobody waits for these rows
                raise SystemExit(0)
            time.sleep(delay)
            delay = min(2 * delay, RETRY_MAX_S)

    def _store_down(self, error: Exception) -> None:
        """Tell the service once that the store is failing, and drop the engine's connections (a SQLite file opened
        read-only stays read-only on its connection)."""
        ack = Ack(failing=_first_line(error))
        self._failed(ack, "cannot write to the prediction store, retrying", error)
        if not self._failing or ack.logs:
            self._failing = True
            self.tell(ack)
        self.engine.dispose()

    def _set_aside(self, refused: list[tuple[object, str]], ack: Ack) -> None:
        if refused:
            try:
                set_aside(self.engine, refused)
            except Exception as error:
                self._failed(ack, "cannot set refused rows aside, dropping them", error)
                return
            ack.logs.append((logging.WARNING, f"set aside {len(refused)} rows the store refused, in "
                                              f"rejected_predictions (first: {refused[0][1]})"))

    def prune(self) -> Ack:
        ack = Ack()
        try:
            ack.pruned = prune(self.engine, utc_now() - self.retention, self.max_rows)
        except Exception as error:
            self._failed(ack, "cannot prune the prediction store", error)
        return ack

    def _failed(self, ack: Ack, what: str, error: Exception) -> None:
        """Log `error` once per kind (its first line) until the next good write."""
        kind = f"{what}: {_first_line(error)}"
        if kind not in self._failures:
            self._failures.add(kind)
            ack.logs.append((logging.WARNING, f"{kind} ({type(error).__name__}); further failures of this kind are "
                                              "only counted in serving_prediction_log_dropped_rows_total"))


def rows_at_fault(error: Exception) -> bool:
    """Whether the rows' content, not the store, made a write fail: a constraint or a value the database refuses, or
    one the driver cannot send (a string no encoding can write). Anything else (unreachable, read-only, full, locked,
    missing tables) is the store's, and is retried."""
    if isinstance(error, (IntegrityError, DataError)):
        return True
    return not isinstance(error, (DBAPIError, OSError, PoolTimeout))


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
