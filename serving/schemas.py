"""Request and response bodies (the configurable limits are checked in serving.inputs)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# JSON has no NaN: a missing sensor reading is `null`; NaN/Infinity literals and overflowing numbers are refused,
# and so are booleans and strings (strict). Readings beyond float32 are refused by serving.inputs.
Reading = Annotated[float, Field(strict=True, allow_inf_nan=False)] | None
Step = list[Reading]
Window = list[Step]
Unit = Annotated[str, Field(min_length=1, max_length=256)]
Time = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class ModelRef(BaseModel):
    """The registered model version that answered."""

    name: str
    version: str
    alias: str


class SensorPrediction(BaseModel):
    prediction_id: str | None = Field(None, description="this answer's id in the prediction log: send outcomes for it "
                                      "to /v1/feedback (absent when SERVING_PREDICTION_LOG=false)")
    failure_probability: float
    alert: bool = Field(description="failure_probability >= the model's calibrated alert threshold")
    uncertainty: float = Field(description="standard deviation of the ensemble members' probabilities")


class SensorResponse(BaseModel):
    model: ModelRef
    predictions: list[SensorPrediction]


class MoleculePrediction(BaseModel):
    prediction_id: str | None = Field(None, description="this answer's id in the prediction log: send outcomes for it "
                                      "to /v1/feedback (absent for an `error`, and when SERVING_PREDICTION_LOG=false)")
    smiles: str
    canonical_smiles: str | None = Field(None, description="the standardised canonical SMILES the model saw")
    value: float | None = Field(None, description="regression models: the predicted value")
    probability: float | None = Field(None, description="classification models: the predicted probability")
    uncertainty: float | None = Field(None, description="regression: scaled ensemble std; classification: ensemble std")
    error: str | None = Field(None, description="why this SMILES could not be answered")


class MoleculeResponse(BaseModel):
    model: ModelRef
    predictions: list[MoleculePrediction]


class SensorRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    windows: list[Window] = Field(
        min_length=1,
        description="windows of time steps, each step one value per channel in the model's channel order "
                    "(`null` for a missing reading); exactly the model's `window` steps each, see /v1/models; "
                    "at most SERVING_MAX_ITEMS windows",
    )
    units: list[Unit] | None = Field(None, description="optional: the machine each window comes from, one per window; "
                                     "with `times`, outcomes can later be sent by unit and time to /v1/feedback")
    times: list[Time] | None = Field(None, description="optional: each window's time (of its last step) on the unit's "
                                     "own clock, a number such as a cycle count or Unix seconds, one per window")

    @model_validator(mode="after")
    def one_unit_and_time_per_window(self) -> "SensorRequest":
        for name in ("units", "times"):
            given = getattr(self, name)
            if given is not None and len(given) != len(self.windows):
                raise ValueError(f"`{name}` has {len(given)} entries for {len(self.windows)} windows: give one per window")
        return self


class MoleculeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    smiles: list[str] = Field(min_length=1, description="at most SERVING_MAX_ITEMS, each at most SERVING_MAX_SMILES_LENGTH characters")


class Interval(BaseModel):
    """What `value ± uncertainty` means for a regression model: value ± z * uncertainty covers `coverage`."""

    z: float
    coverage: float = Field(description="nominal share of true values inside value ± z * uncertainty, e.g. 0.95")


class ModelInfo(BaseModel):
    family: str
    name: str
    version: str
    alias: str
    provider: str = Field(description="the ONNX Runtime execution provider answering")
    sha256: str = Field(description="of the served model.onnx, as signed in the version's manifest")
    task: str = Field(description="regression or classification")
    target: str | None = Field(None, description="what the model predicts (absent from older model cards)")
    interval: Interval | None = Field(None, description="regression models calibrated for an interval")
    metrics: dict[str, float | None] = Field(description="test metrics from the model card (null: undefined)")
    channels: list[str] | None = Field(None, description="sensor: the channel order of a window's steps")
    window: int | None = Field(None, description="sensor: time steps per window")
    threshold: float | None = Field(None, description="sensor: the alert threshold on failure_probability")


class RolloutInfo(BaseModel):
    mode: Literal["off", "shadow", "canary"] = Field(description="SERVING_ROLLOUT")
    canary_share: float | None = Field(None, description="canary: the share of requests the challenger answers")
    challengers: list[ModelInfo] = Field(description="each family's `challenger` being run (none when off)")


class ModelsAnswer(BaseModel):
    models: list[ModelInfo]
    problems: dict[str, str] = Field(description="per family (or `store`, or `<family>.challenger`), why a version "
                                     "is not being served")
    rollout: RolloutInfo


class Readiness(BaseModel):
    ready: bool
    models: dict[str, str] = Field(description="family -> version being served")
    problems: dict[str, str]


class ReloadRequest(BaseModel):
    """An empty JSON object: the route takes no options, but only a JSON body (no cross-site form post)."""

    model_config = ConfigDict(extra="forbid")


class ReloadAnswer(ModelsAnswer):
    changes: dict[str, str] = Field(description="per family that changed or failed, what happened")
