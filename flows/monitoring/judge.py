"""The rollout judge: each family's `challenger`, run by the service in shadow or canary (SERVING_ROLLOUT), against
its champion on the same period's live predictions (params.yaml `monitor.judge`, docs/how-to/monitor.md).

Each side is summarised from the prediction store: requests, the share whose model call failed, p99 of the call
latency, and on labelled outcomes the monitor's quality metrics (sensor and molecule classifiers: Brier, ECE,
PR-AUC, ...; molecule regressors: RMSE and interval coverage). The champion's side is its `champion` rows made
since the challenger's first row; the challenger's side its `challenger` (canary) and `shadow` rows.

The verdict (`decide`), in order:
- rollback when the challenger breaks an SLO (error rate above `max_error_rate`, p99 above `max_p99_ms`) once it
  has `min_requests` requests;
- with `min_outcomes` labelled outcomes on each side: rollback when its calibration error exceeds the champion's by
  more than `max_calibration_loss`, or its primary metric (or Brier score) is worse beyond `tolerance`; promote
  otherwise, once its SLOs could be judged;
- wait otherwise, saying what is missing.
A rollback moves `challenger` back onto the champion's version (the service then runs none); a promotion moves
`champion` to the challenger. Both go through contract.registry.move_alias: registry tags and the alias audit log.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from mlflow import MlflowClient

from contract.card import CardError
from contract.manifest import ManifestError
from contract.prediction_store import read_rollout
from contract.registry import CHALLENGER, CHAMPION, VerifiedVersion, actor, alias_version, download_verified, \
    move_alias
from flows.config import RegistryConfig, RolloutJudgeConfig
from flows.monitoring.reports import ANSWER_FIELDS, served_probability
from models.metrics import classification_metrics, regression_metrics

JUDGE = "flows.monitor (rollout judge)"
ANSWERED_ROLES = (CHAMPION, CHALLENGER)


@dataclass
class Verdict:
    """promote, rollback or wait, and why (one line per reason)."""

    action: str
    reasons: list[str] = field(default_factory=list)


def quality(card: dict, labelled: list[dict]) -> dict:
    """Quality metrics of answered rows with outcomes (each: output, observed), plus `calibration_error` (ECE, or
    |coverage - nominal| for a regressor) and `n`."""
    y = np.array([row["observed"] for row in labelled], dtype=float)
    if card["task"] == "classification":
        p = np.array([served_probability(row["output"]) for row in labelled])
        metrics = classification_metrics(y, p, float(card.get("threshold", 0.5)))
        return {**metrics, "calibration_error": metrics["ece"], "n": len(y)}
    value = np.array([float(row["output"]["value"]) for row in labelled])
    half = card["calibration"]["interval_z"] * np.array([float(row["output"]["uncertainty"]) for row in labelled])
    metrics = regression_metrics(y, value, value - half, value + half)
    return {**metrics, "calibration_error": abs(metrics["coverage"] - card["calibration"]["nominal_coverage"]),
            "n": len(y)}


def summarize(rows: list[dict], card: dict) -> dict:
    """One side from its stored rows (read_rollout): requests (distinct request ids), failed ones, error rate,
    p99 of the per-request call latency (ms; None when no row records it) and `quality` on its labelled rows."""
    latency, failed = {}, set()
    for row in rows:
        if row["latency_ms"] is not None:
            latency.setdefault(row["request_id"], row["latency_ms"])
        if row["failed"]:
            failed.add(row["request_id"])
    requests = len({row["request_id"] for row in rows})
    labelled = [row for row in rows if row["observed"] is not None and not row["failed"]
                and any(row["output"].get(k) is not None for k in ANSWER_FIELDS)]
    return {"requests": requests, "failed_requests": len(failed),
            "error_rate": len(failed) / requests if requests else 0.0,
            "p99_ms": float(np.quantile(list(latency.values()), 0.99)) if latency else None,
            "outcomes": quality(card, labelled) if labelled else {"n": 0}}


def decide(cfg: RolloutJudgeConfig, registry: RegistryConfig, champion: dict, challenger: dict) -> Verdict:
    """The verdict on two `summarize` results (see the module docstring)."""
    reasons: list[str] = []
    slo_judged = challenger["requests"] >= cfg.min_requests
    if slo_judged:
        if challenger["error_rate"] > cfg.max_error_rate:
            reasons.append(f"SLO: {challenger['error_rate']:.2%} of {challenger['requests']} challenger requests "
                           f"failed (bound {cfg.max_error_rate:.2%})")
        if challenger["p99_ms"] is not None and challenger["p99_ms"] > cfg.max_p99_ms:
            reasons.append(f"SLO: challenger p99 latency {challenger['p99_ms']:.1f} ms exceeds {cfg.max_p99_ms:g} ms")
        if reasons:
            return Verdict("rollback", reasons)
    ours, theirs = challenger["outcomes"], champion["outcomes"]
    if min(ours["n"], theirs["n"]) < cfg.min_outcomes:
        return Verdict("wait", [f"labelled outcomes: challenger {ours['n']}, champion {theirs['n']}; each side needs "
                                f"{cfg.min_outcomes}"])
    worse = []
    if ours["calibration_error"] > theirs["calibration_error"] + cfg.max_calibration_loss:
        worse.append(f"calibration degrades: error {ours['calibration_error']:.4f} vs the champion's "
                     f"{theirs['calibration_error']:.4f} (allowed loss {cfg.max_calibration_loss})")
    metric, sign = registry.metric, 1 if registry.direction == "max" else -1
    compared = [(metric, sign)] + ([("brier", -1)] if "brier" in ours else [])
    for name, direction in compared:
        value, best = ours.get(name, math.nan), theirs.get(name, math.nan)
        if math.isnan(best):  # undefined for the champion too (e.g. one class only): nothing to compare
            continue
        if not direction * (value - best) >= -cfg.tolerance:  # NaN counts as worse
            worse.append(f"{name} {value:.4f} is worse than the champion's {best:.4f} (tolerance {cfg.tolerance})")
    if worse:
        return Verdict("rollback", worse)
    if not slo_judged:
        return Verdict("wait", [f"{challenger['requests']} challenger requests; its SLOs need {cfg.min_requests}"])
    return Verdict("promote", [f"on {ours['n']} labelled outcomes at least as good as the champion on {theirs['n']} "
                               f"({metric}, calibration{', Brier' if 'brier' in ours else ''}); SLOs met"])


def shares(champion_rows: list[dict], challenger_rows: list[dict]) -> dict:
    """Of the requests answered in the judged period, the share the challenger answered (canary), and the share
    of champion-answered requests it also ran (shadow)."""
    answered = {row["request_id"] for row in champion_rows} | {r["request_id"] for r in challenger_rows
                                                               if r["role"] == CHALLENGER}
    by_challenger = {r["request_id"] for r in challenger_rows if r["role"] == CHALLENGER}
    shadowed = {r["request_id"] for r in challenger_rows if r["role"] == "shadow"} - by_challenger
    return {"answered_share": len(by_challenger) / len(answered) if answered else 0.0,
            "shadowed_share": len(shadowed) / len(answered) if answered else 0.0}


def _act(client: MlflowClient, name: str, verdict: Verdict, champion: str, challenger: str) -> str | None:
    why = "; ".join(verdict.reasons)
    if verdict.action == "rollback":
        move_alias(client, name, CHALLENGER, champion, actor(JUDGE), f"rollback of version {challenger}: {why}")
        client.set_model_version_tag(name, challenger, "rollout", "rolled_back")
        return f"'{CHALLENGER}' moved from version {challenger} back to the champion's version {champion}"
    if verdict.action == "promote":
        move_alias(client, name, CHAMPION, challenger, actor(JUDGE), f"promoted by the rollout judge: {why}")
        client.set_model_version_tag(name, challenger, "previous_champion", champion)
        client.set_model_version_tag(name, challenger, "rollout", "promoted")
        return f"'{CHAMPION}' moved from version {champion} to version {challenger}"
    return None


def judge_rollout(cfg: RolloutJudgeConfig, registry: RegistryConfig, family: str, engine, client: MlflowClient,
                  public_key, champion: VerifiedVersion) -> dict:
    """Judge the challenger of `family` against `champion` and act on the verdict. Returns the report's
    `rollout` section (JSON-ready): decision, reasons, action, shares, both sides, and flat `metrics`."""
    name = registry.model_name
    version = alias_version(client, name, CHALLENGER)
    if version is None or version == champion.version:
        return {"skipped": f"no challenger to judge ({name} '{CHALLENGER}' is "
                           f"{'unset' if version is None else 'the champion'})"}
    with tempfile.TemporaryDirectory(prefix="judge-") as scratch:
        try:
            card = download_verified(client, name, version, Path(scratch), public_key).card
        except (ManifestError, CardError) as error:  # the service refuses to run it too
            return {"skipped": f"challenger not judged: {error}"}
    challenger_rows = read_rollout(engine, family, name, version, [CHALLENGER, "shadow"], cfg.window)
    if not challenger_rows:
        return {"challenger_version": version, "decision": "wait",
                "reasons": ["the challenger has no predictions in the store (SERVING_ROLLOUT off?)"]}
    since = challenger_rows[0]["created_at"]
    champion_rows = read_rollout(engine, family, name, champion.version, [CHAMPION], cfg.window, since=since)
    ours, theirs = summarize(challenger_rows, card), summarize(champion_rows, champion.card)
    verdict = decide(cfg, registry, theirs, ours)
    action = _act(client, name, verdict, champion.version, version)
    share = shares(champion_rows, challenger_rows)
    metrics = {**{f"rollout_{k}": v for k, v in share.items()},
               **{f"rollout_{side}_{k}": float(v) for side, summary in (("challenger", ours), ("champion", theirs))
                  for k, v in [("error_rate", summary["error_rate"]), ("p99_ms", summary["p99_ms"]),
                               ("outcomes_n", summary["outcomes"]["n"]),
                               ("calibration_error", summary["outcomes"].get("calibration_error"))]
                  if v is not None and math.isfinite(v)}}
    return {"challenger_version": version, "champion_version": champion.version, "since": str(since),
            "decision": verdict.action, "reasons": verdict.reasons, "action": action, **share,
            "challenger": ours, "champion": theirs, "metrics": metrics}
