"""`python -m serving` (`make serve`): the champion models on SERVING_HOST:SERVING_PORT (127.0.0.1:8000)."""

from __future__ import annotations

import logging
import os
import sys

import uvicorn

from contract.manifest import ManifestError
from contract.registry import RegistryStoreError
from serving.app import create_app
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
    # one process: this app; several: each worker builds its own from the same environment
    uvicorn.run(app if settings.workers == 1 else "serving.app:create_worker_app", factory=settings.workers > 1,
                workers=settings.workers, host=settings.host, port=settings.port, loop="uvloop",
                http="serving.http_protocol:DeadlineProtocol",
                access_log=False, log_level="info", timeout_graceful_shutdown=settings.shutdown_timeout_s)
    # The app has shut down (featurisation workers included). Tearing down the interpreter's heap of
    # MLflow, pandas and RDKit objects takes seconds on a busy machine and has nothing left to do.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
