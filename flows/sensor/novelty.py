"""Stage `sensor_novelty`: the departure-from-normal score of the pretrained encoder and decoder, fitted on validation.

The fleet's normal is the training windows labelled healthy (and how much its units vary within their first
`sensor.data.reference_steps` rows); each validation unit is scored against its own first rows (their spread shrunk
to the fleet's, models/sensor/departure.py). The three departure numbers are
calibrated into a probability of "abnormal" (a monotone logistic regression), and a combination rule with the
calibrated failure probability is chosen by cross-fitted validation NLL (models/sensor/combination.py). The export
stage puts all of it in the ONNX graph (models/sensor/alert.py)."""

from __future__ import annotations

import mlflow
import numpy as np
from prefect import flow

from data.sensors.featurize import first_windows
from flows.json_io import read_json, write_json
from flows.params import load_params
from flows.paths import SENSOR
from flows.sensor.artifacts import load_ensemble, load_scorer
from flows.sensor.calibrate import member_logits
from flows.sensor.windows import load_windows
from flows.tasks import compute_task, stage_cli
from flows.tracking import stage_run
from models.calibration import calibrated_probability, choose_threshold
from models.metrics import classification_metrics
from models.sensor.combination import choose_rule, combined_probability
from models.sensor.departure import against_own_references, fit_fleet_reference, reference_to_dict
from models.sensor.novelty import NoveltyCalibrator, NoveltyScorer, score_windows


@compute_task(name="score-departures")
def score(scorer: NoveltyScorer, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return score_windows(scorer, features)


@flow(name="sensor-novelty")
def sensor_novelty(params_file: str = "params.yaml") -> dict:
    """Fit the novelty score (`sensor.novelty`) and its combination with the failure probability on validation."""
    params = load_params(params_file)
    cfg, target_precision = params.sensor.novelty, params.sensor.calibrate.target_precision
    scorer = load_scorer(SENSOR.pretrained)
    with stage_run(params.tracking, "sensor", "novelty", {"novelty": cfg.model_dump()}, {"sensor": SENSOR.prepared}):
        if not cfg.enabled or scorer is None:
            why = "sensor.novelty.enabled is false" if not cfg.enabled else "pretraining is disabled"
            write_json(SENSOR.novelty, {"enabled": False, "reason": why})
            print(f"sensor novelty score off: {why}")
            return {"enabled": False}
        members, featurizer, _ = load_ensemble(SENSOR.finetuned)
        prepared = load_windows()
        train, val = prepared.windows["train"], prepared.windows["val"]
        count = prepared.report["reference_windows"]
        train_descriptions, train_errors = score(scorer, prepared.features(featurizer, "train"))
        healthy = train.y == 0
        fleet = fit_fleet_reference(train_descriptions[healthy], train_errors[healthy], train.unit[healthy],
                                    first_windows(train.unit, train.time, count)[healthy])
        val_x = prepared.features(featurizer, "val")
        departures = against_own_references(*score(scorer, val_x), val.unit,
                                            first_windows(val.unit, val.time, count), fleet,
                                            scorer.encoder.embedding_size)
        calibrator = NoveltyCalibrator().fit(departures, val.y)
        p_novel = calibrator.predict_proba(departures)
        calibration = read_json(SENSOR.calibration)
        logits = member_logits(members, val_x, calibration.get("mask_passes", 0), calibration.get("mask_seed", 0))
        p_failure = calibrated_probability(logits, calibration)
        rule, cv_nll = choose_rule(p_failure, p_novel, val.y, val.unit, cfg.rules)
        p_combined = combined_probability(p_failure, p_novel, rule)
        thresholds = {"novelty": choose_threshold(val.y, p_novel, target_precision),
                      "combined": choose_threshold(val.y, p_combined, target_precision)}
        result = {
            "enabled": True, "fleet_reference": reference_to_dict(fleet), "reference_windows": count,
            "calibration": {"weights": [float(w) for w in calibrator.coef_], "intercept": calibrator.intercept_},
            "combination": rule, "cv_nll": cv_nll, "thresholds": thresholds,
            "val_metrics": {"novelty": classification_metrics(val.y, p_novel, thresholds["novelty"]),
                            "combined": classification_metrics(val.y, p_combined, thresholds["combined"])},
        }
        write_json(SENSOR.novelty, result)
        mlflow.set_tag("combination_rule", rule["rule"])
        mlflow.log_metrics({f"cv_nll_{k}": v for k, v in cv_nll.items()})
        mlflow.log_metrics({f"val_{part}_{k}": v for part, metrics in result["val_metrics"].items()
                            for k, v in metrics.items()})
    val_pr = result["val_metrics"]
    chosen = (f" (cross-fitted NLL {', '.join(f'{k} {v:.4f}' for k, v in cv_nll.items())})" if cv_nll
              else " (the only candidate)")
    print(f"sensor novelty score: validation PR-AUC {val_pr['novelty']['pr_auc']:.4f} alone, "
          f"{val_pr['combined']['pr_auc']:.4f} combined by the {rule['rule']} rule{chosen}")
    return result


if __name__ == "__main__":
    stage_cli(sensor_novelty)
