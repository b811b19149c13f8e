"""An MLflow stage run spans its stage: from the start of the Prefect flow run to the end of `stage_run`."""

from __future__ import annotations

import time

import pytest
from mlflow import MlflowClient
from prefect import flow

from flows.config import TrackingConfig
from flows.tracking import stage_run

pytestmark = pytest.mark.integration


def test_run_starts_with_the_flow_run_and_ends_with_the_stage(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    cfg = TrackingConfig(uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    marks = {}

    @flow(name="run-duration-probe")
    def probe() -> str:
        marks["flow_began"] = time.time()
        time.sleep(1.0)  # work before the MLflow run is opened (reading data, fitting)
        with stage_run(cfg, "sensor", "probe", {"a": 1}) as run:
            time.sleep(1.0)  # work inside it
            marks["work_done"] = time.time()
        return run.info.run_id

    run = MlflowClient(cfg.uri).get_run(probe())
    assert run.info.status == "FINISHED"
    assert run.info.start_time <= marks["flow_began"] * 1000
    assert run.info.end_time >= int(marks["work_done"] * 1000)  # MLflow keeps whole milliseconds
