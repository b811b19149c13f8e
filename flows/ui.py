"""`make ui`: the Prefect UI on 127.0.0.1:4200 and the MLflow UI on 127.0.0.1:5000, until Ctrl-C.

Both read the project's own stores (.prefect/prefect.db, mlflow/mlflow.db); Ctrl-C stops both.
"""

from __future__ import annotations

import subprocess
import sys
import time

from flows.params import load_params
from flows.server import prefect_server
from flows.tracking import tracking_uri

PREFECT_PORT, MLFLOW_PORT = 4200, 5000


def main() -> None:
    uri = tracking_uri(load_params().tracking)
    mlflow_ui = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
                                  "--host", "127.0.0.1", "--port", str(MLFLOW_PORT), "--workers", "1"])
    try:
        with prefect_server(port=PREFECT_PORT, ui=True):
            print(f"Prefect UI: http://127.0.0.1:{PREFECT_PORT}   MLflow UI: http://127.0.0.1:{MLFLOW_PORT}"
                  "   (Ctrl-C stops both)", flush=True)
            while mlflow_ui.poll() is None:
                time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        mlflow_ui.terminate()
        mlflow_ui.wait(timeout=20)


if __name__ == "__main__":
    main()
