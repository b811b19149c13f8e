"""`python -m serving` (`make serve`): the champion models on SERVING_HOST:SERVING_PORT (127.0.0.1:8000)."""

from __future__ import annotations

import logging

import uvicorn

from serving.app import create_app
from serving.settings import ServingSettings


def main() -> None:
    settings = ServingSettings()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="info")


if __name__ == "__main__":
    main()
