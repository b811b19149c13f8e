"""Load, clean and split molecules into train/val/test frames with a data-quality report; save and reload them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from data.errors import DataValidationError
from data.molecules.config import MoleculeDataConfig
from data.molecules.sources import SPLIT_NAMES, load_molecule_frame
from data.molecules.split import assign_splits
from data.molecules.clean import clean_molecules
from data.molecules.tokenizer import SmilesTokenizer

REPORT_FILE = "report.json"
TOKENIZER_FILE = "tokenizer.json"


@dataclass
class PreparedMolecules:
    """Per split a frame (n_split rows: smiles str, target float|int); `task`; the JSON-ready report; the SMILES
    tokenizer built from the training split (its `to_dict()`)."""

    splits: dict[str, pd.DataFrame]
    task: str
    report: dict
    tokenizer: dict | None = None


def prepare_molecule_data(cfg: MoleculeDataConfig) -> PreparedMolecules:
    """Load → clean → split → check; raises DataValidationError naming the source, column and split."""
    raw, source = load_molecule_frame(cfg)
    clean, report = clean_molecules(raw, cfg.task, cfg.duplicates, source, max_heavy_atoms=cfg.max_heavy_atoms)
    names = assign_splits(clean, cfg)
    splits = {name: clean.loc[names == name, ["smiles", "target"]].reset_index(drop=True) for name in SPLIT_NAMES}
    for name, frame in splits.items():
        _check_split(name, frame, cfg, source)
    report = {
        "source": source,
        "task": cfg.task,
        "split": cfg.split,
        "config": cfg.model_dump(mode="json"),
        **report,
        "sizes": {name: len(frame) for name, frame in splits.items()},
        "target_stats": {name: _target_stats(frame["target"], cfg.task) for name, frame in splits.items()},
    }
    tokenizer = SmilesTokenizer.build(splits["train"]["smiles"], cfg.max_smiles_length)
    return PreparedMolecules(splits=splits, task=cfg.task, report=report, tokenizer=tokenizer.to_dict())


def _check_split(name: str, frame: pd.DataFrame, cfg: MoleculeDataConfig, source: str) -> None:
    """A split must be non-empty and, for classification, hold both classes."""
    how = f"{cfg.split} split" + (f" (column '{cfg.split_column}')" if cfg.split == "column" else "")
    if frame.empty:
        column = cfg.split_column if cfg.split == "column" else cfg.smiles_column
        raise DataValidationError(f"split '{name}' is empty after the {how}", file=source, column=column)
    if cfg.task == "classification" and frame["target"].nunique() < 2:
        only = int(frame["target"].iloc[0])
        raise DataValidationError(
            f"split '{name}' has only class {only} ({len(frame)} molecules) after the {how}; it needs both 0 and 1",
            file=source,
            column=cfg.target_column,
        )


def _target_stats(target: pd.Series, task: str) -> dict:
    """Summary of one split's target: count, mean, sd, min, max (regression) or count, positives, positive share."""
    if task == "classification":
        positives = int(target.sum())
        return {"count": len(target), "positives": positives, "positive_fraction": round(positives / len(target), 6)}
    stats = {"mean": target.mean(), "std": target.std(ddof=0), "min": target.min(), "max": target.max()}
    return {"count": len(target), **{k: round(float(v), 6) for k, v in stats.items()}}


def save_prepared(prepared: PreparedMolecules, out_dir: str | Path) -> None:
    """Write train.csv, val.csv, test.csv (smiles,target), report.json and tokenizer.json; same input → byte-identical files."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in prepared.splits.items():
        frame[["smiles", "target"]].to_csv(out / f"{name}.csv", index=False, lineterminator="\n")
    (out / REPORT_FILE).write_text(json.dumps(prepared.report, indent=2, sort_keys=True) + "\n")
    if prepared.tokenizer is not None:
        (out / TOKENIZER_FILE).write_text(json.dumps(prepared.tokenizer, indent=1) + "\n")


def load_prepared(out_dir: str | Path) -> PreparedMolecules:
    """Read what `save_prepared` wrote; raises DataValidationError naming a missing file."""
    out = Path(out_dir)
    for path in [out / REPORT_FILE, *(out / f"{name}.csv" for name in SPLIT_NAMES)]:
        if not path.is_file():
            raise DataValidationError("prepared file not found (run the molecule prepare step)", file=path)
    report = json.loads((out / REPORT_FILE).read_text())
    dtype = {"smiles": str, "target": "int64" if report["task"] == "classification" else "float64"}
    splits = {name: pd.read_csv(out / f"{name}.csv", dtype=dtype, keep_default_na=False) for name in SPLIT_NAMES}
    tokenizer_path = out / TOKENIZER_FILE
    tokenizer = json.loads(tokenizer_path.read_text()) if tokenizer_path.is_file() else None
    return PreparedMolecules(splits=splits, task=report["task"], report=report, tokenizer=tokenizer)
