"""`python -m serving` (`make serve`): the champion models on SERVING_HOST:SERVING_PORT (127.0.0.1:8000)."""

from __future__ import annotations

import logging
import sys

import uvicorn

from contract.manifest import ManifestError
from contract.registry import RegistryStoreError
from serving.app import create_app
from serving.settings import ServingSettings


def main() -> None:
    settings = ServingSettings()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        app = create_app(settings)
    except (RegistryStoreError, ManifestError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="info")


if __name__ == "__main__":
    main()
