"""Reading the prediction store (contract/prediction_store.py) for the monitor: recent predictions of one model
version, and its predictions that have a labelled outcome. Read-only: the service writes the store."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from sqlalchemy import select
from sqlalchemy.engine import Engine, make_url

from contract.prediction_store import DEFAULT_URL, outcomes, predictions

SQLITE = "sqlite:///"


def store_url(url: str | None, root: Path) -> str:
    """`url`, or the service's default; a relative SQLite path is made absolute under the project `root`."""
    url = url or DEFAULT_URL
    if url.startswith(SQLITE) and not url[len(SQLITE):].startswith("/"):
        url = SQLITE + str((root / url[len(SQLITE):]).resolve())
    return url


def shown_url(url: str) -> str:
    """The URL with any password hidden (for tags and logs)."""
    return make_url(url).render_as_string(hide_password=True)


def _frame(engine: Engine, query) -> pd.DataFrame:
    with engine.connect() as connection:
        return pd.DataFrame(connection.execute(query).all(), columns=[c.name for c in query.selected_columns])


def recent_predictions(engine: Engine, family: str, name: str, version: str, limit: int) -> pd.DataFrame:
    """The last `limit` predictions of `name` version `version`, oldest first: id, created_at, unit, time,
    input_summary (dict), output (dict)."""
    query = (select(predictions.c.id, predictions.c.created_at, predictions.c.unit, predictions.c.time,
                    predictions.c.input_summary, predictions.c.output)
             .where(predictions.c.family == family, predictions.c.model_name == name,
                    predictions.c.model_version == str(version))
             .order_by(predictions.c.created_at.desc(), predictions.c.id.desc()).limit(limit))
    return _frame(engine, query).iloc[::-1].reset_index(drop=True)


def labelled_predictions(engine: Engine, family: str, name: str, version: str, limit: int) -> pd.DataFrame:
    """The last `limit` predictions of `name` version `version` with an outcome (by the time the outcome came),
    oldest first: id, created_at, received_at, unit, output (dict), observed (float)."""
    query = (select(predictions.c.id, predictions.c.created_at, outcomes.c.received_at, predictions.c.unit,
                    predictions.c.output, outcomes.c.observed)
             .join(outcomes, outcomes.c.prediction_id == predictions.c.id)
             .where(predictions.c.family == family, predictions.c.model_name == name,
                    predictions.c.model_version == str(version))
             .order_by(outcomes.c.received_at.desc(), predictions.c.id.desc()).limit(limit))
    return _frame(engine, query).iloc[::-1].reset_index(drop=True)
