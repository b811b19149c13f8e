"""The service's own bodies (models, readiness, rollout, monitoring) and the types the families' bodies share."""

from __future__ import annotations

import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

# JSON has no NaN: a missing sensor reading is `null`; NaN/Infinity literals and overflowing numbers are refused,
# and so are booleans and strings (strict). Readings beyond float32 are refused by the family that reads them.
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
    target: str = Field(description="what the model predicts")
    interval: Interval | None = Field(None, description="regression models calibrated for an interval")
    metrics: dict[str, float | None] = Field(description="test metrics from the model card (null: undefined)")
    channels: list[str] | None = Field(None, description="sensor: the channel order of a window's steps")
    window: int | None = Field(None, description="sensor: time steps per window")
    threshold: float | None = Field(None, description="sensor: the alert threshold on failure_probability")


class RolloutInfo(BaseModel):
    mode: Literal["off", "shadow", "canary"] = Field(description="SERVING_ROLLOUT")
    canary_share: float | None = Field(None, description="canary: the share of requests the challenger answers")
    shadow_share: float | None = Field(None, description="shadow: the share of requests the challenger runs too")
    challengers: list[ModelInfo] = Field(description="each family's `challenger` being run (none when off)")


class ModelsAnswer(BaseModel):
    models: list[ModelInfo]
    problems: dict[str, str] = Field(description="per family (or `store`, or `<family>.challenger`), why a version "
                                     "is not being served")
    rollout: RolloutInfo


LOG_STATE = ("`ok`, `off` (SERVING_PREDICTION_LOG=false), or why the prediction store cannot be written now "
             "(answers go on; their rows wait in the log's queue while it retries)")


class Readiness(BaseModel):
    ready: bool
    models: dict[str, str] = Field(description="family -> version being served")
    problems: dict[str, str]
    prediction_log: str = Field(description=LOG_STATE)


class ReloadRequest(BaseModel):
    """An empty JSON object: the route takes no options, but only a JSON body (no cross-site form post)."""

    model_config = ConfigDict(extra="forbid")


class ReloadAnswer(ModelsAnswer):
    changes: dict[str, str] = Field(description="per family that changed or failed, what happened")
    workers: int = Field(description="worker processes (of every replica on the same store) that have reloaded")
    lagging: list[str] = Field(description="live workers (host:pid) that had not reloaded when the answer was given")


class ChannelDrift(BaseModel):
    channel: str
    psi: float | None = Field(None, description="population stability index of the recent windows' channel means "
                              "against the training bins (absent: no reading on this channel)")
    ks: float | None = Field(None, description="two-sample Kolmogorov-Smirnov statistic against the training sample "
                             "(absent: no reading on this channel)")
    n: int = Field(description="recent windows with a reading on this channel")
    alarm: bool = Field(description="psi > max_psi, with at least min_items windows")


class SensorDrift(BaseModel):
    """Recent sensor windows (in this worker process) against the served version's training reference."""

    computed_at: datetime.datetime
    windows: int = Field(description="recent windows compared (at most SERVING_MONITOR_DRIFT_WINDOW)")
    max_psi: float = Field(description="the alarm threshold (SERVING_MONITOR_MAX_PSI)")
    channels: list[ChannelDrift]
    alarm: bool


class MoleculeDomain(BaseModel):
    """The applicability domain of the recent molecules (in this worker process) the served version answered."""

    computed_at: datetime.datetime
    molecules: int = Field(description="recent molecules judged (at most SERVING_MONITOR_DRIFT_WINDOW)")
    out_of_domain: float | None = Field(None, description="share with `in_domain` false")
    nearest_similarity_mean: float | None = None
    out_of_range_any: float | None = Field(None, description="share with at least one descriptor outside its "
                                           "training range")
    min_similarity: float = Field(description="SERVING_MONITOR_MIN_SIMILARITY")
    max_out_of_domain: float = Field(description="the alarm threshold (SERVING_MONITOR_MAX_OUT_OF_DOMAIN)")
    alarm: bool


class OutcomeQuality(BaseModel):
    """The served version's last labelled outcomes in the prediction store (sent to /v1/feedback)."""

    computed_at: datetime.datetime
    outcomes: int = Field(description="labelled predictions judged (at most SERVING_MONITOR_OUTCOME_WINDOW)")
    metrics: dict[str, float | None] = Field(description="classifiers: brier, ece, pr_auc (null with one class "
                                             "only); regression: rmse and, for an interval model, coverage")
    calibration_error: float | None = Field(None, description="classifiers: ece; interval models: |coverage - "
                                            "nominal coverage|")
    max_calibration_error: float | None = Field(None, description="the alarm threshold (SERVING_MONITOR_MAX_ECE or "
                                                "SERVING_MONITOR_MAX_COVERAGE_ERROR)")
    alarm: bool


class FamilyMonitoring(BaseModel):
    model: ModelRef | None = Field(None, description="the version being served (absent: none loaded yet)")
    reference: bool = Field(description="the version carries its training reference (needed for input figures)")
    notes: list[str] = Field(description="why a figure is missing or stale")
    input_drift: SensorDrift | None = Field(None, description="sensor")
    domain: MoleculeDomain | None = Field(None, description="molecule")
    outcomes: OutcomeQuality | None = None


class MonitoringAnswer(BaseModel):
    families: dict[str, FamilyMonitoring] = Field(description="per family; empty until the first computation")
    every_s: float = Field(description="how often the figures are recomputed (SERVING_MONITOR_SECONDS)")
    min_items: int = Field(description="fewer recent inputs or outcomes raise no alarm (SERVING_MONITOR_MIN_ITEMS)")
    prediction_log: str = Field(description=LOG_STATE)
