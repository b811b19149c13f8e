"""The monitor's report of one champion: input drift against the training reference and output quality on
labelled outcomes, with the alarms its thresholds raise (params.yaml `monitor`, docs/monitoring.md).

A report is a JSON-ready dict: {"inputs": ..., "outcomes": ..., "alarms": [one line each], "metrics": {flat
name: value, what MLflow logs}}."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from contract.prediction_store import summary_means
from data.errors import DataValidationError
from flows.config import MonitorConfig
from models.metrics import classification_metrics, regression_metrics
from models.drift import nearest_similarity, out_of_range
from models.monitoring import descriptor_matrix, morgan_bits, sensor_drift


ANSWER_FIELDS = ("failure_probability", "probability", "value")  # what a stored output answered, per family and task


def served_probability(output: dict) -> float:
    """The probability a stored output answered (`failure_probability` for sensors, `probability` for molecules)."""
    return float(output.get("failure_probability", output.get("probability")))


def stored_smiles(row: pd.Series) -> str | None:
    summary, output = row["input_summary"] or {}, row["output"] or {}
    return summary.get("canonical_smiles") or summary.get("smiles") or output.get("smiles")


def _finite(metrics: dict) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}


def sensor_inputs(reference: dict | None, recent: pd.DataFrame, cfg: MonitorConfig) -> tuple[dict, list[str]]:
    if reference is None:
        return {"note": "this version has no training reference (registered before references)"}, []
    channels = reference["channels"].tolist()
    drift = sensor_drift(reference, summary_means(recent["input_summary"], channels))
    psi = {c: d["psi"] for c, d in drift.items() if math.isfinite(d["psi"])}
    report = {"n": len(recent), "channels": drift, "max_psi": max(psi.values(), default=float("nan")),
              "max_ks": max((d["ks"] for d in drift.values() if math.isfinite(d["ks"])), default=float("nan"))}
    alarms = []
    if len(recent) >= cfg.min_outcomes and psi and report["max_psi"] > cfg.max_psi:
        worst = max(psi, key=psi.get)
        alarms.append(f"input drift: PSI {psi[worst]:.3f} on channel {worst} exceeds {cfg.max_psi} "
                      f"(last {len(recent)} windows)")
    return report, alarms


def molecule_inputs(reference: dict | None, recent: pd.DataFrame, cfg: MonitorConfig) -> tuple[dict, list[str]]:
    if reference is None:
        return {"note": "this version has no training reference (registered before references)"}, []
    smiles, unreadable = [], 0
    for _, row in recent.iterrows():
        item = stored_smiles(row)
        try:
            if item is not None:
                morgan_bits([item])  # parses and standardises
                smiles.append(item)
                continue
        except DataValidationError:
            pass
        unreadable += 1
    report: dict = {"n": len(smiles), "unreadable": unreadable}
    if not smiles:
        return report, []
    similarity = nearest_similarity(reference["fingerprints"], morgan_bits(smiles))
    outside = float(np.mean(similarity < cfg.min_similarity))
    report.update({"out_of_range": out_of_range(reference, descriptor_matrix(smiles)),
                   "nn_similarity_mean": float(similarity.mean()), "nn_similarity_p10": float(np.quantile(similarity, 0.1)),
                   "out_of_domain": outside})
    alarms = []
    if len(smiles) >= cfg.min_outcomes and outside > cfg.max_out_of_domain:
        alarms.append(f"applicability domain: {outside:.1%} of the last {len(smiles)} molecules have no training "
                      f"neighbour with Tanimoto >= {cfg.min_similarity} (bound {cfg.max_out_of_domain:.0%})")
    return report, alarms


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
    """The report of one champion (see the module docstring)."""
    inputs_of = sensor_inputs if card["family"] == "sensor" else molecule_inputs
    inputs, input_alarms = inputs_of(reference, recent, cfg)
    quality, quality_alarms = outcome_quality(card, labelled, cfg)
    metrics = {"outcomes_n": float(quality["n"]), **{f"outcome_{k}": v for k, v in _finite(quality.get("metrics", {})).items()}}
    if card["family"] == "sensor":
        metrics.update({f"input_{k}": inputs[k] for k in ("max_psi", "max_ks") if k in inputs and math.isfinite(inputs[k])})
        metrics.update({f"input_psi_{c}": d["psi"] for c, d in inputs.get("channels", {}).items() if math.isfinite(d["psi"])})
    else:
        metrics.update({f"input_{k}": inputs[k] for k in ("nn_similarity_mean", "out_of_domain") if k in inputs})
        if "out_of_range" in inputs:
            metrics["input_out_of_range_any"] = inputs["out_of_range"]["any"]
    return {"inputs": inputs, "outcomes": quality, "alarms": input_alarms + quality_alarms,
            "metrics": metrics}
