"""The rollout judge's rules (flows/monitoring/judge.py) on synthetic store rows: SLO breaches roll back, a
calibration or metric loss beyond its bound rolls back, too few outcomes or requests wait, a challenger at least
as good with enough of both is promoted; the shares of requests each role answered."""

from __future__ import annotations

import numpy as np
import pytest

from flows.config import RegistryConfig, RolloutJudgeConfig
from flows.monitoring.judge import decide, shares, summarize

CARD = {"family": "sensor", "task": "classification", "threshold": 0.5}
CFG = RolloutJudgeConfig(min_outcomes=200, min_requests=50, tolerance=0.01, max_calibration_loss=0.02,
                         max_error_rate=0.05, max_p99_ms=100)
REGISTRY = RegistryConfig(model_name="sensor-failure-detector", primary_metric="pr_auc", mode="max")


def rows(role: str, n: int, probability, seed: int = 0, latency_ms: float = 5.0, failed_every: int = 0,
         labelled: bool = True) -> list[dict]:
    """n one-window requests whose outcome is 1 with the row's true probability; `probability(truth)` is what
    the model answered."""
    rng = np.random.default_rng(seed)
    truth = rng.uniform(0.05, 0.95, n)
    observed = (rng.uniform(size=n) < truth).astype(float)
    out = []
    for i in range(n):
        failed = bool(failed_every) and i % failed_every == 0
        out.append({"id": f"{role}{i}", "role": role, "request_id": f"{role}-r{i}", "latency_ms": latency_ms,
                    "failed": failed, "output": {} if failed else {"failure_probability": float(probability(truth[i]))},
                    "observed": observed[i] if labelled else None})
    return out


def calibrated(p):
    return p


def inverted(p):
    return 1 - p


def test_a_calibrated_challenger_with_enough_outcomes_and_requests_is_promoted():
    champion, challenger = summarize(rows("champion", 400, calibrated, 1), CARD), \
        summarize(rows("challenger", 400, calibrated, 2), CARD)
    verdict = decide(CFG, REGISTRY, champion, challenger)
    assert verdict.action == "promote", verdict.reasons


def test_a_challenger_whose_calibration_degrades_is_rolled_back():
    champion = summarize(rows("champion", 400, calibrated, 1), CARD)
    challenger = summarize(rows("challenger", 400, inverted, 2), CARD)
    verdict = decide(CFG, REGISTRY, champion, challenger)
    assert verdict.action == "rollback"
    assert any(r.startswith("calibration degrades") for r in verdict.reasons)
    assert any(r.startswith("pr_auc") for r in verdict.reasons)


@pytest.mark.parametrize("challenger_rows, reason", [
    (rows("challenger", 100, calibrated, 2, failed_every=10), "SLO: 10.00% of 100 challenger requests failed"),
    (rows("challenger", 100, calibrated, 2, latency_ms=250.0), "SLO: challenger p99 latency 250.0 ms"),
])
def test_an_slo_breach_rolls_back_before_any_outcome_is_needed(challenger_rows, reason):
    for row in challenger_rows:
        row["observed"] = None
    verdict = decide(CFG, REGISTRY, summarize(rows("champion", 400, calibrated, 1), CARD),
                     summarize(challenger_rows, CARD))
    assert verdict.action == "rollback" and verdict.reasons[0].startswith(reason)


def test_too_few_outcomes_or_requests_wait():
    champion = summarize(rows("champion", 400, calibrated, 1), CARD)
    few_outcomes = summarize(rows("challenger", 150, calibrated, 2), CARD)
    assert decide(CFG, REGISTRY, champion, few_outcomes).action == "wait"
    assert "challenger 150, champion 400" in decide(CFG, REGISTRY, champion, few_outcomes).reasons[0]
    strict = CFG.model_copy(update={"min_requests": 1000})
    verdict = decide(strict, REGISTRY, champion, summarize(rows("challenger", 400, calibrated, 2), CARD))
    assert verdict.action == "wait" and "its SLOs need 1000" in verdict.reasons[0]


def test_failed_rows_count_as_errors_and_never_as_labelled_outcomes():
    summary = summarize(rows("challenger", 100, calibrated, 2, failed_every=4), CARD)
    assert summary["requests"] == 100 and summary["failed_requests"] == 25 and summary["error_rate"] == 0.25
    assert summary["outcomes"]["n"] == 75 and summary["p99_ms"] == 5.0


def test_shares_count_requests_not_rows():
    champion = rows("champion", 30, calibrated)
    canary = rows("challenger", 10, calibrated) * 2  # two windows per request
    shadow = [{**row, "role": "shadow", "request_id": row["request_id"]} for row in champion[:15]]
    assert shares(champion, canary + shadow) == {"answered_share": 0.25, "shadowed_share": 15 / 40}
