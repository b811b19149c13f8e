"""What DVC hashes as a stage's code: bytecode caches are not stage inputs (they exist or not depending on the
machine and PYTHONDONTWRITEBYTECODE, and made a fresh clone's `dvc.lock` differ from the committed one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DVC = Path(sys.executable).with_name("dvc")


def ignored(*paths: str) -> set[str]:
    """The paths `dvc check-ignore` says DVC leaves out of its hashes."""
    answer = subprocess.run([str(DVC), "check-ignore", *paths], cwd=ROOT, capture_output=True, text=True, timeout=120)
    return set(answer.stdout.split())


def test_bytecode_caches_are_not_stage_inputs_and_sources_are():
    caches = ["data/sensors/__pycache__/split.cpython-311.pyc", "models/molecule/__pycache__/network.cpython-312.pyc"]
    sources = ["data/sensors/split.py", "models/molecule/network.py", "models/schedules.py"]
    assert ignored(*caches, *sources) == set(caches)
