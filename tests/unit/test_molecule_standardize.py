"""Parsing, standardisation and cleaning (bad SMILES, duplicate structures)."""

from __future__ import annotations

import pandas as pd
import pytest

from data.errors import DataValidationError
from data.molecules.clean import clean_molecules
from data.molecules.standardize import InvalidSmilesError, canonical_smiles, parse_smiles


def test_parse_smiles_strips_whitespace():
    assert parse_smiles(" CCO ").GetNumAtoms() == 3


@pytest.mark.parametrize("bad", ["", "  ", None])
def test_empty_smiles(bad):
    with pytest.raises(InvalidSmilesError, match="empty SMILES"):
        parse_smiles(bad)


def test_unparseable_smiles_names_the_input(capfd):
    with pytest.raises(InvalidSmilesError) as err:
        parse_smiles("CC(C")
    assert "could not parse SMILES 'CC(C'" in str(err.value)
    assert isinstance(err.value, DataValidationError)
    assert "SMILES Parse Error" not in capfd.readouterr().err  # RDKit's own log is silenced


def test_canonical_smiles_is_idempotent():
    for smi in ["OCC", "C[NH+](C)C.[Cl-]", "O=[N+]([O-])c1ccccc1", "C/C=C/C"]:
        once = canonical_smiles(smi)
        assert canonical_smiles(once) == once
    assert canonical_smiles("C[NH+](C)C.[Cl-]") == "CN(C)C"


def _frame(smiles, target, **extra):
    return pd.DataFrame({"smiles": smiles, "target": target, **extra})


def test_clean_drops_and_reports_bad_smiles():
    df = _frame(["CCO ", "", "C1CC", "c1ccccc1", "xyz"], [0.1, 0.2, 0.3, 0.4, 0.5])
    out, report = clean_molecules(df, "regression", "mean", "test.csv")
    assert out["smiles"].tolist() == ["CCO", "c1ccccc1"]
    assert out["target"].tolist() == [0.1, 0.4]
    assert report["invalid"]["count"] == 3
    assert [e["row"] for e in report["invalid"]["examples"]] == [1, 2, 4]
    assert report["invalid"]["examples"][2]["smiles"] == "xyz"
    assert report["rows_in"] == 5 and report["rows_out"] == 2


def test_clean_reports_at_most_five_examples():
    df = _frame(["bad"] * 8 + ["C"], [0.0] * 9)
    _, report = clean_molecules(df, "regression", "mean", "x.csv")
    assert report["invalid"]["count"] == 8 and len(report["invalid"]["examples"]) == 5


def test_clean_all_invalid_names_source():
    with pytest.raises(DataValidationError, match="x.csv: column 'smiles'"):
        clean_molecules(_frame(["bad", ""], [0.0, 1.0]), "regression", "mean", "x.csv")


# rows 0, 2 and 4 are ethanol written three ways, rows 1 and 3 benzene (aromatic and Kekulé)
REG = _frame(["CCO", "c1ccccc1", "OCC", "C1=CC=CC=C1", "C(C)O", "CC"], [1.0, 2.0, 2.0, 2.2, 3.0, 5.0])


@pytest.mark.parametrize(
    "policy, smiles, target",
    [
        ("keep", ["CCO", "c1ccccc1", "CCO", "c1ccccc1", "CCO", "CC"], [1.0, 2.0, 2.0, 2.2, 3.0, 5.0]),
        ("first", ["CCO", "c1ccccc1", "CC"], [1.0, 2.0, 5.0]),
        ("mean", ["CCO", "c1ccccc1", "CC"], [2.0, 2.1, 5.0]),
        ("drop_conflicts", ["c1ccccc1", "CC"], [2.1, 5.0]),
    ],
)
def test_regression_duplicate_policies(policy, smiles, target):
    out, report = clean_molecules(REG, "regression", policy, "x.csv")
    assert out["smiles"].tolist() == smiles
    assert out["target"].tolist() == pytest.approx(target)
    dup = report["duplicates"]
    assert (dup["groups"], dup["rows"], dup["conflicting_groups"]) == (2, 5, 1)  # ethanol spans 2.0 > 0.5; benzene 0.2
    assert dup["conflict_examples"] == [{"smiles": "CCO", "rows": [0, 2, 4], "targets": [1.0, 2.0, 3.0]}]
    assert dup["rows_removed"] == 6 - len(smiles)


def test_conflict_threshold_is_a_parameter():
    _, report = clean_molecules(REG, "regression", "mean", "x.csv", conflict_spread=0.1)
    assert report["duplicates"]["conflicting_groups"] == 2


def test_classification_majority_and_conflicts():
    df = _frame(["CCO", "OCC", "C(C)O", "CC", "CC", "N", "N"], [0, 1, 1, 1, 1, 0, 1])
    out, report = clean_molecules(df, "classification", "mean", "x.csv")
    assert out["smiles"].tolist() == ["CCO", "CC", "N"]
    assert out["target"].tolist() == [1, 1, 0]  # majority; the N tie takes the first row's label
    assert out["target"].dtype == "int64"
    assert report["duplicates"]["conflicting_groups"] == 2
    out, _ = clean_molecules(df, "classification", "drop_conflicts", "x.csv")
    assert out["smiles"].tolist() == ["CC"]


def test_merged_row_keeps_first_split_and_position():
    df = _frame(["CC", "CCO", "N", "OCC"], [1.0, 2.0, 3.0, 2.2], split=["train", "val", "test", "train"])
    out, _ = clean_molecules(df, "regression", "mean", "x.csv")
    assert out["smiles"].tolist() == ["CC", "CCO", "N"]
    assert out["split"].tolist() == ["train", "val", "test"]
    assert out["target"].tolist() == pytest.approx([1.0, 2.1, 3.0])
