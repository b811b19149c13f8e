"""The prediction store: every prediction the service answers (or runs in shadow) and the outcomes observed
later, in SQL: SQLite inside the project by default, PostgreSQL by URL. The service writes it; the `monitor`
flow and the service's own monitoring (serving/monitoring.py) read it. SQLAlchemy Core tables; the schema is
created on first use.

Tables (one row per item, not per request):
- `predictions`: id (the `prediction_id` a response carries), created_at (UTC), family, model_name,
  model_version, role (`champion`, `challenger` when a canary answered, `shadow` when logged only), request_id
  (pairs a shadow row with the answered one), unit and time (sensor windows, optional), input_digest (sha256 of
  the item: a window's float32 (T, C) bytes, a SMILES' UTF-8 as sent), input_summary (JSON: sensor
  {"channels": names, "mean", "std", "min", "max", "missing": one value per channel, null for a channel without
  readings}; molecule {"canonical_smiles"} and, when the served version has a training reference, its applicability
  domain: "nearest_similarity" (Tanimoto to the nearest training molecule), "in_domain" and
  "descriptors_out_of_range" (share of descriptors outside the training range)), output (JSON: the answered
  fields, without the id, the SMILES and the applicability domain; empty when the model call failed), latency_ms
  (the request's model call, queueing and featurisation included) and failed (whether that call raised): what the
  rollout judge reads for the service SLOs. Both are null in rows written before them.
- `outcomes`: prediction_id, family, observed (label 0/1 or value), received_at (UTC).
- `rejected_predictions`: rows the store refused (a value its driver cannot write), set aside by the writer with
  rejected_at (UTC), the reason, and the row as ASCII JSON (any text escaped), so one bad row never takes its
  batch down.

Both sides find the store the same way (`resolve_url`): SERVING_PREDICTION_STORE when set, else DEFAULT_URL, a
relative SQLite path made absolute under the params file's folder. The functions below are the only way either
side reads or writes it.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TypedDict

import numpy as np
import orjson
from sqlalchemy import (JSON, Boolean, Column, DateTime, Float, Index, Integer, MetaData, String, Table, Text, and_,
                        create_engine, delete, event, func, inspect, select, text, tuple_)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DatabaseError, IntegrityError

DEFAULT_URL = "sqlite:///mlflow/predictions.db"
SUMMARY_DIGITS = 6
SUMMARY_STATS = ("mean", "std", "min", "max", "missing")
DOMAIN_FIELDS = ("nearest_similarity", "in_domain", "descriptors_out_of_range")  # a molecule summary's domain
URL_VARIABLE = "SERVING_PREDICTION_STORE"
SQLITE = "sqlite:///"
SQLITE_BUSY_TIMEOUT_S = 30  # a writer waits this long for another connection's lock before failing

metadata = MetaData()

predictions = Table(
    "predictions", metadata,
    Column("id", String(32), primary_key=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("family", String(16), nullable=False),
    Column("model_name", String(256), nullable=False),
    Column("model_version", String(32), nullable=False),
    Column("role", String(16), nullable=False),
    Column("request_id", String(32), nullable=False),
    Column("unit", String(256)),
    Column("time", Float),
    Column("input_digest", String(64), nullable=False),
    Column("input_summary", JSON, nullable=False),
    Column("output", JSON, nullable=False),
    Column("latency_ms", Float),
    Column("failed", Boolean),
    Index("predictions_family_created", "family", "created_at"),
    Index("predictions_unit_time", "unit", "time"),
    Index("predictions_request", "request_id"),
)
ADDED_COLUMNS = ("latency_ms", "failed")  # nullable columns added after the first release: added to older stores

_SQLITE_INSERT = (f"INSERT OR IGNORE INTO predictions ({', '.join(c.name for c in predictions.columns)}) "
                  f"VALUES ({', '.join('?' for _ in predictions.columns)})")

outcomes = Table(
    "outcomes", metadata,
    Column("prediction_id", String(32), primary_key=True),
    Column("family", String(16), nullable=False),
    Column("observed", Float, nullable=False),
    Column("received_at", DateTime(timezone=True), nullable=False),
    Index("outcomes_family_received", "family", "received_at"),
)

REASON_CHARS = 500
rejected = Table(
    "rejected_predictions", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("rejected_at", DateTime(timezone=True), nullable=False),
    Column("reason", String(REASON_CHARS), nullable=False),
    Column("row", Text, nullable=False),
)


class PredictionRow(TypedDict):
    """One row of `predictions` as the service writes it (see the module docstring for each field)."""

    id: str
    created_at: datetime.datetime
    family: str
    model_name: str
    model_version: str
    role: str
    request_id: str
    unit: str | None
    time: float | None
    input_digest: str
    input_summary: dict
    output: dict
    latency_ms: float | None
    failed: bool


class StoredPrediction(PredictionRow):
    """A row of `predictions` read back with its outcome (`observed` and `received_at` None while none came)."""

    observed: float | None
    received_at: datetime.datetime | None


def resolve_url(root: Path, url: str | None = None) -> str:
    """`url`, else SERVING_PREDICTION_STORE, else DEFAULT_URL; a relative SQLite path is made absolute under
    `root` (the params file's folder)."""
    url = url or os.environ.get(URL_VARIABLE) or DEFAULT_URL
    if url.startswith(SQLITE) and not url[len(SQLITE):].startswith("/"):
        url = SQLITE + str((root / url[len(SQLITE):]).resolve())
    return url


def _json(value) -> str:
    return orjson.dumps(value).decode()


def engine_for(url: str) -> Engine:
    """An engine on the store at `url`, connecting on first use. SQLite runs in WAL mode (readers and the one
    writer do not block each other; commits are not synced to disk one by one) and waits SQLITE_BUSY_TIMEOUT_S
    for a lock. Raises sqlalchemy's
    ArgumentError or NoSuchModuleError for a URL it cannot use."""
    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True, json_serializer=_json)
    engine = create_engine(url, json_serializer=_json, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})

    @event.listens_for(engine, "connect")
    def _wal(connection, _) -> None:
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")  # WAL stays consistent; a power cut may lose the last rows

    return engine


def create_tables(engine: Engine) -> None:
    """The tables and indexes, when missing (a SQLite file's folder is created too); a store made before
    ADDED_COLUMNS gets them (nullable, so its rows stay as they were)."""
    database = engine.url.database
    if engine.dialect.name == "sqlite" and database and database != ":memory:":
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    create_despite_others(lambda: metadata.create_all(engine))
    _add_missing_columns(engine)
    for index in predictions.indexes:  # create_all skips the indexes of a table that exists
        create_despite_others(lambda: index.create(engine, checkfirst=True))


def create_despite_others(create, attempts: int = 3) -> None:
    """Run `create` (a checkfirst CREATE); another thread or process that creates the same thing between its
    check and its CREATE makes it fail with "already exists": it is run again, and then finds it."""
    for attempt in range(attempts):
        try:
            return create()
        except DatabaseError as error:  # PostgreSQL may say so as a duplicate key in its catalogue
            if attempt == attempts - 1 or not (isinstance(error, IntegrityError) or "already exists" in str(error)):
                raise


def _add_missing_columns(engine: Engine) -> None:
    """ALTER TABLE ... ADD COLUMN for each of ADDED_COLUMNS the `predictions` table lacks. Another process may
    add one at the same moment: its error is ignored when the column then exists."""
    for name in ADDED_COLUMNS:
        if name in {c["name"] for c in inspect(engine).get_columns("predictions")}:
            continue
        kind = predictions.c[name].type.compile(dialect=engine.dialect)
        try:
            with engine.begin() as connection:
                connection.execute(text(f"ALTER TABLE predictions ADD COLUMN {name} {kind}"))
        except Exception:
            if name not in {c["name"] for c in inspect(engine).get_columns("predictions")}:
                raise


def connect(url: str) -> Engine:
    """An engine on the store at `url`, its tables created when missing."""
    engine = engine_for(url)
    create_tables(engine)
    return engine


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _utc(moment: datetime.datetime) -> datetime.datetime:
    """SQLite gives back naive datetimes (written in UTC); PostgreSQL aware ones."""
    return moment.replace(tzinfo=datetime.timezone.utc) if moment.tzinfo is None else moment


def _stored(moment: datetime.datetime) -> datetime.datetime:
    """A bound for a comparison, in UTC (SQLite stores and compares the UTC time as text, without the zone)."""
    return moment.astimezone(datetime.timezone.utc)


def task_of(family: str, output: Mapping) -> str:
    """`classification` or `regression`, from a prediction's family and stored output: the sensor detector
    and a molecule model answering `probability` are classifiers."""
    return "classification" if family == "sensor" or "probability" in output else "regression"


def insert_predictions(engine: Engine, rows: Sequence[PredictionRow]) -> None:
    """Write prediction rows (the `predictions` columns, all but unit and time required) in one transaction; a row
    whose id is stored already is skipped (a journal replayed after a crash may hold rows written before it).

    On SQLite each row goes to the driver as a tuple of what the column types' own bind processors make of its
    values, the same values SQLAlchemy's insert would send without its per-row parameter handling (about half of
    the prediction log writer's time per row). PostgreSQL keeps SQLAlchemy's batched insert."""
    if not rows:
        return
    with engine.begin() as connection:
        if engine.dialect.name == "postgresql":
            connection.execute(postgresql.insert(predictions).on_conflict_do_nothing(index_elements=["id"]), list(rows))
            return
        if engine.dialect.name != "sqlite":
            connection.execute(predictions.insert(), list(rows))
            return
        dialect = engine.dialect
        processors = [(c.name, c.type.dialect_impl(dialect).bind_processor(dialect)) for c in predictions.columns]
        values = [tuple(value if process is None or value is None else process(value)
                        for name, process in processors for value in (row.get(name),)) for row in rows]
        connection.exec_driver_sql(_SQLITE_INSERT, values)


def set_aside(engine: Engine, refused: Sequence[tuple[Mapping | str, str]]) -> None:
    """Keep (row, reason) pairs the store refused in `rejected_predictions`; a row is written as ASCII JSON (its
    text escaped, values JSON cannot hold as their repr), which any store accepts."""
    if not refused:
        return
    now = utc_now()
    values = [{"rejected_at": now, "reason": reason[:REASON_CHARS],
               "row": json.dumps(row, ensure_ascii=True, default=repr, sort_keys=True)} for row, reason in refused]
    with engine.begin() as connection:
        connection.execute(rejected.insert(), values)


def read_rejected(engine: Engine) -> list[dict]:
    """The rows set aside, oldest first: {rejected_at, reason, row (the JSON text)}."""
    query = select(rejected.c.rejected_at, rejected.c.reason, rejected.c.row).order_by(rejected.c.id)
    with engine.connect() as connection:
        return [{"rejected_at": _utc(r.rejected_at), "reason": r.reason, "row": r.row} for r in connection.execute(query)]


def find_predictions(engine: Engine, ids: Iterable[str]) -> dict[str, dict]:
    """{id: {family, output}} of the stored predictions among `ids`."""
    query = select(predictions.c.id, predictions.c.family, predictions.c.output).where(predictions.c.id.in_(set(ids)))
    with engine.connect() as connection:
        return {row.id: {"family": row.family, "output": row.output} for row in connection.execute(query)}


def find_unit_times(engine: Engine, pairs: Iterable[tuple[str, float]]) -> dict[tuple[str, float], list[str]]:
    """{(unit, time): ids of the predictions for that unit at that time} for the pairs that have any."""
    pairs = set(pairs)
    found: dict[tuple[str, float], list[str]] = {}
    if not pairs:
        return found
    query = (select(predictions.c.id, predictions.c.unit, predictions.c.time)
             .where(tuple_(predictions.c.unit, predictions.c.time).in_(pairs)).order_by(predictions.c.created_at))
    with engine.connect() as connection:
        for row in connection.execute(query):
            found.setdefault((row.unit, row.time), []).append(row.id)
    return found


def _upsert(engine: Engine):
    dialects = {"sqlite": sqlite, "postgresql": postgresql}
    if engine.dialect.name not in dialects:
        raise NotImplementedError(f"the prediction store supports SQLite and PostgreSQL, not {engine.dialect.name}")
    statement = dialects[engine.dialect.name].insert(outcomes)
    return statement.on_conflict_do_update(index_elements=[outcomes.c.prediction_id], set_={
        "observed": statement.excluded.observed, "received_at": statement.excluded.received_at})


def record_outcomes(engine: Engine, observed: Mapping[str, tuple[str, float]]) -> dict[str, float | None]:
    """Store {prediction id: (family, observed)} in one transaction, one row per prediction: an outcome sent
    again is kept once, a different one replaces it. Returns each id's earlier observed value (None: none)."""
    if not observed:
        return {}
    now = utc_now()
    earlier = select(outcomes.c.prediction_id, outcomes.c.observed).where(outcomes.c.prediction_id.in_(set(observed)))
    with engine.begin() as connection:
        before = dict(connection.execute(earlier).tuples().all())
        connection.execute(_upsert(engine), [{"prediction_id": key, "family": family, "observed": value,
                                              "received_at": now} for key, (family, value) in observed.items()])
    return {key: before.get(key) for key in observed}


def read_predictions(engine: Engine, family: str | None = None, since: datetime.datetime | None = None,
                     until: datetime.datetime | None = None) -> list[StoredPrediction]:
    """Predictions made in [since, until), oldest first, each with its outcome: the `predictions` columns plus
    `observed` and `received_at` (None while no outcome came). Times are timezone-aware UTC."""
    query = (select(predictions, outcomes.c.observed, outcomes.c.received_at)
             .outerjoin(outcomes, outcomes.c.prediction_id == predictions.c.id)
             .order_by(predictions.c.created_at, predictions.c.id))
    if family is not None:
        query = query.where(predictions.c.family == family)
    if since is not None:
        query = query.where(predictions.c.created_at >= _stored(since))
    if until is not None:
        query = query.where(predictions.c.created_at < _stored(until))
    with engine.connect() as connection:
        rows = [dict(row._mapping) for row in connection.execute(query)]
    for row in rows:
        row["created_at"] = _utc(row["created_at"])
        row["received_at"] = row["received_at"] and _utc(row["received_at"])
    return rows


def read_rollout(engine: Engine, family: str, name: str, version: str, roles: Sequence[str], limit: int,
                 since: datetime.datetime | None = None) -> list[dict]:
    """The newest `limit` predictions of `name` version `version` in `roles` made since `since`, oldest first:
    id, created_at, role, request_id, latency_ms, failed, output, observed (None: no outcome yet). A shadow row
    whose request was answered by id takes the outcome of the answered row with the same request and input
    (request_id, input_digest): the client never saw the shadow row's id."""
    answered, paired = predictions.alias("answered"), outcomes.alias("paired")
    joined = (predictions.outerjoin(outcomes, outcomes.c.prediction_id == predictions.c.id)
              .outerjoin(answered, and_(predictions.c.role == "shadow", answered.c.role != "shadow",
                                        answered.c.request_id == predictions.c.request_id,
                                        answered.c.input_digest == predictions.c.input_digest))
              .outerjoin(paired, paired.c.prediction_id == answered.c.id))
    query = (select(predictions.c.id, predictions.c.created_at, predictions.c.role, predictions.c.request_id,
                    predictions.c.latency_ms, predictions.c.failed, predictions.c.output,
                    func.coalesce(outcomes.c.observed, paired.c.observed).label("observed"))
             .select_from(joined)
             .where(predictions.c.family == family, predictions.c.model_name == name,
                    predictions.c.model_version == str(version), predictions.c.role.in_(list(roles)))
             .order_by(predictions.c.created_at.desc(), predictions.c.id.desc()).limit(limit))
    if since is not None:
        query = query.where(predictions.c.created_at >= _stored(since))
    with engine.connect() as connection:
        rows = [dict(row._mapping) for row in connection.execute(query)]
    unique = list({row["id"]: row for row in reversed(rows)}.values())  # a SMILES sent twice pairs twice
    for row in unique:
        row["created_at"] = _utc(row["created_at"])
    return unique


def read_outcomes(engine: Engine, family: str | None = None,
                  since: datetime.datetime | None = None) -> list[dict]:
    """Outcomes received since `since`, oldest first: prediction_id, family, observed, received_at (UTC)."""
    query = select(outcomes).order_by(outcomes.c.received_at, outcomes.c.prediction_id)
    if family is not None:
        query = query.where(outcomes.c.family == family)
    if since is not None:
        query = query.where(outcomes.c.received_at >= _stored(since))
    with engine.connect() as connection:
        rows = [dict(row._mapping) for row in connection.execute(query)]
    for row in rows:
        row["received_at"] = _utc(row["received_at"])
    return rows


def _of_version(family: str, name: str, version: str):
    return (predictions.c.family == family, predictions.c.model_name == name,
            predictions.c.model_version == str(version))


def recent_predictions(engine: Engine, family: str, name: str, version: str, limit: int) -> list[dict]:
    """The last `limit` predictions of `name` version `version`, oldest first: id, created_at, unit, time,
    input_summary (dict), output (dict)."""
    query = (select(predictions.c.id, predictions.c.created_at, predictions.c.unit, predictions.c.time,
                    predictions.c.input_summary, predictions.c.output)
             .where(*_of_version(family, name, version))
             .order_by(predictions.c.created_at.desc(), predictions.c.id.desc()).limit(limit))
    with engine.connect() as connection:
        rows = [dict(row._mapping) for row in connection.execute(query)][::-1]
    for row in rows:
        row["created_at"] = _utc(row["created_at"])
    return rows


def labelled_predictions(engine: Engine, family: str, name: str, version: str, limit: int) -> list[dict]:
    """The last `limit` predictions of `name` version `version` with an outcome (by the time the outcome came),
    oldest first: id, created_at, received_at, unit, output (dict), observed (float)."""
    query = (select(predictions.c.id, predictions.c.created_at, outcomes.c.received_at, predictions.c.unit,
                    predictions.c.output, outcomes.c.observed)
             .join(outcomes, outcomes.c.prediction_id == predictions.c.id)
             .where(*_of_version(family, name, version))
             .order_by(outcomes.c.received_at.desc(), predictions.c.id.desc()).limit(limit))
    with engine.connect() as connection:
        rows = [dict(row._mapping) for row in connection.execute(query)][::-1]
    for row in rows:
        row["created_at"], row["received_at"] = _utc(row["created_at"]), _utc(row["received_at"])
    return rows


def prune(engine: Engine, older_than: datetime.datetime, max_rows: int) -> int:
    """Delete the predictions made before `older_than` and the oldest beyond the newest `max_rows`, with their
    outcomes. Returns how many predictions were deleted."""
    doomed = predictions.c.created_at < _stored(older_than)
    with engine.begin() as connection:
        if connection.execute(select(func.count()).select_from(predictions)).scalar_one() > max_rows:
            newest_first = predictions.c.created_at.desc(), predictions.c.id.desc()
            doomed = doomed | predictions.c.id.in_(select(predictions.c.id).order_by(*newest_first).offset(max_rows))
        connection.execute(delete(outcomes).where(outcomes.c.prediction_id.in_(select(predictions.c.id).where(doomed))))
        return connection.execute(delete(predictions).where(doomed)).rowcount


def _significant(values: np.ndarray) -> np.ndarray:
    """`values` rounded to SUMMARY_DIGITS significant digits, so that JSON writes them short (NaN stays NaN)."""
    magnitude = np.log10(np.abs(values), out=np.zeros_like(values), where=np.isfinite(values) & (values != 0))
    shift = SUMMARY_DIGITS - 1 - np.floor(magnitude)
    scale = 10.0 ** np.abs(shift)  # exact for the exponents sensor readings reach
    return np.where(shift >= 0, np.round(values * scale) / scale, np.round(values / scale) * scale)


def window_summaries(windows: np.ndarray, channels: Sequence[str]) -> list[dict]:
    """Per window (n, T, C), NaN for missing readings: {"channels": names, "mean", "std", "min", "max": one value
    per channel over the T steps (None for a channel with no reading), "missing": each channel's share of steps
    without a reading}."""
    missing = np.isnan(windows)
    readings = np.where(missing, 0.0, windows)
    absent = missing.sum(axis=1)  # (n, C)
    present = windows.shape[1] - absent
    total, squares = readings.sum(axis=1, dtype=np.float64), (readings * readings).sum(axis=1, dtype=np.float64)
    mean = np.divide(total, present, out=np.full(total.shape, np.nan), where=present > 0)
    variance = np.divide(squares, present, out=np.full(total.shape, np.nan), where=present > 0) - mean * mean
    stats = np.stack([mean, np.sqrt(np.maximum(variance, 0.0)), np.fmin.reduce(windows, axis=1),
                      np.fmax.reduce(windows, axis=1), absent / windows.shape[1]])  # (5, n, C)
    by_stat = [[[None if value != value else value for value in window] for window in stat]
               for stat in _significant(stats).tolist()]
    names = list(channels)
    return [{"channels": names, **{stat: values[i] for stat, values in zip(SUMMARY_STATS, by_stat)}}
            for i in range(len(windows))]


def summary_means(summaries: Sequence[dict | None], channels: Sequence[str]) -> np.ndarray:
    """(m, C) per-window channel means, in the order of `channels`, read back from stored window summaries; NaN where
    a channel had no reading or is not in the summary."""
    def means(summary: dict | None) -> list[float]:
        by_channel = dict(zip((summary or {}).get("channels", []), (summary or {}).get("mean", [])))
        return [np.nan if by_channel.get(c) is None else float(by_channel[c]) for c in channels]

    return np.array([means(s) for s in summaries], dtype=np.float64).reshape(-1, len(channels))
