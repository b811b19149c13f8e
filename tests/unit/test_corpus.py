"""The MOSES corpus step: read from a wheel only after its SHA-256 matches, a seeded sample of distinct SMILES."""

import gzip
import hashlib
import zipfile

import pandas as pd
import pytest

from data.errors import DataValidationError
from data.molecules.corpus import MEMBER, read_moses, sample_corpus


@pytest.fixture
def wheel(tmp_path):
    """A wheel-shaped zip holding MOSES's train.csv.gz with 6 molecules (one twice), and its SHA-256."""
    smiles = ["CCO", "c1ccccc1", "CC(=O)O", "CCN", "CCO", "C1CCCCC1", "CCCl"]
    path = tmp_path / "molsets.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(MEMBER, gzip.compress(pd.DataFrame({"SMILES": smiles}).to_csv(index=False).encode()))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_reads_the_member_of_a_verified_wheel(wheel):
    path, digest = wheel
    assert read_moses(path, digest).tolist()[:3] == ["CCO", "c1ccccc1", "CC(=O)O"]


def test_a_wheel_with_another_hash_is_refused(wheel, tmp_path):
    path, _ = wheel
    with pytest.raises(DataValidationError, match="is not the expected") as info:
        read_moses(path, "0" * 64)
    assert str(path) in str(info.value)


def test_sample_is_seeded_distinct_and_bounded(wheel):
    smiles = read_moses(*wheel)
    a, b = sample_corpus(smiles, 4, seed=1), sample_corpus(smiles, 4, seed=1)
    assert a.equals(b) and list(a.columns) == ["smiles"] and a["smiles"].is_unique and len(a) == 4
    assert set(a["smiles"]) <= set(smiles)
    assert sorted(sample_corpus(smiles, 6, seed=2)["smiles"]) == sorted(set(smiles))
    with pytest.raises(ValueError, match="6 distinct molecules"):
        sample_corpus(smiles, 7, seed=0)
