"""The monitor's report of one champion: input drift against the training reference and output quality on
labelled outcomes, with the alarms its thresholds raise (params.yaml `monitor`, docs/how-to/monitor.md).

A report is a JSON-ready dict: {"inputs": ..., "outcomes": ..., "alarms": [one line each], "metrics": {flat
name: value, what MLflow logs}}."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from flows.config import MonitorConfig
from flows.family import pipeline_family
from models.metrics import classification_metrics, regression_metrics

NO_REFERENCE = "this version has no training reference (registered before references)"
ANSWER_FIELDS = ("failure_probability", "probability", "value")  # what a stored output answered, per family and task


def served_probability(output: dict) -> float:
    """The probability a stored output answered (`failure_probability` for sensors, `probability` for molecules)."""
    return float(output.get("failure_probability", output.get("probability")))


def _finite(metrics: dict) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}


def outcome_quality(card: dict, labelled: pd.DataFrame, cfg: MonitorConfig) -> tuple[dict, list[str]]:
    """Output quality on labelled outcomes: classification (Brier, ECE, PR-AUC, ...) or regression (RMSE,
    interval coverage); the calibration alarm when there are at least `min_outcomes`."""
    answered = [any(o.get(k) is not None for k in ANSWER_FIELDS) for o in labelled["output"]]
    labelled = labelled[answered]  # an item the model could not answer (e.g. an unreadable SMILES) has no output to judge
    n = len(labelled)
    report: dict = {"n": n}
    if n == 0:
        return report, []
    report["first"], report["last"] = str(labelled["received_at"].iloc[0]), str(labelled["received_at"].iloc[-1])
    y = labelled["observed"].to_numpy(dtype=float)
    if card["task"] == "classification":
        p = np.array([served_probability(o) for o in labelled["output"]])
        metrics = classification_metrics(y, p, float(card.get("threshold", 0.5)))
        metrics.update(positive_rate=float(y.mean()), mean_probability=float(p.mean()))
        error, bound, name = metrics["ece"], cfg.max_ece, "ECE"
    else:
        value = np.array([float(o["value"]) for o in labelled["output"]])
        half = card["calibration"]["interval_z"] * np.array([float(o["uncertainty"]) for o in labelled["output"]])
        metrics = regression_metrics(y, value, value - half, value + half)
        metrics["coverage_error"] = abs(metrics["coverage"] - card["calibration"]["nominal_coverage"])
        error, bound, name = metrics["coverage_error"], cfg.max_coverage_error, "|coverage - nominal|"
    report["metrics"] = metrics
    alarms = []
    if n >= cfg.min_outcomes and error > bound:
        alarms.append(f"calibration: {name} {error:.4f} on the last {n} labelled outcomes exceeds {bound}")
    return report, alarms


def family_report(card: dict, reference: dict | None, recent: pd.DataFrame, labelled: pd.DataFrame,
                  cfg: MonitorConfig) -> dict:
    """The report of one champion (see the module docstring); the input drift is the family's (flows/family.py)."""
    if reference is None:
        inputs, input_alarms, input_metrics = {"note": NO_REFERENCE}, [], {}
    else:
        inputs, input_alarms, input_metrics = pipeline_family(card["family"]).input_drift(reference, recent, cfg)
    quality, quality_alarms = outcome_quality(card, labelled, cfg)
    metrics = {"outcomes_n": float(quality["n"]), **input_metrics,
               **{f"outcome_{k}": v for k, v in _finite(quality.get("metrics", {})).items()}}
    return {"inputs": inputs, "outcomes": quality, "alarms": input_alarms + quality_alarms, "metrics": metrics}
