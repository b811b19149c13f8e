"""Serve the deployments of flows/orchestration.py on the Prefect server at PREFECT_API_URL, with the
schedules of `orchestration.schedules`, until Ctrl-C (`make ui` starts it next to the servers).

    PREFECT_API_URL=http://127.0.0.1:4200/api python -m flows.deployments

One flow run at a time: the runs share one workspace (DVC takes a lock; the MLflow SQLite store wants one
writer). A real server is needed: schedules cannot be served on an ephemeral one.
"""

from __future__ import annotations

import os
import sys

import typer
from prefect import serve
from prefect.deployments.runner import EntrypointType, RunnerDeployment

from flows.config import SchedulesConfig
from flows.monitor import monitor
from flows.family import FAMILIES
from flows.orchestration import data_refresh, pipeline, retrain
from flows.params import DEFAULT_PARAMS, ParamsError, load_params
from flows.predict import predict

TAGS = ["failsafe-ml"]


def deployments(schedules: SchedulesConfig) -> list[RunnerDeployment]:
    """The deployments: each family's pipeline (`pipeline/<family>`, run on demand), the data refresh, the retrain
    and the monitor (scheduled)."""
    def deploy(flow, name: str, description: str, schedule_name: str | None = None,
               parameters: dict | None = None) -> RunnerDeployment:
        schedule = schedules.schedule(schedule_name) if schedule_name else None
        return flow.to_deployment(name=name, description=description, tags=TAGS, paused=False,
                                  schedules=[schedule] if schedule else None, parameters=parameters,
                                  entrypoint_type=EntrypointType.MODULE_PATH)

    return [
        *(deploy(pipeline, family, f"The {family} family: prepare -> register, parameters into params.yaml",
                 parameters={"family": family}) for family in FAMILIES),
        deploy(data_refresh, "nightly", "Re-read the sources and version the prepared data", "data_refresh"),
        deploy(retrain, "weekly", "Data refresh, then both pipelines", "retrain"),
        deploy(monitor, "hourly", "Drift and calibration of the champions on the prediction store; recalibration "
                                  "on alarms", "monitor"),
        deploy(predict, "batch", "Score a file (CSV or Parquet, a path or an fsspec URL) with a registered model: "
                                 "family, input, output, alias or version, chunk_rows"),
    ]


def main() -> None:
    """Serve until Ctrl-C; schedules from params.yaml, the file every stage reads."""
    if not os.environ.get("PREFECT_API_URL"):
        typer.secho("error: PREFECT_API_URL is not set; schedules need a running Prefect server (make ui starts one)",
                    fg="red", err=True)
        sys.exit(2)
    try:
        schedules = load_params(DEFAULT_PARAMS).orchestration.schedules
    except ParamsError as error:
        typer.secho(f"error: {error}", fg="red", err=True)
        sys.exit(2)
    serve(*deployments(schedules), limit=1, print_starting_message=True)


if __name__ == "__main__":
    main()
