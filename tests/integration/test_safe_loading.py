"""A crafted fine-tuned ensemble (what `dvc pull` or a shared folder could deliver) stops the stage that loads it
with one line, without running what it holds."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.integration.workspace import clone_workspace, run
from tests.unit.test_serialization import RunsCode

pytestmark = pytest.mark.integration


def test_calibrate_stage_refuses_a_planted_ensemble_in_one_line(tmp_path, finished_workspace):
    workspace = clone_workspace(finished_workspace, tmp_path / "workspace", {})
    marker, planted = tmp_path / "ran", workspace / "artifacts" / "sensor" / "finetuned.pt"
    planted.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": {}, "members": [RunsCode(marker)]}, planted)
    result = run(workspace, sys.executable, "-m", "flows.stages.calibrate", "sensor", check=False)
    assert result.returncode == 2
    assert (f"error: {planted}: refused to load: it holds Python objects that could run code (posix.system)"
            in result.stderr)
    assert "dvc repro sensor_finetune" in result.stderr and "Traceback" not in result.stderr
    assert not marker.exists()
