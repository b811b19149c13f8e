"""Reading the prediction store (contract/prediction_store.py) for the monitor, as data frames: recent predictions
of one model version, and its predictions that have a labelled outcome. Read-only: the service writes the store."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from sqlalchemy.engine import Engine, make_url

from contract import prediction_store
from contract.prediction_store import DEFAULT_URL

SQLITE = "sqlite:///"
RECENT_COLUMNS = ["id", "created_at", "unit", "time", "input_summary", "output"]
LABELLED_COLUMNS = ["id", "created_at", "received_at", "unit", "output", "observed"]


def store_url(url: str | None, root: Path) -> str:
    """`url`, or the service's default; a relative SQLite path is made absolute under the project `root`."""
    url = url or DEFAULT_URL
    if url.startswith(SQLITE) and not url[len(SQLITE):].startswith("/"):
        url = SQLITE + str((root / url[len(SQLITE):]).resolve())
    return url


def shown_url(url: str) -> str:
    """The URL with any password hidden (for tags and logs)."""
    return make_url(url).render_as_string(hide_password=True)


def recent_predictions(engine: Engine, family: str, name: str, version: str, limit: int) -> pd.DataFrame:
    """The last `limit` predictions of `name` version `version`, oldest first (contract's recent_predictions)."""
    rows = prediction_store.recent_predictions(engine, family, name, version, limit)
    return pd.DataFrame(rows, columns=RECENT_COLUMNS)


def labelled_predictions(engine: Engine, family: str, name: str, version: str, limit: int) -> pd.DataFrame:
    """The last `limit` predictions of `name` version `version` with an outcome, oldest first (contract's
    labelled_predictions)."""
    rows = prediction_store.labelled_predictions(engine, family, name, version, limit)
    return pd.DataFrame(rows, columns=LABELLED_COLUMNS)
