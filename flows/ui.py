"""`make ui`: the Prefect UI on 127.0.0.1:4200 with the project's deployments served (schedules from
`orchestration.schedules`), and the MLflow UI on 127.0.0.1:5000, until Ctrl-C.

Both servers read the project's own stores (.prefect/prefect.db, mlflow/mlflow.db). Ctrl-C stops the
deployments runner first (its schedules are paused until the next `make ui`), then the Prefect server,
then the MLflow UI.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

from contract.lifetime import child_dies_with_parent
from flows.family import FAMILIES
from flows.params import DEFAULT_PARAMS, load_params
from flows.server import prefect_server
from flows.tracking import tracking_uri

PREFECT_PORT, MLFLOW_PORT = 4200, 5000


@contextlib.contextmanager
def child(command: list[str], env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """A child process in its own session (the terminal's Ctrl-C reaches only this process, which stops
    the children in order); on exit: SIGINT, then SIGTERM, then SIGKILL, each after a grace period."""
    process = subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=child_dies_with_parent)
    try:
        yield process
    finally:
        for stop, grace in ((lambda: process.send_signal(signal.SIGINT), 15), (process.terminate, 15),
                            (process.kill, 5)):
            if process.poll() is not None:
                break
            stop()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=grace)


def main() -> None:
    config = load_params(DEFAULT_PARAMS)
    mlflow_ui = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", tracking_uri(config.tracking),
                 "--host", "127.0.0.1", "--port", str(MLFLOW_PORT), "--workers", "1"]
    try:
        # MLflow's job runner (GenAI background jobs, five worker processes) is not needed for browsing runs
        with child(mlflow_ui, env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}), prefect_server(port=PREFECT_PORT, ui=True) as api_url, \
                child([sys.executable, "-m", "flows.deployments"],
                      env={**os.environ, "PREFECT_API_URL": api_url}) as runner:
            print(f"Prefect UI: http://127.0.0.1:{PREFECT_PORT}   MLflow UI: http://127.0.0.1:{MLFLOW_PORT}\n"
                  f"Deployments: {', '.join(f'pipeline/{family}' for family in FAMILIES)}, data-refresh/nightly, "
                  "retrain/weekly, monitor/hourly   (Ctrl-C stops everything)", flush=True)
            while runner.poll() is None:
                time.sleep(1)
            print(f"the deployments runner exited with status {runner.returncode}", file=sys.stderr)
    except KeyboardInterrupt:
        print("stopping ...", flush=True)


if __name__ == "__main__":
    main()
