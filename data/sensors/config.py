"""The `sensor.data` section of params.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from data.config import StrictModel


class SimulatorConfig(StrictModel):
    """Knobs of the embedded sensor fleet simulator (see data/sensors/simulator.py)."""

    n_units: int = Field(80, ge=3, description="machines in the fleet")
    n_steps: int = Field(750, ge=64, description="time steps per machine when it does not fail")
    channels: list[str] = Field(
        default_factory=lambda: ["vibration", "temperature", "pressure", "current", "flow", "voltage"],
        min_length=1,
    )
    failure_fraction: float = Field(0.45, gt=0, le=1, description="share of machines that degrade and fail")
    steps_per_day: int = Field(96, ge=4, description="length of the daily cycle in steps")
    noise_std: float = Field(0.05, ge=0)
    drift_std: float = Field(0.002, ge=0, description="random-walk sensor drift per step")
    dropout_rate: float = Field(0.002, ge=0, lt=1, description="chance per step and channel that a NaN gap starts")
    label_flip_rate: float = Field(0.0, ge=0, lt=0.5, description="share of row labels flipped at random")
    label_shift_max: int = Field(0, ge=0, description="failure labels moved early/late by up to this many steps")
    plant_seed: int | None = Field(
        None, description="seed of the plant: channel levels, regime levels and daily amplitudes (null: from the "
        "simulation's seed). Fleets with one plant_seed and other seeds are other machines of the same plant")
    regime_shift: float = Field(0.0, description="added to every operating regime's level, all channels (in units of "
                                "10% of a channel's level): an operating point the training fleet never saw")


class SensorDataConfig(StrictModel):
    """Where the sensor data comes from and how it is windowed and split."""

    source: Literal["simulator", "cmapss", "skab", "file"] = "simulator"
    path: Path | None = Field(None, description="file (file, cmapss) or folder (skab); unused by simulator")
    unit_column: str = "unit"
    time_column: str = "time"
    label_column: str = "label"
    sensor_columns: list[str] | None = Field(
        None,
        description="None: every other column that holds numbers (a wholly non-numeric column such as a name is "
        "skipped and listed in the report; a numeric column with a few non-numeric cells is an error naming them)",
    )
    nonfinite: Literal["error", "as_missing"] = Field(
        "error",
        description="a sensor reading of +-inf or beyond float32: stop naming the cells (error), or treat it as a "
        "missing reading, counted per channel in the report (as_missing)",
    )
    window: int = Field(32, ge=2, description="time steps per window")
    stride: int = Field(4, ge=1)
    reference_steps: int = Field(100, ge=1, description="a unit's first rows, taken as its normal (healthy) level: the unit levels of relative channels and the novelty score's unit references (the service takes the healthy windows a user sends)")
    horizon: int = Field(48, ge=0, description="a window is positive if a label-1 row lies within `horizon` steps after its last step (0: the last row's label)")
    split: Literal["unit", "time", "column"] = "unit"
    split_column: str = Field("split", description="for split=column: holds train/val/test")
    unit_order: Literal["shuffled", "sorted"] = Field(
        "shuffled",
        description="split=unit: shuffle units (seeded, stratified by failure) or take them in sorted id order "
        "(first units train, then val, then test: the CMAPSS engines 1-70/71-85/86-100 protocol)",
    )
    val_fraction: float = Field(0.15, gt=0, lt=0.5)
    test_fraction: float = Field(0.15, gt=0, lt=0.5)
    drop_constant: bool = Field(True, description="drop channels that are constant on the training split")
    train_label_flip_rate: float = Field(0.0, ge=0, lt=0.5, description="flip this share of training-window labels (robustness experiments)")
    train_unlabelled_fraction: float = Field(
        0.0, ge=0, lt=1, description="withhold the labels of this share of training windows (seeded): they join the "
        "unlabelled windows of rows without a label (semi-supervised experiments)")
    seed: int = 0
    simulator: SimulatorConfig = Field(default_factory=SimulatorConfig)

    @model_validator(mode="after")
    def _path_when_needed(self) -> "SensorDataConfig":
        if self.source in ("file", "cmapss", "skab") and self.path is None:
            raise ValueError(f"sensor.data.path is required when source is '{self.source}'")
        return self
