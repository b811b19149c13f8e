"""The prepared sensor windows as the stages read them; no torch, so the stages that need no network (baseline,
register) start without it."""

from __future__ import annotations

from data.sensors.prepare import PreparedSensorData, load_prepared
from flows.paths import SENSOR
from flows.tasks import io_task


@io_task(name="load-prepared-windows")
def load_windows() -> PreparedSensorData:
    return load_prepared(SENSOR.prepared)
