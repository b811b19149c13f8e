"""Which MLflow store a process uses: MLflow exports the URI it is given as MLFLOW_TRACKING_URI, which must not
turn one `use_tracking` into the store of every later one in the same process."""

from __future__ import annotations

import os

import mlflow

from flows.config import TrackingConfig
from flows.tracking import use_tracking


def test_a_second_store_in_the_same_process_is_used(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    first, second = (f"sqlite:///{tmp_path / name / 'mlflow.db'}" for name in ("first", "second"))
    use_tracking(TrackingConfig(uri=first))
    assert mlflow.get_tracking_uri() == first
    use_tracking(TrackingConfig(uri=second))
    assert mlflow.get_tracking_uri() == second
    assert "MLFLOW_TRACKING_URI" not in os.environ


def test_the_users_variable_still_wins_and_is_kept(tmp_path, monkeypatch):
    users = f"sqlite:///{tmp_path / 'users' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", users)
    use_tracking(TrackingConfig(uri=f"sqlite:///{tmp_path / 'params' / 'mlflow.db'}"))
    assert mlflow.get_tracking_uri() == users
    assert os.environ["MLFLOW_TRACKING_URI"] == users
