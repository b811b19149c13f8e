"""Request and response bodies (the configurable limits are checked in serving.inputs)."""

from __future__ import annotations

import datetime
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


class MoleculePrediction(BaseModel):
    prediction_id: str | None = Field(None, description="this answer's id in the prediction log: send outcomes for it "
                                      "to /v1/feedback (absent for an `error`, and when SERVING_PREDICTION_LOG=false)")
    smiles: str
    canonical_smiles: str | None = Field(None, description="the standardised canonical SMILES the model saw")
    value: float | None = Field(None, description="regression models: the predicted value")
    probability: float | None = Field(None, description="classification models: the predicted probability")
    uncertainty: float | None = Field(None, description="regression: scaled ensemble std; classification: ensemble std")
    modality: Literal["fused", "graph_only", "smiles_only"] | None = Field(
        None, description="the views the model answered from: `fused` (the graph and the SMILES tokens), "
                          "`graph_only` (the canonical SMILES is longer than the model's tokenizer takes) or "
                          "`smiles_only` (the graph cannot be built: more heavy atoms than SERVING_MAX_HEAVY_ATOMS, or "
                          "RDKit cannot sanitise or standardise the molecule; no applicability domain then)")
    nearest_similarity: float | None = Field(None, description="applicability domain: Tanimoto similarity (Morgan "
                                             "radius 2, 2048 bits) to the nearest training molecule (absent when the "
                                             "version has no training reference: see /v1/monitoring)")
    in_domain: bool | None = Field(None, description="nearest_similarity >= SERVING_MONITOR_MIN_SIMILARITY: the "
                                   "training set holds a similar molecule")
    descriptors_out_of_range: float | None = Field(None, description="share of the model's RDKit descriptors "
                                                   "outside their training range")
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
