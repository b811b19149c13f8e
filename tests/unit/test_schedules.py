"""The shared fine-tuning schedules (models/schedules.py) and gradient clipping in the training loop: warm-up,
then each registered decay to the final ratio; both families' configs accept them and reach the loop."""

from __future__ import annotations

import math

import pytest
import torch

from models.sensor.config import SensorFinetuneConfig
from models.schedules import LR_SCHEDULES, lr_factor
from models.training import TrainingSettings, train


@pytest.mark.parametrize("schedule", sorted(LR_SCHEDULES))
def test_each_schedule_warms_up_then_decays_monotonically_to_the_final_ratio(schedule):
    factors = [lr_factor(schedule, e, 10, 2, 0.1) for e in range(10)]
    assert factors[:3] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert factors[-1] == pytest.approx(0.1)
    assert all(a > b for a, b in zip(factors[2:], factors[3:]))
    assert [lr_factor(schedule, e, 10, 0, 1.0) for e in range(10)] == [1.0] * 10  # the defaults: constant lr


def test_cosine_and_exponential_differ_in_shape():
    """Halfway through the decay cosine is at the mean of 1 and the final ratio, exponential at its geometric mean."""
    assert lr_factor("cosine", 5, 11, 0, 0.1) == pytest.approx(0.55)
    assert lr_factor("exponential", 5, 11, 0, 0.1) == pytest.approx(math.sqrt(0.1))


def test_an_unknown_schedule_is_a_config_error_naming_it():
    with pytest.raises(ValueError, match="lr_schedule"):
        SensorFinetuneConfig(lr_schedule="linear")


def test_gradient_clipping_bounds_the_step(monkeypatch):
    """With plain SGD the step is lr * gradient: clipped to norm 0.5, a gradient of norm 10 moves the weights 0.5 lr."""
    monkeypatch.setattr(torch.optim, "AdamW", lambda params, lr, weight_decay: torch.optim.SGD(params, lr=lr))

    def step_size(max_grad_norm):
        net = torch.nn.Linear(1, 1, bias=False)
        torch.nn.init.zeros_(net.weight)
        train(net, lambda epoch: [torch.ones(1, 1)], lambda model, batch: -10.0 * model(batch).sum(), None,
              TrainingSettings(epochs=1, lr=0.1, max_grad_norm=max_grad_norm), device=torch.device("cpu"))
        return float(net.weight.detach().norm())

    assert step_size(None) == pytest.approx(1.0)  # 0.1 * 10
    assert step_size(0.5) == pytest.approx(0.05)  # 0.1 * 0.5
