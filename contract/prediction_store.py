"""The prediction store: every prediction the service answers (or runs in shadow) and the outcomes observed
later, in SQL: SQLite inside the project by default, PostgreSQL by URL. The service writes it; the `monitor`
flow reads it. SQLAlchemy Core tables; the schema is created on first use.

Tables (one row per item, not per request):
- `predictions`: id (the `prediction_id` a response carries), created_at (UTC), family, model_name,
  model_version, role (`champion`, `challenger` when a canary answered, `shadow` when logged only), request_id
  (pairs a shadow row with the answered one), unit and time (sensor windows, optional), input_digest (sha256 of
  the item), input_summary (JSON: sensor per-channel mean/std/min/max and missing share; molecule: canonical SMILES,
  descriptors, nearest-neighbour Tanimoto similarity to the training set), output (JSON: the answered fields).
- `outcomes`: prediction_id, family, observed (label 0/1 or value), received_at (UTC).
"""

from __future__ import annotations

import datetime

from sqlalchemy import JSON, Column, DateTime, Float, Index, MetaData, String, Table, create_engine
from sqlalchemy.engine import Engine

DEFAULT_URL = "sqlite:///mlflow/predictions.db"

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
    Index("predictions_family_created", "family", "created_at"),
    Index("predictions_unit_time", "unit", "time"),
)

outcomes = Table(
    "outcomes", metadata,
    Column("prediction_id", String(32), primary_key=True),
    Column("family", String(16), nullable=False),
    Column("observed", Float, nullable=False),
    Column("received_at", DateTime(timezone=True), nullable=False),
    Index("outcomes_family_received", "family", "received_at"),
)


def connect(url: str) -> Engine:
    """An engine on the store at `url`, its tables created when missing."""
    engine = create_engine(url, future=True)
    metadata.create_all(engine)
    return engine


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)
