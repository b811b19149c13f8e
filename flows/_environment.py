"""Process environment for everything the project launches: telemetry off, state inside the project.

Imported by `flows/__init__.py` before Prefect or MLflow are imported anywhere in the package.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path


def workspace() -> Path:
    """The pipeline's working folder, where data/prepared, artifacts, metrics, mlflow and .prefect live.

    It is the folder a stage runs in (DVC runs every stage from the repository root), so a test can
    run the whole pipeline in a scratch copy without touching the project's own state.
    """
    return Path.cwd()


_DEFAULTS = {
    "PREFECT_HOME": str(workspace() / ".prefect"),
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_ALLOW_EPHEMERAL_MODE": "true",
    # A stage run alone (no PREFECT_API_URL) starts a temporary Prefect server; Prefect waits 20 s for it,
    # which a busy machine can exceed.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    "DO_NOT_TRACK": "1",
    "GIT_PYTHON_REFRESH": "quiet",
}

for _key, _value in _DEFAULTS.items():
    os.environ.setdefault(_key, _value)

# The ONNX exporter warns about torchvision ops it cannot register (this project uses none) and
# about empty attribute lists it types itself.
for _logger in ("torch.onnx._internal.exporter._registration", "onnx_ir._convenience"):
    logging.getLogger(_logger).setLevel(logging.ERROR)
