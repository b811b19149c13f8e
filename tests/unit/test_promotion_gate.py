"""The promotion gate decides on metrics alone: tested without a registry."""

from flows.config import RegistryConfig, ServingBudget
from flows.registry import decide

MAX = RegistryConfig(model_name="m", primary_metric="pr_auc", mode="max", tolerance=0.01, max_calibration_error=0.1)
MIN = RegistryConfig(model_name="m", primary_metric="rmse", mode="min", tolerance=0.0, max_calibration_error=0.1)


def test_first_version_is_promoted_when_calibrated():
    decision = decide(MAX, {"pr_auc": 0.5}, None, calibration_error=0.02)
    assert decision.promote and decision.reasons == ["no champion to compare with"]


def test_better_or_within_tolerance_is_promoted():
    assert decide(MAX, {"pr_auc": 0.80}, {"pr_auc": 0.75}, 0.02).promote
    assert decide(MAX, {"pr_auc": 0.745}, {"pr_auc": 0.75}, 0.02).promote


def test_worse_challenger_is_refused_with_reason():
    decision = decide(MAX, {"pr_auc": 0.70}, {"pr_auc": 0.75}, 0.02)
    assert not decision.promote
    assert "worse than champion's 0.7500" in decision.reasons[0]


def test_lower_is_better_metrics():
    assert decide(MIN, {"rmse": 0.9}, {"rmse": 1.0}, 0.0).promote
    assert not decide(MIN, {"rmse": 1.1}, {"rmse": 1.0}, 0.0).promote


def test_miscalibrated_challenger_is_refused_even_if_better():
    decision = decide(MAX, {"pr_auc": 0.99}, {"pr_auc": 0.75}, calibration_error=0.3)
    assert not decision.promote
    assert any("calibration error 0.3000 exceeds 0.1" in r for r in decision.reasons)


def test_nan_metric_is_refused():
    assert not decide(MAX, {"pr_auc": float("nan")}, None, 0.0).promote


def test_a_recalibration_must_lower_the_champions_calibration_error_on_the_same_outcomes():
    champion = {"pr_auc": 0.75, "calibration_error": 0.12}
    assert decide(MAX, {"pr_auc": 0.75}, champion, 0.03, compare_calibration=True).promote
    refused = decide(MAX, {"pr_auc": 0.75}, {**champion, "calibration_error": 0.02}, 0.03, compare_calibration=True)
    assert not refused.promote and "calibration error 0.0300 is not lower than champion's 0.0200" in refused.reasons


def test_a_version_worse_than_the_runs_baseline_is_refused_unless_told():
    baseline = {"pr_auc": 0.90, "ece": 0.01}
    refused = decide(MAX, {"pr_auc": 0.85}, None, 0.02, baseline=baseline)
    assert not refused.promote and "pr_auc 0.8500 is worse than the baseline's 0.9000" in refused.reasons
    assert decide(MAX, {"pr_auc": 0.895}, None, 0.02, baseline=baseline).promote  # within the tolerance
    assert decide(MAX.model_copy(update={"must_beat_baseline": False}), {"pr_auc": 0.85}, None, 0.02,
                  baseline=baseline).promote
    assert not decide(MIN, {"rmse": 1.2}, None, 0.02, baseline={"rmse": 1.0}).promote


def test_a_constant_predictor_on_a_handful_of_positives_is_not_judged():
    """At the prior a predictor's ECE is near 0: on 3 test positives the gate cannot judge, whatever the metrics."""
    decision = decide(MAX, {"pr_auc": 0.99}, None, 0.0, test_positives=3)
    assert not decision.promote and "3 positives, fewer than min_positives = 10" in decision.reasons[0]
    assert decide(MAX, {"pr_auc": 0.99}, None, 0.0, test_positives=10).promote


def cost(batch_1: float, batch_64: float) -> dict:
    return {"total_ms_per_item": {"batch_1": batch_1, "batch_64": batch_64}, "machine": "the registering machine"}


def test_a_version_over_its_serving_budget_is_refused_in_one_line_however_well_it_scores():
    budgeted = MAX.model_copy(update={"serving_budget_ms": ServingBudget(batch_1=10, batch_64=2)})
    decision = decide(budgeted, {"pr_auc": 0.99}, {"pr_auc": 0.5}, 0.01, serving_cost=cost(12.5, 1.0))
    assert not decision.promote
    assert decision.reasons == ["serving cost 12.50 ms per item at batch 1 exceeds registry.serving_budget_ms.batch_1 "
                                "= 10 (measured on the registering machine)"]
    assert "batch 64 exceeds registry.serving_budget_ms.batch_64 = 2" in decide(
        budgeted, {"pr_auc": 0.99}, None, 0.01, serving_cost=cost(5, 2.5)).reasons[0]
    assert decide(budgeted, {"pr_auc": 0.99}, {"pr_auc": 0.5}, 0.01, serving_cost=cost(10, 2)).promote  # at the bound
    assert decide(budgeted, {"pr_auc": 0.99}, None, 0.01, serving_cost=None).promote  # a card from before: not measured
    unbounded = MAX.model_copy(update={"serving_budget_ms": ServingBudget(batch_1=None, batch_64=None)})
    assert decide(unbounded, {"pr_auc": 0.99}, None, 0.01, serving_cost=cost(1e6, 1e6)).promote
