"""Stage `sensor_baseline`: baselines on the same windows and splits. HistGradientBoosting on per-window
summary features (`name`/`test` at the top level of baseline.json, what the registry compares against)
and MiniRocket + logistic regression with C chosen by grouped CV over units (under `baselines`)."""

from __future__ import annotations

import mlflow
import numpy as np
from prefect import flow

from flows.json_io import write_json
from flows.params import load_params
from flows.paths import SENSOR
from flows.sensor.prepared import load_windows
from flows.tasks import compute_task, stage_cli
from flows.tracking import stage_run
from models.calibration import choose_threshold
from models.metrics import classification_metrics
from models.sensor.baselines import fit_hist_gradient_boosting, fit_minirocket

NAME = "hist_gradient_boosting"
MINIROCKET = "minirocket"


@compute_task(name="fit-hist-gradient-boosting")
def fit_baseline(X: np.ndarray, y: np.ndarray, seed: int):
    return fit_hist_gradient_boosting(X, y, seed)


@compute_task(name="fit-minirocket")
def fit_rocket(X: np.ndarray, y: np.ndarray, units: np.ndarray, cfg, seed: int):
    return fit_minirocket(X, y, units, n_features=cfg.minirocket_features, c_grid=cfg.c_grid, folds=cfg.cv_folds, seed=seed)


def evaluate(name: str, scorer, val, test, target_precision: float, extra: dict | None = None) -> dict:
    p_val, p_test = scorer(val.X), scorer(test.X)
    threshold = choose_threshold(val.y, p_val, target_precision)
    return {"name": name, "threshold": threshold, "test": classification_metrics(test.y, p_test, threshold),
            "test_probability": np.round(p_test, 6).tolist(), **(extra or {})}


@flow(name="sensor-baseline")
def sensor_baseline(params_file: str = "params.yaml") -> dict:
    """Train the baselines on the training windows; thresholds on validation; metrics on test."""
    params = load_params(params_file)
    seed, target = params.sensor.data.seed, params.sensor.calibrate.target_precision
    prepared = load_windows()
    train, val, test = (prepared.windows[name] for name in ("train", "val", "test"))
    results = [evaluate(NAME, fit_baseline(train.X, train.y, seed), val, test, target)]
    if params.sensor.baseline.minirocket:
        scorer, info = fit_rocket(train.X, train.y, train.unit, params.sensor.baseline, seed)
        results.append(evaluate(MINIROCKET, scorer, val, test, target, {"C": info["C"], "cv_pr_auc": info["cv_pr_auc"]}))
    write_json(SENSOR.baseline, {**results[0], "baselines": results})
    with stage_run(params.tracking, "sensor", "baseline", {"baseline": NAME, **params.sensor.baseline.model_dump()},
                   {"sensor": SENSOR.prepared}):
        for result in results:
            prefix = "test_" if result["name"] == NAME else f"{result['name']}_test_"
            mlflow.log_metrics({f"{prefix}{k}": v for k, v in result["test"].items()})
    for result in results:
        print(f"sensor baseline ({result['name']}) test PR-AUC {result['test']['pr_auc']:.4f}, ECE {result['test']['ece']:.4f}")
    return results[0]["test"]


if __name__ == "__main__":
    stage_cli(sensor_baseline)
