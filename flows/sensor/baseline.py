"""Stage `sensor_baseline`: HistGradientBoosting on per-window summary features, same windows and splits."""

from __future__ import annotations

import mlflow
import numpy as np
from prefect import flow
from sklearn.ensemble import HistGradientBoostingClassifier

from data.sensors.summary_features import summary_features
from flows.json_io import write_json
from flows.params import load_params
from flows.paths import SENSOR
from flows.sensor.artifacts import load_windows
from flows.tasks import compute_task, stage_cli
from flows.tracking import stage_run
from models.calibration import choose_threshold
from models.metrics import classification_metrics

NAME = "hist_gradient_boosting"


@compute_task(name="fit-hist-gradient-boosting")
def fit_baseline(X: np.ndarray, y: np.ndarray, seed: int) -> HistGradientBoostingClassifier:
    return HistGradientBoostingClassifier(random_state=seed).fit(summary_features(X), y)


@flow(name="sensor-baseline")
def sensor_baseline(params_file: str = "params.yaml") -> dict:
    """Train the tabular baseline on the training windows; threshold on validation; metrics on test."""
    params = load_params(params_file)
    prepared = load_windows()
    train, val, test = (prepared.windows[name] for name in ("train", "val", "test"))
    model = fit_baseline(train.X, train.y, params.sensor.data.seed)
    p_val = model.predict_proba(summary_features(val.X))[:, 1]
    p_test = model.predict_proba(summary_features(test.X))[:, 1]
    threshold = choose_threshold(val.y, p_val, params.sensor.calibrate.target_precision)
    metrics = classification_metrics(test.y, p_test, threshold)
    write_json(SENSOR.baseline, {"name": NAME, "threshold": threshold, "test": metrics,
                                 "test_probability": np.round(p_test, 6).tolist()})
    with stage_run(params.tracking, "sensor", "baseline", {"baseline": NAME}, {"sensor": SENSOR.prepared}):
        mlflow.log_metrics({f"test_{k}": v for k, v in metrics.items()})
    print(f"sensor baseline ({NAME}) test PR-AUC {metrics['pr_auc']:.4f}, ECE {metrics['ece']:.4f}")
    return metrics


if __name__ == "__main__":
    stage_cli(sensor_baseline)
