"""Flow `monitor`: each family's champion against its training reference and its labelled outcomes, from the
prediction store the service fills; the rollout judge of a challenger the service runs in shadow or canary; a
gated recalibration when a threshold is crossed (docs/how-to/monitor.md).

    python -m flows.monitor [--params params.yaml]

One MLflow run `<family>.monitor` per family (metrics, report JSON with the judge's decision, reliability plot),
and `<family>.recalibrate` when it recalibrates. Retraining stays the weekly flow."""

from __future__ import annotations

import tempfile
from pathlib import Path

import mlflow
import numpy as np
from mlflow import MlflowClient
from prefect import flow

from contract.manifest import load_verify_key, public_key_path
from contract.prediction_store import connect
from contract.reference import read_reference
from contract.registry import CHAMPION, FAMILIES, alias_version, download_verified, sqlite_file
from flows import plots
from flows._environment import workspace
from flows.monitoring.judge import judge_rollout
from flows.monitoring.recalibrate import recalibrate
from flows.monitoring.reports import family_report, served_probability
from flows.monitoring.prediction_frames import labelled_predictions, recent_predictions, shown_url, store_url
from flows.params import Params, load_params
from flows.tasks import stage_cli
from flows.tracking import log_json, signing_key, stage_run, use_tracking


def monitor_family(params: Params, family: str, engine, store: str, client: MlflowClient, public_key) -> dict:
    """Report on the champion of `family` and judge its challenger; recalibrate the champion on an alarm when
    allowed, enough outcomes exist and the judge did not replace it."""
    cfg, name = params.monitor, getattr(params, family).registry.model_name
    version = alias_version(client, name, CHAMPION)
    if version is None:
        return {"skipped": f"{name} has no champion"}
    with tempfile.TemporaryDirectory(prefix="monitor-") as scratch:
        champion = download_verified(client, name, version, Path(scratch), public_key)
        recent = recent_predictions(engine, family, name, version, cfg.drift_window)
        labelled = labelled_predictions(engine, family, name, version, cfg.window)
        report = {"model_name": name, "version": version, "store": store,
                  **family_report(champion.card, read_reference(champion.directory), recent, labelled, cfg)}
        if cfg.judge.enabled:
            report["rollout"] = judge_rollout(cfg.judge, getattr(params, family).registry, family, engine, client,
                                              public_key, champion)
        rollout = report.get("rollout", {})
        with stage_run(params.tracking, family, "monitor", {"monitor": cfg.model_dump()}):
            mlflow.set_tags({"monitor.model": f"{name} v{version}", "monitor.alarms": str(len(report["alarms"])),
                             "monitor.rollout": rollout.get("decision", "none")})
            mlflow.log_metrics({**report["metrics"], **rollout.get("metrics", {})})
            log_json(report, "monitor_report.json")
            if champion.card["task"] == "classification" and len(labelled):
                p = np.array([served_probability(o) for o in labelled["output"]])
                figure = plots.reliability_diagram(labelled["observed"].to_numpy(float), {f"v{version}": p},
                                                   Path(scratch) / "reliability_outcomes.png")
                mlflow.log_artifact(str(figure))
        if report["alarms"] and cfg.recalibrate:
            if rollout.get("decision") == "promote":
                report["recalibration"] = {"skipped": f"the rollout judge promoted version "
                                                      f"{rollout['challenger_version']}"}
            elif len(labelled) >= cfg.min_outcomes:
                report["recalibration"] = recalibrate(params, champion, labelled, store)
            else:
                report["recalibration"] = {"skipped": f"{len(labelled)} labelled outcomes, fewer than "
                                                      f"monitor.min_outcomes = {cfg.min_outcomes}"}
    return report


def _describe(family: str, report: dict) -> str:
    if "skipped" in report:
        return f"{family}: {report['skipped']}"
    text = f"{family} v{report['version']}: " + ("; ".join(report["alarms"]) or "no alarm")
    rollout = report.get("rollout", {})
    if "decision" in rollout:
        text += (f"; rollout judge on challenger v{rollout['challenger_version']}: {rollout['decision']} "
                 f"({'; '.join(rollout['reasons'])})")
        if "answered_share" in rollout:
            text += f", it answered {rollout['answered_share']:.1%} of the requests"
    recalibration = report.get("recalibration")
    if recalibration and "skipped" in recalibration:
        text += f"; no recalibration ({recalibration['skipped']})"
    elif recalibration:
        verdict = "promoted to champion" if recalibration["promoted"] else "kept as challenger"
        text += (f"; recalibrated ({recalibration['method']}) as v{recalibration['registered_version']}, {verdict}: "
                 f"held-out calibration error {recalibration['calibration_error_before']:.4f} -> "
                 f"{recalibration['calibration_error_after']:.4f}")
    return text


@flow(name="monitor")
def monitor(params_file: str = "params.yaml") -> dict:
    """Reports for both families' champions; recalibration on alarms (see the module docstring)."""
    params = load_params(params_file)
    url = store_url(params.monitor.store_url, workspace())
    database = sqlite_file(url)
    if database is not None and not database.is_file():
        print(f"no prediction store at {database}: the service has not answered yet; nothing to monitor")
        return {"skipped": f"no prediction store at {database}"}
    engine, store = connect(url), shown_url(url)
    use_tracking(params.tracking)
    client = MlflowClient()
    public_key = load_verify_key(public_key_path(signing_key(params.tracking)))
    reports = {family: monitor_family(params, family, engine, store, client, public_key) for family in FAMILIES}
    engine.dispose()
    for family, report in reports.items():
        print(_describe(family, report))
    return reports


if __name__ == "__main__":
    stage_cli(monitor)
