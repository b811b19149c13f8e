"""Shared fixtures. `shared_data` finds ../shared/data: under CI=true a missing folder fails the test,
for a user without it the test skips with the reason."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Flows run in-process by tests keep their Prefect state out of the project's own .prefect/.
os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="prefect-home-")
os.environ.pop("PREFECT_API_URL", None)
# Services started by tests write their prediction log outside the project.
os.environ["SERVING_PREDICTION_STORE"] = f"sqlite:///{tempfile.mkdtemp(prefix='prediction-store-')}/predictions.db"

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("SHARED_DATA_DIR", PROJECT_ROOT.parent / "shared" / "data"))


# `make test` hands out whole files to its workers in collection order (`--dist loadfile --no-loadscope-reorder`),
# so this order comes first. test_pipeline builds the finished workspace (the whole tiny pipeline, about 3 minutes of
# one worker); the long files next keep the other worker busy meanwhile (test_scale_out builds the prepared
# workspace), and test_orchestration, which clones the finished workspace, comes after about as much work. The long
# files go early: one started last would keep its worker busy after the others ran out of work.
FIRST = ("tests/integration/test_pipeline.py", "tests/integration/test_scale_out.py",
         "tests/integration/test_lean_install.py", "tests/integration/test_tune.py", "tests/integration/test_trust.py",
         "tests/integration/test_prepare_stages.py", "tests/integration/test_orchestration.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Path of ../shared/data (or $SHARED_DATA_DIR)."""
    if SHARED_DATA.is_dir():
        return SHARED_DATA
    reason = f"needs the developer datasets at {SHARED_DATA}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}, and CI=true: CI must have them")
    pytest.skip(reason)


@contextlib.contextmanager
def _tracking_variable_kept() -> Iterator[None]:
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before


# mlflow.set_tracking_uri exports its URI as MLFLOW_TRACKING_URI, which wins over every later params.yaml in this
# process: each test, and each module's fixtures (autouse fixtures of a scope are set up before its others), leave
# the variable as they found it.
@pytest.fixture(autouse=True)
def restore_tracking_variable():
    with _tracking_variable_kept():
        yield


@pytest.fixture(scope="module", autouse=True)
def restore_tracking_variable_per_module():
    with _tracking_variable_kept():
        yield


@pytest.fixture(scope="session", autouse=True)
def stop_prefect_servers():
    """Stop the temporary Prefect API servers that flows run in-process started, while pytest's output is still
    open (Prefect's own exit hook logs to a closed stream otherwise)."""
    yield
    server = sys.modules.get("prefect.server.api.server")
    if server is not None:
        for instance in list(server.SubprocessASGIServer._instances.values()):
            instance.stop()
