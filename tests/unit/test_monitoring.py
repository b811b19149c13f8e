"""Monitoring statistics (models/monitoring.py), the reference file, the report's alarms and recalibration
composed onto an ONNX graph (models/recalibration.py)."""

from __future__ import annotations

import datetime

import numpy as np
import pandas as pd
import pytest
from rdkit import DataStructs
from rdkit.Chem import rdFingerprintGenerator

from contract.prediction_store import summary_means, window_summaries
from contract.reference import read_reference, write_reference
from data.molecules.standardize import parse_smiles
from flows.config import MonitorConfig
from flows.monitoring.reports import family_report
from bench.drift_scenario import logistic_onnx
from models.metrics import expected_calibration_error
from models.drift import bin_shares, nearest_similarity, out_of_range, psi, window_means
from models.monitoring import descriptor_matrix, molecule_reference, morgan_bits, sensor_drift, sensor_reference
from models.onnx_runtime import load_session, run
from models.recalibration import apply_probability_map, compose_recalibration, fit_probability_map

CHANNELS = ["vibration", "temperature", "pressure"]


def _windows(n: int, shift: np.ndarray, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(loc=rng.normal(size=(n, len(CHANNELS), 1)) + shift[None, :, None], size=(n, len(CHANNELS), 16))


def test_psi_and_ks_flag_only_the_shifted_channel():
    reference = sensor_reference(_windows(2000, np.zeros(3), 0), CHANNELS)
    same = sensor_drift(reference, window_means(_windows(500, np.zeros(3), 1)))
    shifted = sensor_drift(reference, window_means(_windows(500, np.array([0.0, 1.0, 0.0]), 2)))
    assert all(d["psi"] < 0.1 and d["ks_pvalue"] > 1e-3 for d in same.values())
    assert shifted["temperature"]["psi"] > 0.25 and shifted["temperature"]["ks"] > 0.3
    assert shifted["vibration"]["psi"] < 0.1 and shifted["pressure"]["psi"] < 0.1


def test_bin_shares_ignore_gaps_and_psi_of_equal_shares_is_zero():
    shares = bin_shares(np.array([0.0, 1.0, 2.0, np.nan, 3.0]), np.array([0.5, 2.5]))
    assert np.allclose(shares, [0.25, 0.5, 0.25])
    assert psi(shares, shares) == 0.0 and psi(shares, np.array([0.0, 0.5, 0.5])) > 0


def test_stored_window_summaries_read_back_as_channel_means():
    windows = _windows(2, np.zeros(3), 3)
    windows[0, 1] = np.nan
    summaries = window_summaries(windows.transpose(0, 2, 1), CHANNELS)  # the service's layout: (n, T, C)
    assert summaries[0]["mean"][1] is None and summaries[0]["missing"][1] == 1.0
    means = summary_means(summaries, CHANNELS[::-1])  # read by name, in any channel order
    assert np.isnan(means[0, -2]) and means[0, -1] == pytest.approx(windows[0, 0].mean(), rel=1e-5)
    assert means[1, -1] == pytest.approx(windows[1, 0].mean(), rel=1e-5)


def test_nearest_similarity_is_rdkits_bulk_tanimoto():
    train = ["CCO", "c1ccccc1O", "CC(=O)Nc1ccc(O)cc1", "ClC(Cl)Cl"]
    queries = ["CCCO", "c1ccccc1N", "CCN(CC)CC"]
    generator = rdFingerprintGenerator.GetMorganGenerator(radius=2, fpSize=2048)
    fingerprints = [generator.GetFingerprint(parse_smiles(s)) for s in train]
    expected = [max(DataStructs.BulkTanimotoSimilarity(generator.GetFingerprint(parse_smiles(q)), fingerprints))
                for q in queries]
    assert np.allclose(nearest_similarity(morgan_bits(train), morgan_bits(queries)), expected)


def test_descriptor_out_of_range_share():
    reference = molecule_reference(["CCO", "CCCO", "CCCCO"])
    shares = out_of_range(reference, descriptor_matrix(["CCCO", "CCCCCCCCCCCCCCCCO"]))
    assert shares["HeavyAtomCount"] == 0.5 and shares["any"] == 0.5 and shares["RingCount"] == 0.0


def test_reference_round_trip_without_pickles(tmp_path):
    reference = molecule_reference(["CCO", "c1ccccc1O"])
    write_reference(tmp_path / "reference.npz", reference)
    back = read_reference(tmp_path)
    assert back["descriptor_names"].tolist() == reference["descriptor_names"].tolist()
    assert np.array_equal(back["fingerprints"], reference["fingerprints"]) and back["fingerprints"].dtype == np.uint8
    assert read_reference(tmp_path / "older-version") is None


def _labelled(p: np.ndarray, y: np.ndarray) -> pd.DataFrame:
    start = datetime.datetime(2026, 11, 1, tzinfo=datetime.timezone.utc)
    return pd.DataFrame({"received_at": [start + datetime.timedelta(minutes=i) for i in range(len(p))],
                         "output": [{"failure_probability": float(v)} for v in p], "observed": y.astype(float),
                         "unit": "m000"})


def test_calibration_alarm_needs_min_outcomes_and_an_ece_above_the_bound():
    rng = np.random.default_rng(0)
    p = rng.uniform(0, 0.4, size=400)
    card = {"family": "sensor", "task": "classification", "threshold": 0.5}
    cfg = MonitorConfig(min_outcomes=300, max_ece=0.07)
    calibrated, inflated = (rng.random(400) < p).astype(int), (rng.random(400) < p / 4).astype(int)
    empty = pd.DataFrame({"input_summary": []})
    assert family_report(card, None, empty, _labelled(p, calibrated), cfg)["alarms"] == []
    assert family_report(card, None, empty, _labelled(p[:200], inflated[:200]), cfg)["alarms"] == []
    alarms = family_report(card, None, empty, _labelled(p, inflated), cfg)["alarms"]
    assert len(alarms) == 1 and alarms[0].startswith("calibration: ECE")


@pytest.fixture()
def logistic(tmp_path):
    rng = np.random.default_rng(0)
    path = logistic_onnx(tmp_path / "model.onnx", rng.normal(size=(6, 2)), np.array([-1.0, -1.5]))
    features = rng.normal(size=(600, 6, 16)).astype(np.float32)
    return path, features, run(load_session(path, prefer_cuda=False)[0], {"features": features})


@pytest.mark.parametrize("method", ["isotonic", "temperature"])
def test_composed_recalibration_answers_the_numpy_map_and_keeps_the_ranking(tmp_path, logistic, method):
    path, features, served = logistic
    p = served["probability"].astype(np.float64)
    y = (np.random.default_rng(1).random(len(p)) < p**3).astype(int)  # the model overestimates failures
    recalibration = fit_probability_map(p[:400], y[:400], None, [method])
    composed = compose_recalibration(path, tmp_path / "recalibrated.onnx", recalibration)
    out = run(load_session(composed, prefer_cuda=False)[0], {"features": features})
    assert np.allclose(out["probability"], apply_probability_map(p, recalibration), atol=1e-5)
    assert expected_calibration_error(y[400:], out["probability"][400:]) < expected_calibration_error(y[400:], p[400:])
    order = np.argsort(p)
    assert (np.diff(out["probability"][order]) >= -1e-6).all()
    # the members' spread follows the map's slope; a second recalibration composes onto the first
    assert (out["uncertainty"] >= 0).all() and not np.allclose(out["uncertainty"], served["uncertainty"])
    twice = compose_recalibration(composed, tmp_path / "twice.onnx", recalibration)
    again = run(load_session(twice, prefer_cuda=False)[0], {"features": features})["probability"]
    assert np.allclose(again, apply_probability_map(apply_probability_map(p, recalibration), recalibration), atol=1e-5)


def test_interval_scale_multiplies_only_the_uncertainty(tmp_path, logistic):
    path, features, served = logistic
    composed = compose_recalibration(path, tmp_path / "scaled.onnx", {"method": "interval_scale", "factor": 1.7})
    out = run(load_session(composed, prefer_cuda=False)[0], {"features": features})
    assert np.array_equal(out["probability"], served["probability"])
    assert np.allclose(out["uncertainty"], 1.7 * served["uncertainty"], rtol=1e-6)


def test_molecule_report_flags_narrow_intervals_and_molecules_outside_the_domain():
    train = ["CCO", "CCCO", "CCCCO", "CC(C)O", "OCCO", "CCOC"]
    reference = molecule_reference(train)
    card = {"family": "molecule", "task": "regression", "calibration": {"interval_z": 1.96, "nominal_coverage": 0.95}}
    cfg = MonitorConfig(min_outcomes=10, max_coverage_error=0.1, min_similarity=0.3, max_out_of_domain=0.3)
    rng = np.random.default_rng(0)
    y = rng.normal(size=200)
    outputs = [{"value": 0.0, "uncertainty": 0.25}] * 200 + [{"value": None, "uncertainty": None, "error": "bad"}]
    labelled = _labelled(np.zeros(201), np.append(y, 0.0)).assign(output=outputs)
    inside = pd.DataFrame({"input_summary": [{"smiles": s} for s in train * 2], "output": [{}] * 12})
    outside = pd.DataFrame({"input_summary": [{"smiles": "c1ccc2ccccc2c1"}] * 12, "output": [{}] * 12})
    quiet = family_report(card, reference, inside, labelled.iloc[:0], cfg)
    assert quiet["alarms"] == [] and quiet["inputs"]["out_of_domain"] == 0.0
    report = family_report(card, reference, outside, labelled, cfg)
    assert report["outcomes"]["n"] == 200  # the unanswered item is not judged
    assert report["outcomes"]["metrics"]["coverage"] < 0.5
    assert [a.split(":")[0] for a in report["alarms"]] == ["applicability domain", "calibration"]
    assert report["inputs"]["out_of_range"]["NumAromaticRings"] == 1.0


def test_interval_recalibration_restores_the_nominal_coverage_on_held_out_outcomes():
    from flows.monitoring.recalibrate import _interval_fit, split_in_time

    rng = np.random.default_rng(0)
    y = rng.normal(scale=2.0, size=1000)
    labelled = _labelled(np.zeros(1000), y).assign(output=[{"value": 0.0, "uncertainty": 1.0}] * 1000)
    card = {"calibration": {"interval_z": 1.96, "nominal_coverage": 0.95, "method": "scaled_variance"}}
    result = _interval_fit(card, *split_in_time(labelled, 0.3))
    assert result["recalibration"].factor == pytest.approx(2.0, rel=0.1)
    assert result["error_before"] > 0.2 and result["error_after"] < 0.03
