"""Stage `sensor_prepare`: load, validate, split and window the sensor data (a DVC output)."""

from __future__ import annotations

import mlflow
from prefect import flow

from data.sensors.prepare import PreparedSensorData, prepare_sensor_data, save_prepared
from flows.params import load_params
from flows.paths import SENSOR
from flows.tasks import compute_task, io_task, stage_cli
from flows.tracking import flatten, log_json, stage_run


@io_task(name="load-validate-window")
def build(cfg) -> PreparedSensorData:
    return prepare_sensor_data(cfg)


@io_task(name="save-prepared-windows")
def save(prepared: PreparedSensorData) -> None:
    save_prepared(prepared, SENSOR.prepared)


@compute_task(name="summarise")
def summarise(prepared: PreparedSensorData) -> dict[str, float]:
    """Numeric facts of the report, flattened for MLflow metrics."""
    return {k: float(v) for k, v in flatten("", prepared.report).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


@flow(name="sensor-prepare")
def sensor_prepare(params_file: str = "params.yaml") -> dict:
    """Prepare windows for the sensor model from `sensor.data`."""
    params = load_params(params_file)
    cfg = params.sensor.data
    prepared = build(cfg)
    save(prepared)
    with stage_run(params.tracking, "sensor", "prepare", {"data": cfg.model_dump(mode="json")}, {"sensor": SENSOR.prepared}):
        mlflow.log_metrics({k.replace("/", "_"): v for k, v in summarise(prepared).items()})
        log_json(prepared.report, "prepare_report.json")
    sizes = {name: (len(w), int(w.y.sum())) for name, w in prepared.windows.items()}
    print(f"sensor windows (total, positive): {sizes}; channels: {prepared.channels}")
    return prepared.report


if __name__ == "__main__":
    stage_cli(sensor_prepare)
