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
    with pytest.raises(RuntimeError, match="differs from PyTorch by 1.00e-03 at a value of 2 "):
        check_parity(expected, [np.array([0.1, 0.2]), np.array([1.0, 2.001])])
    with pytest.raises(RuntimeError, match="differs"):
        check_parity(expected, [np.array([0.1, np.nan]), np.array([1.0, 2.0])])
    # a target in the thousands: 0.04 apart is within the relative bound (0.4), beyond the absolute one; 0.5 is not
    large = (torch.tensor([4000.0]),)
    assert check_parity(large, [np.array([4000.04])]) == pytest.approx(0.04, rel=0.01)
    with pytest.raises(RuntimeError, match="at a value of 4000"):
        check_parity(large, [np.array([4000.5])])


def _miscalibrated(n=3000, seed=0):
    """Scores that rank well but are badly calibrated: the true probability is p**3."""
    rng = np.random.default_rng(seed)
    p = rng.random(n)
    y = (rng.random(n) < p**3).astype(int)
    return p, y


def test_centred_isotonic_is_strictly_increasing_and_keeps_the_ranking():
    from sklearn.metrics import average_precision_score, roc_auc_score

    from models.calibration import ISOTONIC_FLOOR, fit_isotonic, piecewise_linear

    p, y = _miscalibrated()
    knots_x, knots_y = fit_isotonic(p, y)
    assert knots_x[0] == 0.0 and knots_x[-1] == 1.0
    assert np.all(np.diff(knots_x) > 0) and np.all(np.diff(knots_y) > 0)  # strictly increasing knots
    assert ISOTONIC_FLOOR / 2 <= min(knots_y) and max(knots_y) <= 1 - ISOTONIC_FLOOR / 2
    q = piecewise_linear(p, knots_x, knots_y)
    # a strictly increasing map: no new ties, the order of every pair is kept
    assert len(np.unique(q)) == len(np.unique(p))
    assert np.array_equal(np.argsort(q, kind="stable"), np.argsort(p, kind="stable"))
    assert average_precision_score(y, q) == pytest.approx(average_precision_score(y, p), abs=1e-12)
    assert roc_auc_score(y, q) == pytest.approx(roc_auc_score(y, p), abs=1e-12)
    # ... while a plain (step) isotonic fit ties many points and changes average precision
    from sklearn.isotonic import IsotonicRegression

    steps = IsotonicRegression(out_of_bounds="clip").fit(p, y).predict(p)
    assert len(np.unique(steps)) < len(np.unique(p)) / 10
    assert average_precision_score(y, steps) != pytest.approx(average_precision_score(y, p), abs=1e-6)


def test_centred_isotonic_repairs_calibration_on_unseen_data():
    from models.calibration import fit_isotonic, piecewise_linear

    p_fit, y_fit = _miscalibrated(n=20000, seed=1)
    p, y = _miscalibrated(n=20000, seed=2)
    knots_x, knots_y = fit_isotonic(p_fit, y_fit)
    before = expected_calibration_error(y, p)
    after = expected_calibration_error(y, piecewise_linear(p, knots_x, knots_y))
    assert before > 0.2 and after < 0.02


def test_centred_isotonic_knots_sit_on_the_pava_blocks():
    from sklearn.isotonic import IsotonicRegression

    from models.calibration import fit_isotonic

    p = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    y = np.array([0, 1, 0, 0, 1, 1])
    # PAV blocks: {0.1} -> 0, {0.2, 0.3, 0.4} -> 1/3, {0.5, 0.6} -> 1; centres 0.1, 0.3, 0.55
    knots_x, knots_y = fit_isotonic(p, y)
    assert knots_x == pytest.approx([0.0, 0.1, 0.3, 0.55, 1.0])
    assert knots_y == pytest.approx([0.0005, 0.001, 1 / 3, 0.999, 0.9995])  # values clipped to [1e-3, 1 - 1e-3]
    iso = IsotonicRegression(y_min=1e-3, y_max=1 - 1e-3).fit(p, y)
    assert np.interp([0.1, 0.3, 0.55], knots_x, knots_y) == pytest.approx(iso.predict([0.1, 0.3, 0.55]))


def test_isotonic_calibration_chosen_by_selection_keeps_average_precision():
    from sklearn.metrics import average_precision_score

    from models.calibration import calibrated_probability, select_calibration

    rng = np.random.default_rng(3)
    units = np.repeat(np.arange(20), 100)
    z = rng.normal(0, 2, 2000)
    y = (rng.random(2000) < np.where(z > 1, 0.9, 0.05)).astype(int)  # step-shaped truth: isotonic wins
    logits = np.stack([z, z], 1)
    chosen, scores = select_calibration(logits, y, units, ["temperature", "isotonic"])
    assert chosen.method == "isotonic"
    p = calibrated_probability(logits, chosen)
    assert average_precision_score(y, p) == pytest.approx(average_precision_score(y, ensemble_probability(logits)), abs=1e-9)
    assert expected_calibration_error(y, p) < expected_calibration_error(y, ensemble_probability(logits))


@pytest.mark.parametrize("grouped", [False, True])
def test_a_validation_set_with_one_positive_gets_the_first_method_fitted_not_an_error(grouped):
    from models.calibration import calibrated_probability, select_calibration

    rng = np.random.default_rng(4)
    z = rng.normal(-3, 1, (200, 2))
    y = np.zeros(200, dtype=int)
    y[7] = 1
    chosen, scores = select_calibration(z, y, np.repeat(np.arange(20), 10) if grouped else None,
                                        ["isotonic", "temperature"])
    assert chosen.method == "isotonic" and scores == {}
    p = calibrated_probability(z, chosen)
    assert np.isfinite(p).all() and ((p >= 0) & (p <= 1)).all()
