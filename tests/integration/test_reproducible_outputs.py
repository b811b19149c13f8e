"""A stage rerun in a fresh copy of the project (another folder) records the same dvc.lock entry."""

from __future__ import annotations

import pytest
import yaml

from tests.integration.workspace import make_workspace, run

pytestmark = pytest.mark.integration

SMALL = {"sensor": {"data": {"simulator": {"n_units": 12, "n_steps": 400}}}}


def locked(root, stage: str) -> dict:
    run(root, "dvc", "repro", "--single-item", stage)
    return yaml.safe_load((root / "dvc.lock").read_text())["stages"][stage]


def test_sensor_prepare_gives_the_same_lock_entry_in_two_clones(tmp_path):
    first = locked(make_workspace(tmp_path / "clone", SMALL), "sensor_prepare")
    second = locked(make_workspace(tmp_path / "elsewhere" / "another clone", SMALL), "sensor_prepare")
    (output,) = first["outs"]
    assert output["path"] == "data/prepared/sensor" and output["nfiles"] == 5  # train, val, test, unlabelled, meta
    assert first == second
