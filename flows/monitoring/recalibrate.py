"""Recalibrate a champion on its labelled outcomes and register the result through the gate.

The outcomes (oldest first) are split in time: the older share fits the new calibration, the newest
`monitor.holdout_fraction` judges it. The gate (flows/registry.decide with compare_calibration) compares the
recalibrated version with the champion on those held-out outcomes: its calibration error (ECE, or |coverage -
nominal| for a molecule regressor) must be within the family's `registry.max_calibration_error` and lower than the
champion's, and its primary metric at least as good (a strictly increasing map keeps the ranking; an interval scale
keeps the values). The new version carries the champion's training reference and lineage tags naming the outcomes.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
from mlflow.models import Model

from contract.manifest import sha256_file
from contract.reference import REFERENCE
from contract.registry import VerifiedVersion
from flows.family import pipeline_family
from flows.monitoring.reports import served_probability
from flows.params import Params
from flows.registry import register_and_gate
from flows.tracking import signing_key, stage_run
from models.metrics import classification_metrics, regression_metrics
from models.calibration import CALIBRATORS, ProbabilityCalibrator
from models.recalibration import apply_probability_map, compose_recalibration, fit_probability_map, fit_uncertainty_map

PROBABILITY_METHODS = [method for method, kind in CALIBRATORS.items() if issubclass(kind, ProbabilityCalibrator)]


def split_in_time(labelled: pd.DataFrame, holdout_fraction: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(older share that fits, newest `holdout_fraction` that judges) of outcomes sorted oldest first."""
    cut = len(labelled) - max(1, round(holdout_fraction * len(labelled)))
    return labelled.iloc[:cut], labelled.iloc[cut:]


def _probability_fit(card: dict, fit: pd.DataFrame, held: pd.DataFrame, methods: list[str]) -> dict:
    p_fit = np.array([served_probability(o) for o in fit["output"]])
    p_held = np.array([served_probability(o) for o in held["output"]])
    y_fit, y_held = fit["observed"].to_numpy(int), held["observed"].to_numpy(int)
    if len(np.unique(y_fit)) < 2 or len(np.unique(y_held)) < 2:
        return {"skipped": "the fitting or the held-out outcomes hold only one class"}
    groups = fit["unit"].to_numpy(str) if fit["unit"].notna().all() else None  # units (sensors) as CV groups
    recalibration = fit_probability_map(p_fit, y_fit, groups, methods)
    threshold = float(card.get("threshold", 0.5))
    new_threshold = float(apply_probability_map(np.array([threshold]), recalibration)[0])
    before = classification_metrics(y_held, p_held, threshold)
    after = classification_metrics(y_held, apply_probability_map(p_held, recalibration), new_threshold)
    updates = {"threshold": new_threshold} if "threshold" in card else {}
    return {"recalibration": recalibration, "before": before, "after": after, "error_before": before["ece"],
            "error_after": after["ece"], "card_updates": updates}


def _interval_fit(card: dict, fit: pd.DataFrame, held: pd.DataFrame) -> dict:
    calibration = card["calibration"]
    z, nominal = calibration["interval_z"], calibration["nominal_coverage"]

    def arrays(frame: pd.DataFrame):
        return (frame["observed"].to_numpy(float), np.array([float(o["value"]) for o in frame["output"]]),
                np.array([float(o["uncertainty"]) for o in frame["output"]]))

    (y_fit, v_fit, u_fit), (y_held, v_held, u_held) = arrays(fit), arrays(held)
    recalibration = fit_uncertainty_map(y_fit, v_fit, u_fit, calibration["method"], z)
    factor = recalibration.factor
    before = regression_metrics(y_held, v_held, v_held - z * u_held, v_held + z * u_held)
    after = regression_metrics(y_held, v_held, v_held - z * factor * u_held, v_held + z * factor * u_held)
    return {"recalibration": recalibration, "before": before, "after": after,
            "error_before": abs(before["coverage"] - nominal), "error_after": abs(after["coverage"] - nominal),
            "card_updates": {}}


def recalibrate(params: Params, champion: VerifiedVersion, labelled: pd.DataFrame, store: str) -> dict:
    """Fit, compose onto the champion's ONNX graph, register and gate. Returns what happened (JSON-ready)."""
    family, card = champion.card["family"], champion.card
    fit, held = split_in_time(labelled, params.monitor.holdout_fraction)
    if card["task"] == "classification":
        # the family's calibration candidates where it chooses among several, else every probability calibrator
        methods = getattr(pipeline_family(family).settings(params).calibrate, "methods", PROBABILITY_METHODS)
        result = _probability_fit(card, fit, held, methods)
    else:
        result = _interval_fit(card, fit, held)
    if "skipped" in result:
        return result
    lineage = {"base_version": champion.version, "store": store, "outcomes": len(labelled), "fitted_on": len(fit),
               "held_out": len(held), "first": str(labelled["received_at"].iloc[0]),
               "last": str(labelled["received_at"].iloc[-1])}
    registry = pipeline_family(family).settings(params).registry
    with tempfile.TemporaryDirectory(prefix="recalibrate-") as scratch:
        onnx_path = compose_recalibration(champion.onnx, Path(scratch) / "model.onnx", result["recalibration"])
        new_card = {**card, **result["card_updates"], "test_metrics": result["after"],
                    "calibration_error": result["error_after"], "onnx_sha256": sha256_file(onnx_path),
                    "metrics_on": f"the newest {len(held)} labelled outcomes, held out of the recalibration",
                    "recalibrations": [*card.get("recalibrations", []),
                                       {**lineage, "calibration": result["recalibration"].to_dict()}]}
        reference = champion.directory / REFERENCE
        signature = Model.load(str(champion.directory / "MLmodel")).signature
        champion_metrics = {**result["before"], "calibration_error": result["error_before"]}
        with stage_run(params.tracking, family, "recalibrate", {"monitor": params.monitor.model_dump()}):
            mlflow.set_tags({f"data.outcomes.{k}": str(v) for k, v in lineage.items()})
            mlflow.set_tag("recalibration_method", result["recalibration"].method)
            mlflow.log_metrics({**{f"heldout_before_{k}": v for k, v in result["before"].items() if np.isfinite(v)},
                                **{f"heldout_after_{k}": v for k, v in result["after"].items() if np.isfinite(v)}})
            outcome = register_and_gate(registry, new_card, onnx_path, signature, lambda *_: champion_metrics,
                                        signing_key(params.tracking),
                                        extra_files={REFERENCE: reference} if reference.is_file() else None,
                                        compare_calibration=True)
    return {"method": result["recalibration"].method, "lineage": lineage,
            "calibration_error_before": result["error_before"], "calibration_error_after": result["error_after"],
            "heldout_before": result["before"], "heldout_after": result["after"], **outcome}
