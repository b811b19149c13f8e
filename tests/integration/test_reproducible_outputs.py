"""A stage rerun in another copy of the project (another folder) records the same dvc.lock entry."""

from __future__ import annotations

import pytest
import yaml

from tests.integration.workspace import TINY, clone_workspace, run

pytestmark = pytest.mark.integration


def lock_entry(root, stage: str) -> dict:
    return yaml.safe_load((root / "dvc.lock").read_text())["stages"][stage]


def test_sensor_prepare_gives_the_same_lock_entry_in_another_folder(tmp_path, finished_workspace):
    first = lock_entry(finished_workspace, "sensor_prepare")
    clone = clone_workspace(finished_workspace, tmp_path / "elsewhere" / "another clone", TINY)
    run(clone, "dvc", "repro", "--force", "--single-item", "sensor_prepare")  # prepared again, in this folder
    (output,) = first["outs"]
    assert output["path"] == "data/prepared/sensor" and output["nfiles"] == 5  # train, val, test, unlabelled, meta
    assert lock_entry(clone, "sensor_prepare") == first
