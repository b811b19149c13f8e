"""The service's own monitoring, off the request path: input drift of recent sensor windows against the served
version's training reference (PSI and KS per channel, models/drift.py), the applicability domain of recent
molecules (serving/domain.py), and the quality of the served version's labelled outcomes in the prediction store
(models/quality.py), with the alarms of the SERVING_MONITOR_* thresholds.

Requests only hand their inputs over (an append under a lock); a background task recomputes every figure each
SERVING_MONITOR_SECONDS in a thread, and GET /v1/monitoring and the Prometheus gauges show the last ones. The recent
inputs live in each worker process's memory: with several workers, each judges its share of the traffic; the
outcomes come from the shared store."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections import deque
from collections.abc import Sequence

import numpy as np
from fastapi import APIRouter
from sqlalchemy.exc import SQLAlchemyError

from contract.prediction_store import labelled_predictions, utc_now
from models.drift import channel_drift, window_means
from models.quality import average_precision, brier_score, expected_calibration_error, interval_coverage, rmse
from serving.domain import unusable
from serving.errors import error_responses
from serving.loading import LoadedModel
from serving.metrics import ServiceMetrics
from serving.prediction_log import PredictionLog
from serving.schemas import MonitoringAnswer
from serving.settings import ServingSettings
from serving.store import ModelStore

log = logging.getLogger("serving")
ANSWER_FIELDS = ("failure_probability", "probability", "value")  # what a stored output answered


def _number(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


class SensorInputs:
    """The channel means (C,) of the last `size` sensor windows of one channel layout (a new layout starts over).
    `add` keeps the windows (n, T, C) as sent; `means` summarises what came since its last call."""

    def __init__(self, size: int):
        self.size = size
        self._lock = threading.Lock()
        self._pending: deque[tuple[tuple[str, ...], np.ndarray]] = deque()
        self._pending_rows = 0
        self._channels: tuple[str, ...] = ()
        self._means: deque[np.ndarray] = deque(maxlen=size)

    def add(self, windows: np.ndarray, channels: Sequence[str]) -> None:
        """Keep windows (n, T, C) whose channels are `channels` (on the request path: no computation)."""
        with self._lock:
            self._pending.append((tuple(channels), windows))
            self._pending_rows += len(windows)
            while self._pending_rows - len(self._pending[0][1]) >= self.size:  # pushed out before ever counted
                self._pending_rows -= len(self._pending.popleft()[1])

    def means(self) -> tuple[tuple[str, ...], np.ndarray]:
        """The channels and the recent windows' channel means (m, C), NaN for a channel without readings.
        One caller at a time (the refresh thread)."""
        with self._lock:
            pending, self._pending, self._pending_rows = self._pending, deque(), 0
        for channels, windows in pending:
            if channels != self._channels:
                self._channels = channels
                self._means.clear()
            self._means.extend(window_means(windows.transpose(0, 2, 1)))
        if not self._means:
            return self._channels, np.zeros((0, len(self._channels)))
        return self._channels, np.stack(self._means)


class MoleculeInputs:
    """The applicability domain (serving.domain) of the last `size` molecules answered, with the version that
    answered each."""

    def __init__(self, size: int):
        self._lock = threading.Lock()
        self._items: deque[tuple[tuple[str, str], float, bool, float]] = deque(maxlen=size)

    def add(self, answers: Sequence[dict], model: LoadedModel) -> None:
        """Keep the domain of each answer that has one (on the request path: appends only)."""
        key = (model.name, model.version)
        with self._lock:
            self._items.extend((key, a["nearest_similarity"], a["in_domain"], a["descriptors_out_of_range"])
                               for a in answers if "nearest_similarity" in a)

    def of(self, model: LoadedModel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Similarity, in-domain flag and descriptor share outside the range (m,) of the recent molecules `model`
        answered."""
        key = (model.name, model.version)
        with self._lock:
            items = np.array([item[1:] for item in self._items if item[0] == key], dtype=np.float64).reshape(-1, 3)
        return items[:, 0], items[:, 1].astype(bool), items[:, 2]


def sensor_drift_report(model: LoadedModel, channels: Sequence[str], means: np.ndarray,
                        settings: ServingSettings) -> dict:
    """SensorDrift's fields: PSI and KS per reference channel of recent channel means (m, C) in `channels`' order."""
    names = model.reference["channels"].tolist()
    position = {name: j for j, name in enumerate(channels)}
    columns = np.stack([means[:, position[name]] if name in position else np.full(len(means), np.nan)
                        for name in names], axis=1) if names else means[:, :0]
    drift = channel_drift(model.reference, columns)
    counted = len(means) >= settings.monitor_min_items
    rows = [{"channel": name, "psi": _number(d["psi"]), "ks": _number(d["ks"]), "n": d["n"],
             "alarm": counted and d["psi"] > settings.monitor_max_psi} for name, d in drift.items()]
    return {"windows": len(means), "max_psi": settings.monitor_max_psi, "channels": rows,
            "alarm": any(row["alarm"] for row in rows)}


def domain_report(inputs: MoleculeInputs, model: LoadedModel, settings: ServingSettings) -> dict:
    """MoleculeDomain's fields over the recent molecules `model` answered."""
    similarity, inside, outside = inputs.of(model)
    n = len(similarity)
    out_of_domain = float(1 - inside.mean()) if n else None
    return {"molecules": n, "out_of_domain": out_of_domain,
            "nearest_similarity_mean": float(similarity.mean()) if n else None,
            "out_of_range_any": float((outside > 0).mean()) if n else None,
            "min_similarity": settings.monitor_min_similarity, "max_out_of_domain": settings.monitor_max_out_of_domain,
            "alarm": n >= settings.monitor_min_items and out_of_domain > settings.monitor_max_out_of_domain}


def outcome_report(model: LoadedModel, rows: list[dict], settings: ServingSettings) -> dict:
    """OutcomeQuality's fields of labelled predictions (contract's labelled_predictions rows): classifiers Brier,
    ECE and PR-AUC; regression RMSE and, for a model calibrated for an interval, its coverage."""
    rows = [row for row in rows if any(row["output"].get(k) is not None for k in ANSWER_FIELDS)]
    y = np.array([row["observed"] for row in rows], dtype=np.float64)
    report: dict = {"outcomes": len(rows), "metrics": {}, "calibration_error": None, "max_calibration_error": None,
                    "alarm": False}
    if not rows:
        return report
    calibration = model.card.get("calibration", {})
    if model.card["task"] == "classification":
        p = np.array([row["output"].get("failure_probability", row["output"].get("probability")) for row in rows],
                     dtype=np.float64)
        metrics = {"brier": brier_score(y, p), "ece": expected_calibration_error(y, p),
                   "pr_auc": average_precision(y, p)}
        error, bound = metrics["ece"], settings.monitor_max_ece
    else:
        value = np.array([row["output"]["value"] for row in rows], dtype=np.float64)
        metrics, error, bound = {"rmse": rmse(y, value)}, None, None
        if "interval_z" in calibration and "nominal_coverage" in calibration:
            half = calibration["interval_z"] * np.array([row["output"].get("uncertainty", math.nan) for row in rows],
                                                        dtype=np.float64)
            metrics["coverage"] = interval_coverage(y, value - half, value + half)
            error = abs(metrics["coverage"] - calibration["nominal_coverage"])
            bound = settings.monitor_max_coverage_error
    report.update(metrics={k: _number(v) for k, v in metrics.items()}, calibration_error=error,
                  max_calibration_error=bound,
                  alarm=error is not None and len(rows) >= settings.monitor_min_items and error > bound)
    return report


class Monitor:
    """Recent inputs per family and the last computed figures (`answer`); `run` recomputes them periodically."""

    def __init__(self, store: ModelStore, settings: ServingSettings, metrics: ServiceMetrics,
                 prediction_log: PredictionLog):
        self.store, self.settings, self.metrics, self.prediction_log = store, settings, metrics, prediction_log
        self.sensor = SensorInputs(settings.monitor_drift_window)
        self.molecule = MoleculeInputs(settings.monitor_drift_window)
        self._families: dict[str, dict] = {}
        self._outcomes: dict[str, tuple[tuple[str, str], dict]] = {}  # the last good outcome report per family

    def record_windows(self, windows: np.ndarray, model: LoadedModel) -> None:
        self.sensor.add(windows, model.card["channels"])

    def record_smiles(self, answers: Sequence[dict], model: LoadedModel) -> None:
        self.molecule.add(answers, model)

    def answer(self) -> dict:
        """MonitoringAnswer's fields: the last computed figures."""
        return {"families": self._families, "every_s": self.settings.monitor_seconds,
                "min_items": self.settings.monitor_min_items}

    async def run(self) -> None:
        """Recompute the figures now and every SERVING_MONITOR_SECONDS (a failure is logged; the next round tries
        again)."""
        while True:
            try:
                await asyncio.to_thread(self.refresh)
            except Exception:
                log.exception("monitoring: the figures could not be computed")
            await asyncio.sleep(self.settings.monitor_seconds)

    def refresh(self) -> None:
        """Compute every family's figures (blocking: runs in a thread) and publish them."""
        channels, means = self.sensor.means()
        families = {family: self._family(family, channels, means) for family in self.store.names}
        self._families = families
        self.metrics.show_monitoring(families)

    def _family(self, family: str, channels: tuple[str, ...], means: np.ndarray) -> dict:
        model = self.store.get(family)
        if model is None:
            return {"model": None, "reference": False, "notes": ["no model is loaded yet"]}
        now = utc_now()
        report: dict = {"model": {"name": model.name, "version": model.version, "alias": model.alias},
                        "reference": model.reference is not None, "notes": []}
        if family == "sensor":
            if model.reference is None:
                report["notes"].append("no input drift: this version has no training reference (registered before "
                                       "references)")
            else:
                report["input_drift"] = {"computed_at": now, **sensor_drift_report(model, channels, means,
                                                                                   self.settings)}
        else:
            why = unusable(model.reference)
            if why is not None:
                report["notes"].append(f"no applicability domain: {why}")
            else:
                report["domain"] = {"computed_at": now, **domain_report(self.molecule, model, self.settings)}
        outcomes, note = self._outcome_report(family, model)
        if outcomes is not None:
            report["outcomes"] = outcomes
        if note:
            report["notes"].append(note)
        return report

    def _outcome_report(self, family: str, model: LoadedModel) -> tuple[dict | None, str | None]:
        """The outcome report of `model`, or the last good one with a note when the store cannot be read."""
        writer = self.prediction_log.writer
        if writer is None:
            return None, "no outcome metrics: the prediction log is off (SERVING_PREDICTION_LOG=false)"
        key = (model.name, model.version)
        try:
            writer.ensure_tables()
            rows = labelled_predictions(writer.engine, family, model.name, model.version,
                                        self.settings.monitor_outcome_window)
        except (SQLAlchemyError, OSError) as error:
            first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
            last_key, last = self._outcomes.get(family, (None, None))
            note = f"outcome figures not refreshed: the prediction store cannot be read ({first})"
            return (last if last_key == key else None), note
        report = {"computed_at": utc_now(), **outcome_report(model, rows, self.settings)}
        self._outcomes[family] = (key, report)
        return report, None


def monitoring_router(monitor: Monitor) -> APIRouter:
    """The /monitoring route (mounted under /v1, behind its API key)."""
    router = APIRouter()

    @router.get("/monitoring", tags=["monitoring"], response_model=MonitoringAnswer, response_model_exclude_none=True,
                responses=error_responses(401))
    async def monitoring() -> dict:
        """Per family: the served version, whether it has a training reference, input drift (sensor: PSI and KS
        per channel) or the applicability domain of recent molecules, the quality of its labelled outcomes, the
        alarms of the SERVING_MONITOR_* thresholds, and when each figure was computed (every
        SERVING_MONITOR_SECONDS, never on request)."""
        return monitor.answer()

    return router
