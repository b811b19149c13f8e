"""A failed stage under the project's runner: DVC deletes the stage's outputs before running it; the
runner checks the previous ones out again and says so."""

from __future__ import annotations

import sys

import pytest
import yaml

from tests.integration.workspace import TINY, clone_workspace, run

pytestmark = pytest.mark.integration

REPRO = ("from flows.dvc import DvcError, repro\n"
         "try:\n    repro('sensor_prepare')\nexcept DvcError as error:\n    raise SystemExit(str(error))")


def test_a_failed_stage_gets_its_previous_outputs_back_and_the_message_says_so(tmp_path, finished_workspace):
    root = clone_workspace(finished_workspace, tmp_path / "ws", TINY)  # sensor_prepare has run
    prepared = root / "data" / "prepared" / "sensor"
    before = {p.name: p.read_bytes() for p in prepared.iterdir()}

    params = yaml.safe_load((root / "params.yaml").read_text())
    params["sensor"]["data"]["window"] = -1  # the stage refuses it at once
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    result = run(root, sys.executable, "-c", REPRO, check=False)

    assert result.returncode == 1
    assert "sensor.data.window" in result.stderr
    assert result.stderr.rstrip().endswith(
        "the previous outputs of sensor_prepare are restored (dvc checkout sensor_prepare)")
    assert {p.name: p.read_bytes() for p in prepared.iterdir()} == before
