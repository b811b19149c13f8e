"""The shared fine-tuning schedules (models/schedules.py): warm-up, then each registered decay to the final ratio;
both families' configs accept them."""

from __future__ import annotations

import math

import pytest

from models.sensor.config import SensorFinetuneConfig
from models.schedules import LR_SCHEDULES, lr_factor


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
