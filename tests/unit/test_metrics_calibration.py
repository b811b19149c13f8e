"""Metrics and calibration against hand-computed values and deliberately miscalibrated data."""

import numpy as np
import pytest
from scipy.special import expit

from models.calibration import (
    choose_threshold,
    ensemble_probability,
    fit_interval_scale,
    fit_temperature,
)
from models.metrics import classification_metrics, expected_calibration_error, regression_metrics


def test_ece_by_hand():
    # bin of p=0.1 (2 items, 1 positive): |0.5-0.1|; bin of p=0.9 (2 items, 2 positives): |1-0.9|
    y = np.array([0, 1, 1, 1])
    p = np.array([0.1, 0.1, 0.9, 0.9])
    assert expected_calibration_error(y, p) == pytest.approx(0.5 * 0.4 + 0.5 * 0.1)


def test_regression_metrics_by_hand():
    m = regression_metrics(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 5.0]),
                           lower=np.array([0.0, 2.5, 4.0]), upper=np.array([2.0, 3.0, 6.0]))
    assert m["rmse"] == pytest.approx(np.sqrt(4 / 3))
    assert m["mae"] == pytest.approx(2 / 3)
    assert m["coverage"] == pytest.approx(1 / 3)


def test_classification_metrics_perfect_ranking():
    y = np.array([0, 0, 0, 1, 1])
    m = classification_metrics(y, np.array([0.1, 0.2, 0.3, 0.8, 0.9]), threshold=0.5)
    assert m["pr_auc"] == pytest.approx(1.0) and m["roc_auc"] == pytest.approx(1.0)
    assert m["recall_at_p90"] == pytest.approx(1.0) and m["f2"] == pytest.approx(1.0)


def test_temperature_scaling_repairs_overconfident_logits():
    rng = np.random.default_rng(0)
    true_logit = rng.normal(0, 2, size=(4000, 1))
    y = (rng.random(4000) < expit(true_logit[:, 0])).astype(int)
    overconfident = np.hstack([3 * true_logit, 3 * true_logit + 0.1])
    temperature = fit_temperature(overconfident, y)
    assert temperature == pytest.approx(3.0, rel=0.15)
    before = expected_calibration_error(y, ensemble_probability(overconfident))
    after = expected_calibration_error(y, ensemble_probability(overconfident, temperature))
    assert after < before / 2


def test_interval_scale_restores_unit_variance():
    rng = np.random.default_rng(1)
    spread = rng.uniform(0.5, 2.0, 5000)
    residuals = rng.normal(0, 3 * spread)
    assert fit_interval_scale(residuals, spread) == pytest.approx(3.0, rel=0.05)


def test_threshold_reaches_target_precision_with_most_recall():
    y = np.array([0, 0, 1, 0, 1, 1, 1])
    p = np.array([0.1, 0.2, 0.3, 0.4, 0.6, 0.7, 0.9])
    threshold = choose_threshold(y, p, target_precision=0.99)
    assert threshold == pytest.approx(0.6)  # alerts at >= 0.6: precision 1, recall 3/4
    assert choose_threshold(y, p, target_precision=0.7) == pytest.approx(0.3)  # 4/5 precision, all recall


def test_parity_check_reports_and_rejects_differences():
    import torch

    from models.export import check_parity

    expected = (torch.tensor([0.1, 0.2]), torch.tensor([1.0, 2.0]))
    assert check_parity(expected, [np.array([0.1, 0.20005]), np.array([1.0, 2.0])]) == pytest.approx(5e-5, rel=1e-3)
    with pytest.raises(RuntimeError, match="differs from PyTorch by 1.00e-03"):
        check_parity(expected, [np.array([0.1, 0.2]), np.array([1.0, 2.001])])
