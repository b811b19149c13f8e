"""The prediction log: each answered item gets a `prediction_id`, and a row describing it goes to the prediction
store (contract.prediction_store) through the background writer (serving.log_writer).

On the request path only the ids are made and the family's record of the request queued; digests and summaries
are computed in the writer process (serving.log_rows, serving.log_writer). A row holds the model (name, version,
role: `champion`, `challenger` for a canary answer, `shadow` for a shadow run), the request id, the sensor unit and
time when given, the sha256 of the input item, its summary (sensor: the channel names and, per channel, mean, std,
min, max and missing share over the window's steps; molecule: the standardised canonical SMILES the model saw and
its applicability domain, or the SMILES as sent when the call failed), the answer (empty when the model call
failed), the call's latency and whether it failed.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from contract.prediction_store import SQLITE, engine_for, resolve_url, utc_now
from serving.loading import LoadedModel
from serving.family import ServedFamily
from serving.log_rows import Answered, rows_of
from serving.journal import Journal
from serving.log_writer import StoreWriter
from serving.metrics import ServiceMetrics
from serving.settings import ServingSettings

log = logging.getLogger("serving")
PRUNE_EVERY_S = 600.0


class PredictionStoreError(RuntimeError):
    """SERVING_PREDICTION_STORE is not a database URL this service can use."""


def _new_ids(count: int) -> list[str]:
    """`count` ids of 32 hex characters: the time in milliseconds (12 hex digits), then 80 random bits. Ids made
    later sort later (as UUIDv7 orders them), so the store's id and request indexes grow at their end: with random
    ids every insert touched its own page of each, and inserting cost twice the CPU (21 against 10 us per row at
    100,000 rows in SQLite)."""
    stamp = f"{time.time_ns() // 1_000_000:012x}"
    random = os.urandom(10 * count).hex()
    return [stamp + random[20 * i:20 * (i + 1)] for i in range(count)]


def journal_folder(settings: ServingSettings, store_url: str) -> Path:
    """SERVING_PREDICTION_JOURNAL, else `<file>.journal/` beside a SQLite store, else `mlflow/journal/` beside the
    params file."""
    if settings.prediction_journal:
        return Path(settings.prediction_journal)
    if store_url.startswith(SQLITE) and store_url != SQLITE + ":memory:":
        return Path(store_url[len(SQLITE):] + ".journal")
    return Path(settings.params_file).resolve().parent / "mlflow" / "journal"


def made_at_ms(prediction_id: str) -> int | None:
    """When the prediction of `prediction_id` was made (Unix milliseconds), or None for an id not made here."""
    stamp = prediction_id[:12]
    if len(prediction_id) != 32 or not all(c in "0123456789abcdef" for c in prediction_id):
        return None
    return int(stamp, 16)


def new_request_id() -> str:
    return _new_ids(1)[0]


@dataclass(frozen=True)
class Call:
    """How one request's model call went: the request it served, the role it ran as, its latency, its failure."""

    request_id: str
    role: str
    latency_ms: float
    failed: bool = False


class PredictionLog:
    """Gives answers their ids and queues their rows; `start`/`stop` belong to the app's lifespan. With
    `writer` None (SERVING_PREDICTION_LOG=false) answers get no ids and nothing is written."""

    def __init__(self, writer: StoreWriter | None):
        self.writer = writer

    @classmethod
    def from_settings(cls, settings: ServingSettings, metrics: ServiceMetrics) -> "PredictionLog":
        """The log on SERVING_PREDICTION_STORE (default: the contract's SQLite file beside the params file)."""
        if not settings.prediction_log:
            return cls(None)
        url = resolve_url(Path(settings.params_file).resolve().parent, settings.prediction_store)
        try:
            engine = engine_for(url)
        except (ArgumentError, NoSuchModuleError) as error:
            raise PredictionStoreError(f"SERVING_PREDICTION_STORE is not a usable database URL: {error}") from None
        folder = journal_folder(settings, url)
        log.info("prediction log: writing to %s, journal in %s", engine.url.render_as_string(hide_password=True),
                 folder)
        worker = f"{socket.gethostname()}-{os.getpid()}-{os.urandom(2).hex()}"
        return cls(StoreWriter(engine, rows_of, capacity_rows=settings.prediction_queue_rows,
                               retention_days=settings.prediction_retention_days,
                               max_rows=settings.prediction_max_rows, prune_every_s=PRUNE_EVERY_S, metrics=metrics,
                               journal=Journal(folder, worker, settings.prediction_journal_sync)))

    @property
    def enabled(self) -> bool:
        return self.writer is not None

    async def record(self, family: ServedFamily, items: Sequence, answers: list[dict], model: LoadedModel,
                     call: Call | None = None) -> None:
        """Give each answer without an `error` a `prediction_id` (first key), queue the family's record of them
        (a failed call: the family's `failed_answers`), and return once the record is in the journal."""
        if self.writer is None:
            return
        logged = [i for i, answer in enumerate(answers) if "error" not in answer]
        if not logged:
            return
        _identify(answers, logged)
        pending = self.writer.submit(family.log_record(_logged(items, logged), [answers[i] for i in logged], model,
                                                       _answered(model, call))).pending
        if pending is not None:
            try:
                if pending.synced is not None:
                    await pending.synced
                else:
                    pending.durable.result()
            except OSError:  # not on disk (`state` says why): the store alone will have it
                pass

    @property
    def state(self) -> str:
        """`ok`, `off` (SERVING_PREDICTION_LOG=false), or why the store cannot be written now (the rows wait)."""
        if self.writer is None:
            return "off"
        if self.writer.failing is not None:
            return f"the store cannot be written, retrying: {self.writer.failing}"
        problem = self.writer.journal.problem() if self.writer.journal is not None else None
        return "ok" if problem is None else f"the journal cannot be written (answers do not wait for it): {problem}"

    def start(self) -> None:
        if self.writer is not None:
            self.writer.start()

    def stop(self, timeout_s: float) -> None:
        if self.writer is not None:
            self.writer.stop(timeout_s)


def _logged(items: Sequence, positions: list[int]) -> Sequence:
    """The items at `positions` (all of them, as they are, when none is left out)."""
    return items if len(positions) == len(items) else [items[i] for i in positions]


def _identify(answers: list[dict], positions: Sequence[int]) -> None:
    for i, prediction_id in zip(positions, _new_ids(len(positions))):
        answers[i] = {"prediction_id": prediction_id, **answers[i]}


def _answered(model: LoadedModel, call: Call | None) -> Answered:
    if call is None:
        return Answered(model.family, model.name, model.version, model.alias[:16], new_request_id(), utc_now())
    return Answered(model.family, model.name, model.version, call.role, call.request_id, utc_now(),
                     call.latency_ms, call.failed)
