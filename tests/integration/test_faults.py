"""Injected faults: a fine-tuning process killed with SIGKILL between epochs resumes from its checkpoint and ends
with the weights and history of a run that was never interrupted.

Other faults have their tests next to the code they exercise (docs/reference/faults.md lists them all)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from models.sensor.training import finetune_member
from models.serialization import load_state
from tests.unit.test_sensor_training import TINY, data, finetune_cfg

pytestmark = pytest.mark.integration

PROJECT = Path(__file__).resolve().parents[2]
# The same member as below, slowed by a sleep at the start of each epoch so that it can be killed between epochs
# (the sleep changes no number). It runs until it is killed.
SLOW_MEMBER = textwrap.dedent("""
    import sys, time
    import torch
    import models.sensor.training as sensor_training
    from models.sensor.training import finetune_member
    from tests.unit.test_sensor_training import TINY, data, finetune_cfg
    real_rate = sensor_training.small_loss_rate
    sensor_training.small_loss_rate = lambda cfg, epoch: time.sleep(1.0) or real_rate(cfg, epoch)
    x, y = data(); vx, vy = data(seed=1)
    finetune_member(x, y, vx, vy, TINY, finetune_cfg(epochs=6), None, seed=3, device=torch.device("cpu"), checkpoint=sys.argv[1])
""")


def completed_epoch(checkpoint: Path) -> int:
    return load_state(checkpoint, "")["epoch"] if checkpoint.exists() else -1


def test_a_member_killed_with_sigkill_resumes_to_the_same_weights(tmp_path):
    x, y = data()
    vx, vy = data(seed=1)
    reference, uninterrupted = finetune_member(x, y, vx, vy, TINY, finetune_cfg(epochs=6), None, seed=3, device=torch.device("cpu"))

    checkpoint = tmp_path / "member.pt"
    process = subprocess.Popen([sys.executable, "-c", SLOW_MEMBER, str(checkpoint)], cwd=PROJECT,
                               env={**os.environ, "PYTHONPATH": str(PROJECT)})
    try:
        deadline = time.monotonic() + 300
        while completed_epoch(checkpoint) < 2:
            assert process.poll() is None, "the member finished or failed before it could be killed"
            assert time.monotonic() < deadline, "no checkpoint of epoch 2 within 300 s"
            time.sleep(0.1)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    killed_after = completed_epoch(checkpoint)
    assert 2 <= killed_after < 5

    resumed, result = finetune_member(x, y, vx, vy, TINY, finetune_cfg(epochs=6), None, seed=3, device=torch.device("cpu"),
                                     checkpoint=checkpoint)
    assert result.resumed_from == killed_after
    assert result.history == uninterrupted.history
    for name, tensor in reference.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), name
