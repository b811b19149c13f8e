"""PyTorch DDP through `torchrun`: two local gloo processes fine-tune the sensor model on shards of the same
global batches, and follow the loss curve of one process training on the whole batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from models.sensor.training import finetune_member
from tests.integration.ddp_worker import FINETUNE, MODEL, SEED, data

pytestmark = pytest.mark.integration

PROJECT = Path(__file__).resolve().parents[2]
# float32 sums over 32 + 32 rows averaged across ranks instead of over 64 rows: the curves differ by ~1e-7
# relative (measured <= 6e-8); each epoch lowers the loss by >= 5 %, so 1e-4 tells a real divergence apart.
RTOL = 1e-4


def test_two_torchrun_processes_follow_the_single_process_loss_curve(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launch = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "tests.integration.ddp_worker", str(tmp_path)],
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=180)
    assert launch.returncode == 0, launch.stderr[-3000:]

    _, single = finetune_member(*data(), MODEL, FINETUNE.model_copy(update={"checkpoint": False}), None,
                                seed=SEED, device=torch.device("cpu"))
    history = json.loads((tmp_path / "history.json").read_text())
    ddp_loss = np.array([record["train_loss"] for record in history])
    single_loss = np.array([record["train_loss"] for record in single.history])
    assert len(ddp_loss) == FINETUNE.epochs
    np.testing.assert_allclose(ddp_loss, single_loss, rtol=RTOL)
    assert np.all(np.diff(ddp_loss) < 0) and ddp_loss[-1] < 0.8 * ddp_loss[0]

    # each rank trained on its half of every 64-row global batch: 4 batches an epoch
    for rank in range(2):
        rows = json.loads((tmp_path / f"rows{rank}.json").read_text())
        assert rows == [32] * (4 * FINETUNE.epochs)

    weights = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in range(2)]
    for name, tensor in weights[0].items():
        assert torch.equal(tensor, weights[1][name]), name
    assert torch.load(tmp_path / "member.pt", weights_only=True)["history"] == history
