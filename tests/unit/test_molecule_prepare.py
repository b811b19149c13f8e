"""The molecule data pipeline end to end: split checks, report, save/load, and the ANCHORS.md protocol."""

from __future__ import annotations

import pandas as pd
import pytest

from data.errors import DataValidationError
from data.molecules.config import MoleculeDataConfig
from data.molecules.prepare import load_prepared, prepare_molecule_data, save_prepared

ESOL_TARGET = "measured log solubility in mols per litre"


def _file_cfg(tmp_path, df, **kw):
    path = tmp_path / "mols.csv"
    df.to_csv(path, index=False)
    return MoleculeDataConfig(source="file", path=path, **kw), path


SPLIT_FRAME = pd.DataFrame(
    {
        "smiles": ["CCO", "CCN", "c1ccccc1O", "c1ccccc1N", "C1CCCCC1", "CC(C)O", "bad", "OCC"],
        "target": [1, 0, 1, 0, 1, 0, 1, 1],
        "split": ["train", "train", "train", "val", "val", "test", "test", "test"],
    }
)


def test_column_split_prepare_and_report(tmp_path):
    cfg, path = _file_cfg(tmp_path, SPLIT_FRAME.assign(target=[1.0, 0.5, 2.0, 3.0, 4.0, 5.0, 6.0, 1.2]), split="column")
    p = prepare_molecule_data(cfg)
    assert {k: v["smiles"].tolist() for k, v in p.splits.items()} == {
        "train": ["CCO", "CCN", "Oc1ccccc1"],
        "val": ["Nc1ccccc1", "C1CCCCC1"],
        "test": ["CC(C)O"],  # OCC merged into CCO (first occurrence, train)
    }
    assert p.splits["train"]["target"].tolist() == pytest.approx([1.1, 0.5, 2.0])
    r = p.report
    assert r["source"] == str(path) and r["rows_in"] == 8 and r["rows_out"] == 6
    assert r["invalid"]["count"] == 1 and r["invalid"]["examples"][0]["row"] == 6
    assert r["duplicates"]["groups"] == 1 and r["duplicates"]["conflicting_groups"] == 0
    assert r["sizes"] == {"train": 3, "val": 2, "test": 1}
    assert r["target_stats"]["val"] == {"count": 2, "mean": 3.5, "std": 0.5, "min": 3.0, "max": 4.0}


def test_molecule_over_the_limit_is_dropped_and_counted_before_the_rest(tmp_path):
    big = "C" * 30  # 30 heavy atoms
    frame = SPLIT_FRAME.assign(smiles=[*SPLIT_FRAME["smiles"][:5], big, "bad", "OCCC"], target=range(8))
    p = prepare_molecule_data(_file_cfg(tmp_path, frame, split="column", max_heavy_atoms=20)[0])
    assert p.splits["test"]["smiles"].tolist() == ["CCCO"]
    too_large = p.report["too_large"]
    assert too_large["count"] == 1 and too_large["max_heavy_atoms"] == 20
    assert too_large["examples"][0]["row"] == 5 and "30 heavy atoms; at most 20" in too_large["examples"][0]["error"]
    assert p.report["invalid"]["count"] == 1 and p.report["rows_out"] == 6


def test_a_raised_limit_reaches_the_scaffold_split(tmp_path):
    smiles = ["c1ccccc1" + "C" * 250, *SPLIT_FRAME["smiles"][:6], "C1CCC1", "C1CCCC1O", "CC1CCNC1"]
    cfg = _file_cfg(tmp_path, pd.DataFrame({"smiles": smiles, "target": range(10)}), max_heavy_atoms=300)[0]
    p = prepare_molecule_data(cfg)
    assert p.report["too_large"]["count"] == 0 and p.report["rows_out"] == 10
    with pytest.raises(DataValidationError, match="none of the 1 SMILES is valid \\(1 over 200 heavy atoms\\)"):
        prepare_molecule_data(_file_cfg(tmp_path, pd.DataFrame({"smiles": smiles[:1], "target": [0.0]}))[0])


def test_empty_split_names_source_column_and_split(tmp_path):
    cfg, path = _file_cfg(tmp_path, SPLIT_FRAME.assign(split=["train"] * 6 + ["test"] * 2), split="column", task="classification")
    with pytest.raises(DataValidationError) as err:
        prepare_molecule_data(cfg)
    assert (err.value.file, err.value.column) == (str(path), "split")
    assert "split 'val' is empty" in str(err.value)


def test_classification_split_needs_both_classes(tmp_path):
    cfg, path = _file_cfg(tmp_path, SPLIT_FRAME.rename(columns={"target": "p_np"}), split="column", task="classification", target_column="p_np")
    with pytest.raises(DataValidationError) as err:
        prepare_molecule_data(cfg)  # test keeps only CC(C)O (label 0): 'bad' is dropped, OCC merges into train
    assert (err.value.file, err.value.column) == (str(path), "p_np")
    assert "split 'test' has only class 0" in str(err.value)


def test_save_load_round_trip_and_byte_identical(tmp_path):
    cfg = MoleculeDataConfig()
    p = prepare_molecule_data(cfg)
    assert p.report["rows_in"] == 1282 and sum(p.report["sizes"].values()) == p.report["rows_out"]
    save_prepared(p, tmp_path / "a")
    q = load_prepared(tmp_path / "a")
    assert q.task == p.task and q.report == p.report and q.tokenizer == p.tokenizer
    # the tokenizer is built from the training split only, and every training SMILES fits it
    from data.molecules.tokenizer import SmilesTokenizer, UNK_ID, tokenize
    tokenizer = SmilesTokenizer.from_dict(p.tokenizer)
    assert tokenizer.max_length == cfg.max_smiles_length
    assert set(tokenizer.vocabulary[5:]) == {t for s in p.splits["train"]["smiles"] for t in tokenize(s)}
    assert all(UNK_ID not in tokenizer.encode(s) for s in p.splits["train"]["smiles"])
    for name in ("train", "val", "test"):
        pd.testing.assert_frame_equal(q.splits[name], p.splits[name])
    save_prepared(prepare_molecule_data(cfg), tmp_path / "b")
    save_prepared(q, tmp_path / "c")
    for name in ("train.csv", "val.csv", "test.csv", "report.json", "tokenizer.json"):
        first = (tmp_path / "a" / name).read_bytes()
        assert first == (tmp_path / "b" / name).read_bytes() == (tmp_path / "c" / name).read_bytes()


def test_load_prepared_missing_file(tmp_path):
    with pytest.raises(DataValidationError, match="report.json"):
        load_prepared(tmp_path)


@pytest.mark.shared_data
def test_esol_pipeline_reproduces_anchor(shared_data):
    cfg = MoleculeDataConfig(source="file", path=shared_data / "esol" / "delaney-processed.csv", target_column=ESOL_TARGET, duplicates="keep")
    r = prepare_molecule_data(cfg).report
    assert r["sizes"] == {"train": 902, "val": 113, "test": 113}
    assert r["invalid"]["count"] == 0
    assert (r["duplicates"]["groups"], r["duplicates"]["rows"], r["duplicates"]["conflicting_groups"]) == (11, 22, 1)


@pytest.mark.shared_data
def test_bbbp_pipeline_reproduces_anchor(shared_data):
    cfg = MoleculeDataConfig(source="file", path=shared_data / "bbbp" / "BBBP.csv", target_column="BBBP", task="classification", duplicates="keep")
    p = prepare_molecule_data(cfg)
    r = p.report
    assert r["sizes"] == {"train": 1631, "val": 204, "test": 204}
    assert r["invalid"]["count"] == 11 and [e["row"] for e in r["invalid"]["examples"]] == [59, 61, 391, 614, 642]
    # README (plain canonical SMILES): 60 groups, 124 rows, 10 conflicting; standardisation also merges salt forms
    # (e.g. rows 0 and 378, propranolol with and without a [Cl] fragment, labels 1 and 0)
    dup = r["duplicates"]
    assert (dup["groups"], dup["rows"], dup["conflicting_groups"]) == (68, 141, 11)
    assert dup["conflict_examples"][0] == {"smiles": "CC(C)NCC(O)COc1cccc2ccccc12", "rows": [0, 378], "targets": [1, 0]}
    assert sum(s["positives"] for s in r["target_stats"].values()) == 1560
    for name in ("val", "test"):
        assert 0 < r["target_stats"][name]["positive_fraction"] < 1
    dedup = prepare_molecule_data(cfg.model_copy(update={"duplicates": "drop_conflicts"})).report
    # 11 conflicting pairs dropped (22 rows); the other 57 groups (119 rows) merged to one row each
    assert dedup["rows_out"] == 2039 - 22 - (119 - 57)
