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

from tests import run_folder

# Flows run in-process by tests keep their Prefect state out of the project's own .prefect/.
os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="prefect-home-")
os.environ.pop("PREFECT_API_URL", None)
# One intra-op thread per test process and per process it starts, in torch and in ONNX Runtime (models/onnx_runtime.py
# follows OMP_NUM_THREADS; set before anything imports torch): `make test` already runs one worker per core, and each
# process's own intra-op threads only wait and spin beside the other worker's.
# An OMP_NUM_THREADS already set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Services started by tests write their prediction log outside the project.
os.environ["SERVING_PREDICTION_STORE"] = f"sqlite:///{tempfile.mkdtemp(prefix='prediction-store-')}/predictions.db"

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("SHARED_DATA_DIR", PROJECT_ROOT.parent / "shared" / "data"))


# `make test` hands out whole files to its workers in this order (`--dist loadfile --no-loadscope-reorder`). First the
# file whose fixture builds the finished workspace (the whole tiny pipeline, about 4 minutes of one worker); then long
# files that do not need it, enough to keep the other worker busy meanwhile; then the files that clone it; the rest,
# short files, last, so that no worker is left with a long file after the others ran out of work.
BUILDS_THE_WORKSPACE = "tests/integration/test_pipeline.py"
LONG_WITHOUT_THE_WORKSPACE = (
    "tests/integration/test_lean_install.py", "tests/integration/test_prepare_stages.py",
    "tests/integration/test_serving.py", "tests/integration/test_serving_novelty.py", "tests/unit/test_sensor_model.py",
    "tests/unit/test_models.py", "tests/unit/test_molecule_prepare.py", "tests/integration/test_trust.py",
    "tests/integration/test_rollback.py", "tests/integration/test_monitoring.py", "tests/unit/test_prediction_log.py",
    "tests/unit/test_molecule_model.py", "tests/unit/test_tune.py", "tests/unit/test_novelty.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def path(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    cloning = {path(item) for item in items if "finished_workspace" in item.fixturenames}

    def rank(item: pytest.Item) -> tuple[int, int]:
        if path(item) == BUILDS_THE_WORKSPACE:
            return 0, 0
        if path(item) in LONG_WITHOUT_THE_WORKSPACE:
            return 1, LONG_WITHOUT_THE_WORKSPACE.index(path(item))
        return (2, 0) if path(item) in cloning else (3, 0)

    items.sort(key=rank)  # stable: collection order within a rank


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller, before it starts the xdist workers, or the only process
        run_folder.make()


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # after every worker has finished
        run_folder.remove()


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
