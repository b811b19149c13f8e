"""Benchmark of the monitor on the drift scenario (not a test; bench/drift_scenario.py, docs/how-to/monitor.md):

1. a logistic sensor ensemble trained on a plant's reference fleet is registered with its training reference;
2. a drifted fleet of the same plant streams windows through it into a prediction store, outcomes following;
3. detection: the smallest number of labelled outcomes at which the monitor's report (the same code the flow
   runs) raises the calibration alarm, checked every 50 outcomes, for the drifted stream and for an undrifted one
   (false alarms);
4. the `monitor` flow runs on the store (its last `--outcomes` outcomes), recalibrates and gates;
5. ECE of the champion before and of the new version after, on a fresh drifted fleet none of them saw.

    .venv/bin/python bench/monitoring.py [--outcomes 2000] [--regime-shift 0.5] [--failure-fraction 0.8]

Results go to bench/results/monitoring.json and bench/results/monitoring.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
CHECK_EVERY = 50


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outcomes", type=int, default=2000, help="labelled drifted outcomes in the store")
    parser.add_argument("--regime-shift", type=float, default=None)
    parser.add_argument("--failure-fraction", type=float, default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-monitoring-"))
    os.chdir(work)  # the flow's workspace: nothing is written into the project
    sys.path.insert(0, str(ROOT))

    from mlflow import MlflowClient

    from contract.manifest import load_verify_key, public_key_path
    from contract.prediction_store import connect
    from contract.registry import CHAMPION, alias_version
    from flows.monitor import monitor
    from flows.monitoring.reports import family_report
    from bench.drift_scenario import (Scenario, fleet_stream, register_model, train_reference_model,
                                      write_params, write_predictions)
    from bench.results_files import machine, write_results
    from flows.monitoring.prediction_frames import labelled_predictions, recent_predictions
    from flows.params import load_params
    from flows.tracking import signing_key, use_tracking
    from models.metrics import classification_metrics
    from serving.loading import load_version

    overrides = {k: v for k, v in {"regime_shift": args.regime_shift,
                                   "drifted_failure_fraction": args.failure_fraction}.items() if v is not None}
    scenario = Scenario(**overrides)
    params_file = write_params(work, {"window": args.outcomes})
    params = load_params(params_file)
    cfg = params.monitor
    use_tracking(params.tracking)
    model = train_reference_model(scenario, work / "export")
    first = register_model(params, model)
    client, name = MlflowClient(), params.sensor.registry.model_name
    public_key = load_verify_key(public_key_path(signing_key(params.tracking)))
    champion = load_version(client, "sensor", name, str(first["registered_version"]), CHAMPION, public_key, False)
    assert champion.reference is not None

    def detection(store: str, stream) -> dict:
        write_predictions(store, champion.predictor, stream, name, champion.version, scenario.horizon)
        engine = connect(store)
        labelled = labelled_predictions(engine, "sensor", name, champion.version, len(stream.windows.y))
        recent = recent_predictions(engine, "sensor", name, champion.version, len(stream.windows.y))
        engine.dispose()
        curve = []
        for n in range(CHECK_EVERY, len(labelled) + 1, CHECK_EVERY):
            report = family_report(champion.card, champion.reference, recent.iloc[:n], labelled.iloc[:n], cfg)
            curve.append({"outcomes": n, "ece": report["outcomes"]["metrics"]["ece"],
                          "max_psi": report["inputs"]["max_psi"],
                          "calibration_alarm": any(a.startswith("calibration") for a in report["alarms"]),
                          "drift_alarm": any(a.startswith("input drift") for a in report["alarms"])})
        first_alarm = next((c["outcomes"] for c in curve if c["calibration_alarm"]), None)
        first_drift = next((c["outcomes"] for c in curve if c["drift_alarm"]), None)
        judged = [c["ece"] for c in curve if c["outcomes"] >= cfg.min_outcomes]
        return {"calibration_alarm_at": first_alarm, "drift_alarm_at": first_drift,
                "ece_range": [min(judged), max(judged)],
                "checks_with_calibration_alarm": sum(c["calibration_alarm"] for c in curve),
                "checks": sum(c["outcomes"] >= cfg.min_outcomes for c in curve), "curve": curve}

    drifted = fleet_stream(scenario, seed=101, drifted=True).head(args.outcomes)
    undrifted = fleet_stream(scenario, seed=102, drifted=False).head(args.outcomes)
    false_alarms = detection(f"sqlite:///{work / 'undrifted.db'}", undrifted)
    detected = detection(cfg.store_url, drifted)

    result = monitor(params_file=str(params_file))["sensor"]
    recalibration = result["recalibration"]
    new_version = alias_version(client, name, CHAMPION)
    recalibrated = load_version(client, "sensor", name, new_version, CHAMPION, public_key, False)

    evaluation = fleet_stream(scenario, seed=202, drifted=True).windows
    reference_fleet = fleet_stream(scenario, seed=203, drifted=False).windows

    def scores(loaded, windows) -> dict:
        p = loaded.predictor.predict(windows.X)["probability"]
        return classification_metrics(windows.y, p, loaded.predictor.threshold)

    summary = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "machine": machine(),
        "scenario": {**scenario.__dict__, "drifted_stream_seed": 101, "undrifted_stream_seed": 102,
                     "evaluation_fleet_seed": 202},
        "monitor": cfg.model_dump(exclude={"store_url"}),
        "reference_model_test": model.card["test_metrics"],
        "detection_drifted": {k: v for k, v in detected.items() if k != "curve"},
        "detection_undrifted": {k: v for k, v in false_alarms.items() if k != "curve"},
        "curve_drifted": detected["curve"],
        "monitor_alarms": result["alarms"],
        "recalibration": {k: recalibration[k] for k in ("method", "lineage", "calibration_error_before",
                                                          "calibration_error_after", "promoted", "reasons",
                                                          "registered_version")},
        "evaluation_drifted": {"windows": len(evaluation.y), "positive_rate": float(evaluation.y.mean()),
                               "before": scores(champion, evaluation), "after": scores(recalibrated, evaluation)},
        "evaluation_undrifted": {"windows": len(reference_fleet.y), "before": scores(champion, reference_fleet),
                                 "after": scores(recalibrated, reference_fleet)},
    }
    write_results("monitoring", summary, markdown)


def markdown(s: dict) -> str:
    d, u, r = s["detection_drifted"], s["detection_undrifted"], s["recalibration"]
    before, after = s["evaluation_drifted"]["before"], s["evaluation_drifted"]["after"]
    ub, ua = s["evaluation_undrifted"]["before"], s["evaluation_undrifted"]["after"]
    sc, m = s["scenario"], s["monitor"]
    return "\n".join([
        f"# Monitoring benchmark ({s['date']})", "",
        f"{s['machine']}. Scenario: plant {sc['plant_seed']}, {sc['n_units']} machines x {sc['n_steps']} steps, "
        f"window {sc['window']}, horizon {sc['horizon']}; drift: regime_shift {sc['regime_shift']}, failure_fraction "
        f"{sc['reference_failure_fraction']} -> {sc['drifted_failure_fraction']}. Monitor: max_ece {m['max_ece']}, "
        f"min_outcomes {m['min_outcomes']}, window {m['window']}, holdout_fraction {m['holdout_fraction']}.", "",
        "## Detection (report every 50 labelled outcomes)", "",
        "| stream | first calibration alarm at | first PSI alarm at | checks with calibration alarm (of those with >= min_outcomes) | ECE range in those checks |",
        "|---|---|---|---|---|",
        *(f"| {name} | {x['calibration_alarm_at']} | {x['drift_alarm_at']} | {x['checks_with_calibration_alarm']} / "
          f"{x['checks']} | {x['ece_range'][0]:.3f} - {x['ece_range'][1]:.3f} |" for name, x in (("drifted", d), ("undrifted", u))),
        "", "## Recalibration by the monitor flow", "",
        f"{r['method']} on {r['lineage']['fitted_on']} outcomes, gated on the newest {r['lineage']['held_out']}: "
        f"held-out ECE {r['calibration_error_before']:.4f} -> {r['calibration_error_after']:.4f}; version "
        f"{r['registered_version']} {'promoted' if r['promoted'] else 'refused'} ({'; '.join(r['reasons'])}).", "",
        f"Fresh fleets none of the models saw ({s['evaluation_drifted']['windows']} drifted windows, positive rate "
        f"{s['evaluation_drifted']['positive_rate']:.3f}):", "",
        "| fleet | model | ECE | Brier | PR-AUC |", "|---|---|---|---|---|",
        f"| drifted | champion before | {before['ece']:.4f} | {before['brier']:.4f} | {before['pr_auc']:.4f} |",
        f"| drifted | recalibrated | {after['ece']:.4f} | {after['brier']:.4f} | {after['pr_auc']:.4f} |",
        f"| undrifted | champion before | {ub['ece']:.4f} | {ub['brier']:.4f} | {ub['pr_auc']:.4f} |",
        f"| undrifted | recalibrated | {ua['ece']:.4f} | {ua['brier']:.4f} | {ua['pr_auc']:.4f} |", "",
    ])


if __name__ == "__main__":
    main()
