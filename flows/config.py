"""Sections of params.yaml owned by the flows layer: tracking, the promotion gate and orchestration."""

from __future__ import annotations

import math
from typing import Any, Literal

from prefect.client.schemas.schedules import CronSchedule
from pydantic import Field, PrivateAttr, ValidationError, model_validator

from contract.registry import DEFAULT_SIGNING_KEY, DEFAULT_TRACKING_URI
from data.config import StrictModel


class TrackingConfig(StrictModel):
    """Where MLflow keeps runs and artifacts (relative paths are inside the project).

    The environment variable MLFLOW_TRACKING_URI, when set, wins over `uri`.
    """

    uri: str = DEFAULT_TRACKING_URI
    artifact_root: str = "mlflow/artifacts"
    ui_url: str = Field("http://127.0.0.1:5000", description="the MLflow UI, for links in Prefect artifacts")
    signing_key: str = Field(DEFAULT_SIGNING_KEY, description="Ed25519 private key that signs registered versions "
                             "(created on first use; services verify with the public key beside it, `.pub`)")


class ExportConfig(StrictModel):
    """ONNX export."""

    opset: int = Field(18, ge=18)


class SensorExportConfig(ExportConfig):
    """ONNX export of the sensor ensemble, optionally quantised to int8 (models/quantization.py)."""

    quantize: bool = Field(False, description="int8 convolutions (calibrated on validation) and MatMul weights, faster "
                           "on CPU (bench/results/onnx_vs_torch.md); outputs move, so the int8 file is what gets evaluated")
    quantize_max_diff: float = Field(
        0.05, gt=0, le=1, description="refuse the int8 model when a probability or uncertainty on the validation "
        "windows moves more than this from the float model's"
    )


# What a version of each task can be judged by, and which way is better
GATE_METRICS: dict[str, dict[str, Literal["max", "min"]]] = {
    "classification": {"pr_auc": "max", "roc_auc": "max", "recall_at_p90": "max", "f2": "max", "brier": "min",
                       "ece": "min"},
    "regression": {"rmse": "min", "mae": "min", "r2": "max"},
}
TASK_METRIC = {"classification": "pr_auc", "regression": "rmse"}


class ServingBudget(StrictModel):
    """The most a prediction may cost to serve, in milliseconds per item (featurisation and the model call, as the
    registered card's `serving_cost` measured it); null: no bound."""

    batch_1: float | None = Field(None, gt=0, description="one item per call (a single client's latency)")
    batch_64: float | None = Field(None, gt=0, description="per item in calls of 64 (throughput)")

    def exceeded(self, cost: dict | None) -> str | None:
        """Why `cost` (a card's serving_cost; None: not measured) is over this budget, in one line, or None."""
        if cost is None:
            return None
        for key, bound in (("batch_1", self.batch_1), ("batch_64", self.batch_64)):
            spent = cost["total_ms_per_item"].get(key)
            if bound is not None and spent is not None and spent > bound:
                return (f"serving cost {spent:.2f} ms per item at {key.replace('_', ' ')} exceeds "
                        f"registry.serving_budget_ms.{key} = {bound:g} (measured on {cost['machine']})")
        return None


class RegistryConfig(StrictModel):
    """The registered model and the gate a new version passes to become `champion`."""

    model_name: str
    primary_metric: str | None = Field(None, description="the test metric versions are compared by; null: the "
                                       "task's own (classification pr_auc, regression rmse)")
    mode: Literal["max", "min"] | None = Field(None, description="max: a higher primary metric is better; null: the "
                                               "metric's own direction")
    _task: str | None = PrivateAttr(None)  # the model's task, where the family's settings know it
    tolerance: float = Field(0.0, ge=0, description="a challenger may be this much worse and still be promoted")
    max_calibration_error: float = Field(0.1, gt=0, description="ECE (classification) or |coverage - nominal| (regression) bound")
    must_beat_baseline: bool = Field(True, description="the primary metric must be at least as good as the baseline's "
                                     "of the same run (within tolerance)")
    min_positives: int = Field(10, ge=1, description="classification: test positives needed to judge at all (a "
                               "constant predictor at the prior passes an ECE bound on a handful)")
    serving_budget_ms: ServingBudget = Field(default_factory=ServingBudget, description="a version that costs more "
                                             "to serve is not promoted, however well it scores")

    def for_task(self, task: str) -> RegistryConfig:
        """This gate, judging a `task` model (the settings stay as written); ValueError naming the setting when the
        metric is not one such a model reports, or the direction is the metric's wrong way."""
        metrics = GATE_METRICS[task]
        metric = self.primary_metric or TASK_METRIC[task]
        if metric not in metrics:
            raise ValueError(f"registry.primary_metric is {metric!r}, which a {task} model does not report: use one of "
                             f"{', '.join(metrics)}, or null for {TASK_METRIC[task]}")
        if self.mode not in (None, metrics[metric]):
            raise ValueError(f"registry.mode is {self.mode!r}, but a {'higher' if metrics[metric] == 'max' else 'lower'}"
                             f" {metric} is better: set {metrics[metric]!r} or null")
        self._task = task
        return self

    @property
    def metric(self) -> str:
        """The metric versions are compared by: `primary_metric`, else the task's own."""
        if self.primary_metric is None and self._task is None:
            raise ValueError("registry.primary_metric is null and the gate does not know the model's task")
        return self.primary_metric or TASK_METRIC[self._task]

    @property
    def direction(self) -> Literal["max", "min"]:
        """`mode`, else the metric's own direction."""
        return self.mode or next(metrics[self.metric] for metrics in GATE_METRICS.values() if self.metric in metrics)


class SchedulesConfig(StrictModel):
    """Cron schedules of the deployments `make ui` serves (null: no schedule, run from the UI only)."""

    data_refresh: str | None = Field("0 2 * * *", description="re-read the sources, version the prepared data")
    retrain: str | None = Field("0 3 * * 0", description="data refresh, then the full pipeline of both families")
    monitor: str | None = Field("0 * * * *", description="drift and calibration reports; recalibration when needed")
    timezone: str = "UTC"

    @model_validator(mode="after")
    def _valid_with_prefect(self) -> "SchedulesConfig":
        """Checked by Prefect's own CronSchedule (cron fields, IANA timezone), so serving cannot fail later."""
        for name in ("data_refresh", "retrain", "monitor"):
            if getattr(self, name) is not None:
                try:
                    self.schedule(name)
                except ValidationError as error:
                    raise ValueError(f"{name}: {error.errors()[0]['msg'].removeprefix('Value error, ')}") from None
        return self

    def schedule(self, name: str) -> CronSchedule | None:
        """The Prefect schedule of deployment `name` (data_refresh | retrain | monitor), or None."""
        cron = getattr(self, name)
        return None if cron is None else CronSchedule(cron=cron, timezone=self.timezone)


class OrchestrationConfig(StrictModel):
    """Where flows run: schedules for the served deployments and the task runner of parallel tasks
    (ensemble members, tuning trials). No stage's output depends on it, so no DVC stage declares it."""

    schedules: SchedulesConfig = Field(default_factory=SchedulesConfig)
    task_runner: Literal["threads", "dask"] = Field(
        "threads", description="threads: in the flow's process; dask: on a Dask cluster (prefect-dask)")
    max_workers: int = Field(
        1, ge=1, description="threads: tasks at once (>1 is not bit-reproducible: threads share PyTorch's global RNG)")
    dask_address: str | None = Field(None, description="dask: scheduler address (tcp://host:8786); null: a local cluster")
    dask_workers: int = Field(2, ge=1, description="dask without an address: workers of the local cluster")


class RolloutJudgeConfig(StrictModel):
    """The monitor's rollout judge: a `challenger` a service runs in shadow or canary against the champion, on
    live labelled outcomes and the service SLOs; it promotes, rolls back or waits (docs/how-to/monitor.md)."""

    enabled: bool = Field(True, description="judge each family's challenger when it is not the champion's version")
    window: int = Field(5000, ge=10, description="the last N predictions of each side that are judged")
    min_outcomes: int = Field(200, ge=10, description="labelled outcomes each side needs before a verdict on quality")
    min_requests: int = Field(100, ge=1, description="challenger requests needed before its SLOs are judged (and "
                              "before a promotion)")
    tolerance: float = Field(0.0, ge=0, description="the challenger's primary metric (the family's "
                             "registry.primary_metric) and Brier score may be this much worse than the champion's")
    max_calibration_loss: float = Field(0.02, ge=0, description="a calibration error (ECE, or |coverage - nominal|) "
                                        "this much above the champion's is a degradation: rollback")
    max_error_rate: float = Field(0.01, ge=0, le=1, description="SLO: share of the challenger's requests whose model "
                                  "call failed; above it: rollback")
    max_p99_ms: float = Field(1000.0, gt=0, description="SLO: p99 of the challenger's model call latency (ms); above "
                              "it: rollback")


class MonitorConfig(StrictModel):
    """The `monitor` flow: where the prediction store is, what it reads, the thresholds that raise an alarm, and
    the recalibration an alarm triggers (docs/how-to/monitor.md)."""

    store_url: str | None = Field(None, description="SQLAlchemy URL of the prediction store; null: the service's "
                                  "default SQLite file inside the project (contract/prediction_store.DEFAULT_URL)")
    window: int = Field(2000, ge=10, description="the last N labelled outcomes of the champion that are judged")
    min_outcomes: int = Field(200, ge=10, description="fewer labelled outcomes: no calibration verdict, no recalibration")
    drift_window: int = Field(1000, ge=10, description="the last N predictions whose inputs are compared with the reference")
    max_ece: float = Field(0.07, gt=0, le=1, description="sensor (and molecule classification): ECE alarm above this")
    max_coverage_error: float = Field(0.1, gt=0, le=1, description="molecule regression: |interval coverage - nominal| alarm")
    max_psi: float = Field(0.25, gt=0, description="sensor: PSI alarm on any channel's window means above this")
    min_similarity: float = Field(0.3, ge=0, le=1, description="molecule: nearest-neighbour Tanimoto similarity to the "
                                  "training set below this is outside the applicability domain")
    max_out_of_domain: float = Field(0.3, ge=0, le=1, description="molecule: alarm when a larger share of recent "
                                     "molecules is outside the applicability domain")
    recalibrate: bool = Field(True, description="on an alarm with at least min_outcomes outcomes, fit and gate a recalibration")
    holdout_fraction: float = Field(0.3, gt=0, lt=1, description="the newest share of the outcomes judges the "
                                    "recalibration (the gate); the rest fits it")
    judge: RolloutJudgeConfig = Field(default_factory=RolloutJudgeConfig)


class SearchDimension(StrictModel):
    """One setting to tune: `choices` (any YAML values, mappings too), or a range `low`..`high` (`integer`: whole
    numbers; `log`: sampled on a log scale)."""

    choices: list[Any] | None = Field(None, min_length=1)
    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False

    @model_validator(mode="after")
    def _one_kind(self) -> "SearchDimension":
        if (self.choices is None) == (self.low is None or self.high is None):
            raise ValueError("give either `choices` or both `low` and `high`")
        if self.choices is None and not self.low < self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        if self.log and self.choices is None and self.low <= 0:
            raise ValueError("a log-scale range needs low > 0")
        return self


class TuneConfig(StrictModel):
    """The opt-in `<family>_tune` stage (flows/tuning.py): Optuna over fine-tuning settings, scored on validation."""

    trials: int = Field(0, ge=0, description="trials at most (0: off; the stage writes an empty tuned file)")
    budget_minutes: float = Field(30.0, gt=0, description="no new trial starts after this wall-clock time")
    sampler: Literal["tpe", "grid"] = Field(
        "tpe", description="tpe: Optuna's TPE; grid: every combination of the space's `choices` (at most `trials`)")
    pruner: Literal["median", "none"] = Field(
        "median", description="median: stop a trial whose validation score at an epoch is below the median of "
                              "earlier trials at that epoch")
    parallel: int = Field(1, ge=1, description="trials at once, as tasks on the orchestration task runner")
    seed: int = 0
    space: dict[str, SearchDimension] = Field(
        default_factory=dict,
        description="keys under the family's section (finetune.lr, model.dropout, ...) -> a SearchDimension")

    @model_validator(mode="after")
    def _searchable(self) -> "TuneConfig":
        outside = [key for key in self.space if not key.startswith(("finetune.", "model."))]
        if outside:
            raise ValueError(f"the space tunes `finetune.*` and `model.*` keys only, not {outside}")
        if self.trials and not self.space:
            raise ValueError("trials > 0 needs a non-empty `space`")
        ranges = [key for key, dimension in self.space.items() if dimension.choices is None]
        if self.sampler == "grid" and ranges:
            raise ValueError(f"the grid sampler needs `choices` for every key; ranges: {ranges}")
        return self

    def grid_size(self) -> int:
        """Combinations of the space's choices (the grid sampler's trials)."""
        return math.prod(len(dimension.choices or []) for dimension in self.space.values())
