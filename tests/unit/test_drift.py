"""The statistics the service computes live (models/drift.py, models/quality.py) against scipy and scikit-learn,
and the applicability domain of single molecules (serving/families/molecule/domain.py)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import ks_2samp
from sklearn.metrics import average_precision_score, brier_score_loss

from data.molecules.descriptors import DESCRIPTORS
from data.molecules.standardize import parse_smiles
from models.drift import FINGERPRINT_BITS, ks_statistic, morgan_fingerprint, nearest_similarity
from models.monitoring import molecule_reference
from models.quality import average_precision, brier_score, interval_coverage, rmse
from serving.families.molecule.domain import assess, unusable

BYTES = FINGERPRINT_BITS // 8


def test_ks_statistic_is_scipys():
    rng = np.random.default_rng(0)
    for first, second in [(rng.normal(size=300), rng.normal(0.3, size=120)), (rng.integers(0, 4, 50) * 1.0,
                                                                              rng.integers(0, 5, 70) * 1.0)]:
        assert ks_statistic(first, second) == pytest.approx(ks_2samp(first, second).statistic, abs=1e-12)
    assert ks_statistic(np.array([0.0, 1.0]), np.array([2.0, 3.0])) == 1.0


def test_average_precision_and_brier_are_scikit_learns_with_ties():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 400)
    p = np.round(rng.random(400), 1)  # many tied scores
    assert average_precision(y, p) == pytest.approx(average_precision_score(y, p), abs=1e-12)
    assert brier_score(y, p) == pytest.approx(brier_score_loss(y, p), abs=1e-12)
    assert np.isnan(average_precision(np.ones(5), p[:5]))


def test_rmse_and_interval_coverage_by_hand():
    y = np.array([0.0, 1.0, 2.0, 3.0])
    assert rmse(y, y + np.array([1.0, -1.0, 1.0, -1.0])) == 1.0
    assert interval_coverage(y, y - 0.5, np.array([0.5, 1.5, 1.0, 2.0])) == 0.5


def test_identical_fingerprints_are_similar_1_and_disjoint_ones_0():
    first, second = np.zeros((1, BYTES), np.uint8), np.zeros((1, BYTES), np.uint8)
    first[0, :3], second[0, 3:6] = 0b1011, 0b0110
    reference = np.concatenate([first, second])
    assert nearest_similarity(reference, first).tolist() == [1.0]
    assert nearest_similarity(first, second).tolist() == [0.0]
    half = first.copy()
    half[0, 0] = 0b0011  # 8 of the 9 bits of `first`
    assert nearest_similarity(reference, half)[0] == pytest.approx(8 / 9)
    assert nearest_similarity(reference[:, :5], half[:, :5])[0] == pytest.approx(8 / 9)  # not whole 64-bit words


def _molecules(smiles: list[str]) -> tuple[np.ndarray, np.ndarray]:
    from data.molecules.featurize import featurize_smiles

    return (np.stack([morgan_fingerprint(parse_smiles(s)) for s in smiles]),
            np.stack([featurize_smiles(s).descriptors for s in smiles]))


def test_a_training_molecule_is_in_domain_and_a_foreign_one_is_not():
    reference = molecule_reference(["CCO", "CCCO", "CCCCO"])
    training, foreign = assess(reference, *_molecules(["CCCO", "FC(F)(F)C(F)(F)F"]), min_similarity=0.3)
    assert training == {"nearest_similarity": 1.0, "in_domain": True, "descriptors_out_of_range": 0.0}
    assert foreign["nearest_similarity"] < 0.3 and foreign["in_domain"] is False
    outside = sum(reference["descriptor_min"][j] > v or v > reference["descriptor_max"][j]
                  for j, v in enumerate(_molecules(["FC(F)(F)C(F)(F)F"])[1][0]))
    assert foreign["descriptors_out_of_range"] == pytest.approx(outside / len(DESCRIPTORS)) and outside > 0


def test_a_reference_the_service_cannot_use_is_named():
    reference = molecule_reference(["CCO"])
    assert unusable(reference) is None
    assert "no training reference" in unusable(None)
    assert "radius 3" in unusable({**reference, "fingerprint_radius": np.array(3)})
    assert "descriptors" in unusable({**reference, "descriptor_names": reference["descriptor_names"][::-1]})
