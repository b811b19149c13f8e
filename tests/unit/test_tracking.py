"""Which MLflow store a process uses: MLflow exports the URI it is given as MLFLOW_TRACKING_URI, which must not
turn one `use_tracking` into the store of every later one in the same process."""

from __future__ import annotations

import os

import mlflow
from mlflow import MlflowClient

from flows.config import TrackingConfig
from flows.tracking import experiment_id, use_tracking


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


def test_experiments_are_training_experiments_in_mlflows_ui(tmp_path, monkeypatch):
    """A new experiment is created with `mlflow.experimentKind`; one created before without it gets it."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    cfg = TrackingConfig(uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    use_tracking(cfg)
    older = MlflowClient().create_experiment("molecule")
    sensor = experiment_id(cfg, "sensor")
    assert experiment_id(cfg, "molecule") == older
    for experiment in (sensor, older):
        assert MlflowClient().get_experiment(experiment).tags["mlflow.experimentKind"] == "custom_model_development"
    MlflowClient().set_experiment_tag(sensor, "mlflow.experimentKind", "genai_development")  # chosen in the UI
    experiment_id(cfg, "sensor")
    assert MlflowClient().get_experiment(sensor).tags["mlflow.experimentKind"] == "genai_development"
