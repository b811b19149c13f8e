"""`python -m serving` (`make serve`): the champion models on SERVING_HOST:SERVING_PORT (127.0.0.1:8000)."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

import uvicorn

from contract.manifest import ManifestError
from contract.registry import RegistryStoreError
from serving.app import create_app
from serving.metrics import MULTIPROCESS_FOLDER
from serving.prediction_log import PredictionStoreError
from serving.settings import ServingSettings


def main() -> None:
    settings = ServingSettings()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        app = create_app(settings)  # opens the store and the key: a missing or unreadable one stops here, in one line
    except (RegistryStoreError, ManifestError, PredictionStoreError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
    # one process: this app; several: each worker builds its own from the same environment, and they share metrics
    made_folder = shared_metrics_folder() if settings.workers > 1 else None
    uvicorn.run(app if settings.workers == 1 else "serving.app:create_worker_app", factory=settings.workers > 1,
                workers=settings.workers, host=settings.host, port=settings.port, loop="uvloop",
                http="serving.http_protocol:DeadlineProtocol",
                access_log=False, log_level="info", timeout_graceful_shutdown=settings.shutdown_timeout_s)
    # The app has shut down (featurisation workers included). Tearing down the interpreter's heap of
    # MLflow, pandas and RDKit objects takes seconds on a busy machine and has nothing left to do.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    if made_folder is not None:
        shutil.rmtree(made_folder, ignore_errors=True)
    os._exit(0)


def shared_metrics_folder() -> str | None:
    """Give the workers a folder for their metrics (PROMETHEUS_MULTIPROC_DIR, serving.metrics): the one set, emptied
    of an earlier run's values, else a new temporary one, which is returned (to be removed at the end)."""
    folder = os.environ.get(MULTIPROCESS_FOLDER)
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        for values in Path(folder).glob("*.db"):
            values.unlink()
        return None
    os.environ[MULTIPROCESS_FOLDER] = tempfile.mkdtemp(prefix="serving-metrics-")
    return os.environ[MULTIPROCESS_FOLDER]


if __name__ == "__main__":
    main()
