"""The departure-from-normal score (models/sensor/novelty.py) and its combination with the supervised probability
(models/sensor/combination.py), with references and departures (models/sensor/departure.py): every observed value
reconstructed once with its span hidden, a unit's own mean with its spread shrunk to the fleet's within-unit spread,
monotone calibration, the earliest windows of each unit, the score rising on faults no training window showed, the
combination rule chosen by cross-fitted validation NLL, and the combined ONNX graph's parity."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from data.sensors.featurize import WindowFeaturizer
from models.export import export_onnx
from models.onnx_runtime import load_session, run
from models.sensor.alert import INPUT_AXES, OUTPUTS, AlertModel
from models.sensor.calibrated import calibrated_ensemble
from models.sensor.combination import RULES, choose_rule, combined_probability, fit_rule
from models.sensor.config import SensorModelConfig, SensorPretrainConfig
from models.sensor.encoder import SensorEncoder
from models.sensor.network import SensorClassifier
from models.sensor.departure import (PRIOR_WINDOWS, departure, fit_fleet_reference, fit_reference, reference_from_dict,
                                     reference_to_dict)
from models.sensor.novelty import PATTERNS, NoveltyCalibrator, NoveltyScorer, fit_monotone_logistic, score_windows
from models.sensor.training import MASK_SPAN, pretrain_encoder

TINY = SensorModelConfig(hidden=16, layers=2, dropout=0.0, attention_layers=1, heads=2, projection=8)
CHANNELS = ["a", "b", "c"]


def healthy(n: int, rng: np.random.Generator, length: int = 32) -> np.ndarray:
    """(n, 3, T) smooth daily-cycle-like signals with noise, a random phase per window and channel."""
    t = np.arange(length)
    phase = rng.uniform(0, 2 * np.pi, (n, len(CHANNELS), 1))
    return np.sin(2 * np.pi * t / 16 + phase) + 0.05 * rng.normal(size=(n, len(CHANNELS), length))


def test_every_observed_value_is_reconstructed_once_with_its_span_hidden():
    torch.manual_seed(0)
    encoder, decoder = SensorEncoder(6, TINY), torch.nn.Conv1d(TINY.hidden, 3, 1)
    scorer = NoveltyScorer(encoder, decoder, 3, MASK_SPAN).eval()
    hidden = scorer.hidden_steps(30)
    assert hidden.shape == (PATTERNS, 30) and (hidden.sum(0) == 1).all()  # each step hidden by one pattern
    x = torch.randn(5, 6, 30)
    x[:, 3:] = (torch.rand(5, 3, 30) > 0.2).float()  # observed-masks: a fifth missing
    x[:, :3] *= x[:, 3:]
    x[4, 3:] = 0.0  # a window with nothing observed
    with torch.no_grad():
        description, error = scorer(x)
        squared, count = torch.zeros(5), torch.zeros(5)
        for k in range(PATTERNS):
            keep = (~hidden[k]).float()
            recon = decoder(encoder.sequence(x * keep))
            target = hidden[k] & (x[:, 3:] > 0.5)
            squared += (((recon - x[:, :3]) ** 2) * target).sum(dim=(1, 2))
            count += target.sum(dim=(1, 2))
        expected = squared / count.clamp(min=1)
        assert torch.allclose(error, expected, rtol=1e-5, atol=1e-6)
        assert torch.allclose(description[:, :2 * TINY.hidden], encoder(x))
        observed_means = (x[:, :3] * x[:, 3:]).sum(dim=-1) / x[:, 3:].sum(dim=-1).clamp(min=1)
        assert torch.allclose(description[:, 2 * TINY.hidden:], observed_means, atol=1e-6)  # missing values not counted
    assert error[4] == 0 and (description[4, 2 * TINY.hidden:] == 0).all()


def test_a_unit_keeps_its_own_mean_and_its_spread_is_shrunk_to_the_fleet_s_within_unit_spread():
    rng = np.random.default_rng(0)
    levels = rng.choice([0.0, 10.0], 40)  # two operating points across the fleet
    descriptions = np.repeat(levels, 100)[:, None] + rng.normal(0, 0.5, (4000, 3))
    units = np.repeat(np.arange(40), 100)
    marked = np.tile(np.arange(100) < 20, 40)
    fleet = fit_fleet_reference(descriptions, np.full(4000, 0.1), units, marked)
    assert np.allclose(fleet.within, 0.5, atol=0.05)  # within units, not the 5-unit spread between them
    assert (fleet.scale > 4).all() and np.allclose(fleet.mean, descriptions.mean(0))
    none = fit_reference(np.empty((0, 3)), np.empty(0), fleet)
    assert none.windows == 0 and np.array_equal(none.mean, fleet.mean) and np.array_equal(none.scale, fleet.scale)
    own = rng.normal(10, 0.2, (400, 3))
    long = fit_reference(own, np.full(400, 1.0), fleet)
    short = fit_reference(own[:8], np.full(8, 1.0), fleet)
    assert np.allclose(short.mean, own[:8].mean(0), atol=1e-5)  # its own operating point, not pulled to the fleet's
    weight = 8 / (8 + PRIOR_WINDOWS)
    assert np.allclose(short.scale ** 2, weight * own[:8].var(0) + (1 - weight) * fleet.within ** 2, rtol=1e-4)
    assert np.allclose(long.scale, 0.2, atol=0.05) and (short.scale > long.scale).all()
    assert short.log_error == pytest.approx(weight * np.log(1.0) + (1 - weight) * np.log(0.1), abs=1e-4)
    assert reference_from_dict(reference_to_dict(fleet)).within.tolist() == fleet.within.tolist()
    with pytest.raises(ValueError, match="at least one window"):
        fit_reference(np.empty((0, 3)), np.empty(0))
    with pytest.raises(ValueError, match="marked reference period"):
        fit_fleet_reference(descriptions, np.full(4000, 0.1), units, np.zeros(4000, bool))


def test_a_fleet_reference_without_the_within_unit_spread_is_refused():
    fleet = reference_from_dict({"mean": [0.0, 0.0], "scale": [2.0, 2.0], "log_error": np.log(0.1), "windows": 500})
    with pytest.raises(ValueError, match="no within-unit spread"):
        fit_reference(np.ones((8, 2)), np.full(8, 1.0), fleet)


def test_departure_measures_distances_and_error_against_each_windows_reference():
    mean, scale = np.zeros((2, 4), np.float32), np.ones((2, 4), np.float32)
    descriptions = np.array([[0.0, 0.0, 1.0, 1.0], [3.0, 4.0, 0.0, 2.0]])  # embedding (2), channel means (2)
    got = departure(descriptions, np.array([0.1, 1.0]), mean, scale, np.log([0.1, 0.1]), embedding_size=2)
    assert got.shape == (2, 3)
    assert got[1, 0] == pytest.approx(np.log(12.5), abs=1e-4)  # mean of 9 and 16
    assert got[0, 1] == pytest.approx(0, abs=1e-4) and got[1, 1] == pytest.approx(np.log(2), abs=1e-4)
    assert got[0, 2] == pytest.approx(0, abs=1e-4) and got[1, 2] == pytest.approx(np.log(10), abs=1e-4)


def test_the_monotone_logistic_never_weighs_a_departure_negatively():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4000, 2))
    y = (rng.random(4000) < 1 / (1 + np.exp(-(1.5 * x[:, 0] - 1.0 * x[:, 1] - 1)))).astype(int)
    weights, intercept = fit_monotone_logistic(x, y)
    assert weights[0] == pytest.approx(1.5, rel=0.15) and weights[1] == 0.0  # the negative one is held at 0
    calibrator = NoveltyCalibrator().fit(x, y)
    assert abs(calibrator.predict_proba(x).mean() - y.mean()) < 0.02
    with pytest.raises(ValueError, match="both classes"):
        NoveltyCalibrator().fit(x, np.zeros(4000))


def test_the_novelty_score_rises_on_faults_no_training_window_showed():
    """Pretrained on healthy windows only; two injected faults of kinds the training data never shows depart from the
    unit's own reference where windows of the same unit without them do not: one channel's swing tripled (the
    embedding and the reconstruction error), one channel's level moved by its swing's size (the channel means)."""
    rng = np.random.default_rng(0)
    train = healthy(512, rng)
    featurizer = WindowFeaturizer(CHANNELS).fit(train)
    encoder, decoder, _ = pretrain_encoder(featurizer.transform(train), TINY,
                                           SensorPretrainConfig(epochs=6, batch_size=64, lr=0.003, seed=0),
                                           torch.device("cpu"))
    scorer = NoveltyScorer(encoder, decoder, len(CHANNELS), MASK_SPAN)
    units = np.repeat(np.arange(16), 32)
    fleet = fit_fleet_reference(*score_windows(scorer, featurizer.transform(train)), units, np.tile(np.arange(32) < 8, 16))
    reference, clean = healthy(24, rng), healthy(200, rng)
    swing, level = clean.copy(), clean.copy()
    swing[:, 1] *= 3.0
    level[:, 2] += 1.0
    ref = fit_reference(*score_windows(scorer, featurizer.transform(reference)), fleet)
    scores = {}
    for name, windows in (("clean", clean), ("swing", swing), ("level", level)):
        descriptions, errors = score_windows(scorer, featurizer.transform(windows))
        n = len(windows)
        scores[name] = departure(descriptions, errors, np.tile(ref.mean, (n, 1)), np.tile(ref.scale, (n, 1)),
                                 np.full(n, ref.log_error), scorer.encoder.embedding_size)
    labels = np.r_[np.zeros(200), np.ones(200)]
    for fault, column in (("swing", 0), ("swing", 2), ("level", 1)):  # embedding, error; channel means
        assert roc_auc_score(labels, np.r_[scores["clean"][:, column], scores[fault][:, column]]) > 0.9, (fault, column)


def test_the_rule_of_lowest_cross_fitted_nll_is_chosen_and_stays_calibrated():
    rng = np.random.default_rng(2)
    n = 6000
    groups = np.repeat(np.arange(30), n // 30)
    kind = rng.choice([0, 1, 2], n, p=[0.8, 0.1, 0.1])  # normal, a fault the classifier knows, one only novelty sees
    p_failure = np.clip(np.where(kind == 1, rng.beta(8, 2, n), rng.beta(2, 8, n)), 1e-3, 1 - 1e-3)
    p_novel = np.clip(np.where(kind == 2, rng.beta(8, 2, n), rng.beta(2, 8, n)), 1e-3, 1 - 1e-3)
    y = (kind > 0).astype(int)
    fitted, scores = choose_rule(p_failure, p_novel, y, groups)
    assert set(scores) == set(RULES) and fitted["rule"] == min(scores, key=scores.get)
    assert fitted["rule"] in ("stacker", "max") and scores["supervised"] > scores[fitted["rule"]]
    assert abs(combined_probability(p_failure, p_novel, fitted).mean() - y.mean()) < 0.01
    # where only the classifier carries the signal, novelty gets no weight
    y = (kind == 1).astype(int)
    fitted = fit_rule("stacker", p_failure, rng.permutation(p_novel), y)
    assert fitted["weights"][0] > 1 and fitted["weights"][1] < 0.1 and fitted["weights"][2] == 0  # "larger" unused


def test_the_combined_graph_answers_in_onnx_runtime_as_in_pytorch_and_as_the_numpy_parts(tmp_path):
    """Each window against its own reference (distinct rows), at another batch size than the export's example."""
    torch.manual_seed(0)
    rng = np.random.default_rng(3)
    featurizer = WindowFeaturizer(CHANNELS).fit(healthy(64, rng))
    x = featurizer.transform(healthy(64, rng))
    members = [SensorClassifier(6, TINY).fit_statistics(x).eval() for _ in range(2)]
    ensemble = calibrated_ensemble(members, {"method": "temperature", "temperature": 1.5})
    scorer = NoveltyScorer(SensorEncoder(6, TINY), torch.nn.Conv1d(TINY.hidden, 3, 1), 3, MASK_SPAN).eval()
    novelty = {"weights": [0.8, 0.3, 0.5], "intercept": -1.0}
    rule = {"rule": "stacker", "weights": [1.0, 0.7, 0.0], "intercept": -0.2}
    model = AlertModel(ensemble, scorer, novelty, rule).eval()

    def inputs(n: int) -> dict[str, np.ndarray]:
        size = scorer.description_size
        return {"features": featurizer.transform(healthy(n, rng)),
                "reference_mean": rng.normal(size=(n, size)).astype(np.float32),
                "reference_scale": rng.uniform(0.5, 2, (n, size)).astype(np.float32),
                "reference_log_error": rng.normal(size=n).astype(np.float32)}

    path = export_onnx(model, {k: torch.from_numpy(v) for k, v in inputs(4).items()}, INPUT_AXES, OUTPUTS,
                       tmp_path / "alert.onnx")
    feeds = inputs(9)
    got = run(load_session(path, prefer_cuda=False)[0], feeds)
    with torch.no_grad():
        expected = model(*(torch.from_numpy(v) for v in feeds.values()))
    for name, value in zip(OUTPUTS, expected):
        assert np.allclose(got[name], value.numpy(), atol=1e-5, rtol=1e-4), name
    departures = departure(got["description"], got["reconstruction_error"], feeds["reference_mean"],
                           feeds["reference_scale"], feeds["reference_log_error"], scorer.encoder.embedding_size)
    p_novel = 1 / (1 + np.exp(-(departures @ np.array(novelty["weights"]) + novelty["intercept"])))
    assert np.allclose(got["novelty"], p_novel, atol=1e-5)
    assert np.allclose(got["combined"], combined_probability(got["probability"], got["novelty"], rule), atol=1e-5)
