"""The sensor family's /v1 bodies: windows of readings in, failure probability and alert out."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from serving.schemas import ModelRef, Time, Unit, Window


class SensorRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    windows: list[Window] = Field(
        min_length=1,
        description="windows of time steps, each step one value per channel in the model's channel order "
                    "(`null` for a missing reading); exactly the model's `window` steps each, see /v1/models; "
                    "at most SERVING_MAX_ITEMS windows",
    )
    unit: Unit | None = Field(None, description="optional: the machine all the windows come from (or `units`)")
    units: list[Unit] | None = Field(None, description="optional: the machine each window comes from, one per window; "
                                     "its reference scores the novelty, and with `times` outcomes can later be sent "
                                     "by unit and time to /v1/feedback")
    times: list[Time] | None = Field(None, description="optional: each window's time (of its last step) on the unit's "
                                     "own clock, a number such as a cycle count or Unix seconds, one per window")

    @model_validator(mode="after")
    def one_unit_and_time_per_window(self) -> "SensorRequest":
        if self.unit is not None:
            if self.units is not None:
                raise ValueError("give `unit` (one for all windows) or `units` (one per window), not both")
            self.units, self.unit = [self.unit] * len(self.windows), None
        for name in ("units", "times"):
            given = getattr(self, name)
            if given is not None and len(given) != len(self.windows):
                raise ValueError(f"`{name}` has {len(given)} entries for {len(self.windows)} windows: give one per window")
        return self


class SensorPrediction(BaseModel):
    prediction_id: str | None = Field(None, description="this answer's id in the prediction log: send outcomes for it "
                                      "to /v1/feedback (absent when SERVING_PREDICTION_LOG=false)")
    failure_probability: float
    alert: bool = Field(description="alert_probability >= its threshold with a novelty score, else "
                        "failure_probability >= the model's calibrated alert threshold")
    uncertainty: float = Field(description="standard deviation of the ensemble members' probabilities")
    novelty_score: float | None = Field(None, description="models with a novelty score: the calibrated probability "
                                        "that the window departs from its unit's normal (its reference, or the "
                                        "training fleet's where `reference` is `fleet`)")
    alert_probability: float | None = Field(None, description="models with a novelty score: failure probability and "
                                            "novelty score combined by the rule chosen on validation, calibrated")
    alert_source: Literal["failure", "novelty", "both", "combined"] | None = Field(
        None, description="with an alert: the part that reached its own threshold (`combined`: neither alone)")
    reference: Literal["unit", "fleet"] | None = Field(
        None, description="models that take unit references (relative channels or a novelty score): whose normal "
                          "the window was seen against, the unit's own (PUT /v1/sensor/units/{unit}/reference) or none "
                          "of its own (`fleet`: no unit, or none kept for it; relative channels masked, novelty "
                          "against the training fleet's normal)")


class SensorResponse(BaseModel):
    model: ModelRef
    predictions: list[SensorPrediction]
