"""The service's own monitoring, off the request path: each family's figures of its recent inputs (sensor: input
drift against the served version's training reference; molecule: the applicability domain), and the quality of the
served version's labelled outcomes in the prediction store (models/quality.py), with the alarms of the
SERVING_MONITOR_* thresholds.

Nothing happens on the request path: a background task recomputes every figure each SERVING_MONITOR_SECONDS in a
thread, from the prediction store (the served version's recent predictions and labelled outcomes, written by every
worker), and GET /v1/monitoring and the Prometheus gauges show the last ones: every worker, and every replica on
the same store, shows the figures of the whole traffic."""

from __future__ import annotations

import asyncio
import logging
import math

import numpy as np
from fastapi import APIRouter
from sqlalchemy.exc import SQLAlchemyError

from contract.prediction_store import labelled_predictions, recent_predictions, utc_now
from models.quality import average_precision, brier_score, expected_calibration_error, interval_coverage, rmse
from serving.errors import error_responses
from serving.family import ServedFamily
from serving.loading import LoadedModel
from serving.metrics import ServiceMetrics
from serving.prediction_log import PredictionLog
from serving.schemas import MonitoringAnswer
from serving.settings import ServingSettings
from serving.served_models import ServedModels

log = logging.getLogger("serving")
FLUSH_S = 2.0  # how long a refresh waits for this worker's queued predictions
ANSWER_FIELDS = ("failure_probability", "probability", "value")  # what a stored output answered


def _number(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def outcome_report(model: LoadedModel, rows: list[dict], settings: ServingSettings) -> dict:
    """OutcomeQuality's fields of labelled predictions (contract's labelled_predictions rows): classifiers Brier,
    ECE and PR-AUC; regression RMSE and, for a model calibrated for an interval, its coverage."""
    rows = [row for row in rows if any(row["output"].get(k) is not None for k in ANSWER_FIELDS)]
    y = np.array([row["observed"] for row in rows], dtype=np.float64)
    report: dict = {"outcomes": len(rows), "metrics": {}, "calibration_error": None, "max_calibration_error": None,
                    "alarm": False}
    if not rows:
        return report
    calibration = model.card.calibration
    if model.card.task == "classification":
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
    """Each family's recent inputs and the last computed figures (`answer`); `run` recomputes them periodically."""

    def __init__(self, store: ServedModels, settings: ServingSettings, metrics: ServiceMetrics,
                 prediction_log: PredictionLog, families: dict[str, ServedFamily]):
        self.store, self.settings, self.metrics, self.prediction_log = store, settings, metrics, prediction_log
        self.families = families
        self._families: dict[str, dict] = {}
        self._outcomes: dict[str, tuple[tuple[str, str], dict]] = {}  # the last good outcome report per family

    def answer(self) -> dict:
        """MonitoringAnswer's fields: the last computed figures."""
        return {"families": self._families, "every_s": self.settings.monitor_seconds,
                "min_items": self.settings.monitor_min_items, "prediction_log": self.prediction_log.state}

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
        families = {name: self._family(name) for name in self.store.names}
        self._families = families
        self.metrics.show_monitoring(families)

    def _family(self, name: str) -> dict:
        model = self.store.get(name)
        if model is None:
            return {"model": None, "reference": False, "notes": ["no model is loaded yet"]}
        report: dict = {"model": {"name": model.name, "version": model.version, "alias": model.alias},
                        "reference": model.reference is not None, "notes": []}
        rows, note = self._recent(name, model)
        if rows is not None:
            key, figures, note = self.families[name].input_report(model, rows)
            if figures is not None:
                report[key] = {"computed_at": utc_now(), **figures}
        outcomes, outcome_note = self._outcome_report(name, model)
        if outcomes is not None:
            report["outcomes"] = outcomes
        report["notes"] += [text for text in (note, outcome_note) if text]
        return report

    def _recent(self, family: str, model: LoadedModel) -> tuple[list[dict] | None, str | None]:
        """The last SERVING_MONITOR_DRIFT_WINDOW predictions of `model` in the store, or why there are none."""
        writer = self.prediction_log.writer
        if writer is None:
            return None, "no input figures: the prediction log is off (SERVING_PREDICTION_LOG=false)"
        try:
            writer.flush(FLUSH_S)  # this worker's latest answers count too
            writer.ensure_tables()
            return recent_predictions(writer.engine, family, model.name, model.version,
                                      self.settings.monitor_drift_window), None
        except (SQLAlchemyError, OSError) as error:
            first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
            return None, f"input figures not refreshed: the prediction store cannot be read ({first})"

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
