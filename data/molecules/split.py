"""Train/val/test assignment of molecules: Bemis-Murcko scaffold (DeepChem protocol), random, or a given column."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from rdkit.Chem.Scaffolds.MurckoScaffold import MurckoScaffoldSmiles
from tqdm.auto import tqdm

from data.molecules.config import MoleculeDataConfig
from data.molecules.standardize import MAX_HEAVY_ATOMS, parse_smiles


def scaffold_of(smiles: str, max_heavy_atoms: int | None = MAX_HEAVY_ATOMS) -> str:
    """Bemis-Murcko scaffold SMILES without chirality ('' for acyclic molecules); MoleculeTooLargeError above
    `max_heavy_atoms` (the scaffold's cost grows about cubically with atoms)."""
    return MurckoScaffoldSmiles(mol=parse_smiles(smiles, max_heavy_atoms), includeChirality=False)


def scaffold_split(smiles: Sequence[str], train_fraction: float = 0.8, val_fraction: float = 0.1,
                   max_heavy_atoms: int | None = MAX_HEAVY_ATOMS) -> np.ndarray:
    """Split names (n,) of str, exactly as DeepChem's ScaffoldSplitter (the ANCHORS.md protocol).

    Scaffold groups sorted by (size, first row) descending, i.e. DeepChem's `sorted(..., reverse=True)`:
    equal-size groups go later rows first. ANCHORS.md writes "first row index ascending"; both give the
    anchor sizes (ESOL 902/113/113, BBBP 1631/204/204), but ascending leaves BBBP's val and test 100 %
    positive (rows >= 1000 of BBBP.csv are all positive), so its reported ROC-AUCs need DeepChem's order.
    A group goes to train while train stays <= train_fraction * n, else to val while train + val stays
    <= (train_fraction + val_fraction) * n, else to test. A group is never divided.
    """
    groups: dict[str, list[int]] = {}
    for row, smi in enumerate(tqdm(smiles, desc="scaffolds", unit="molecule", leave=False, mininterval=1.0)):
        groups.setdefault(scaffold_of(smi, max_heavy_atoms), []).append(row)
    n = len(smiles)
    train_cut, val_cut = train_fraction * n, (train_fraction + val_fraction) * n
    out = np.full(n, "test", dtype="<U5")
    n_train = n_val = 0
    for rows in sorted(groups.values(), key=lambda g: (len(g), g[0]), reverse=True):
        if n_train + len(rows) <= train_cut:
            out[rows], n_train = "train", n_train + len(rows)
        elif n_train + n_val + len(rows) <= val_cut:
            out[rows], n_val = "val", n_val + len(rows)
    return out


def random_split(n: int, train_fraction: float = 0.8, val_fraction: float = 0.1, seed: int = 0) -> np.ndarray:
    """Split names (n,) of str from a seeded permutation: floor(train_fraction*n) train, floor(val_fraction*n) val, rest test."""
    order = np.random.default_rng(seed).permutation(n)
    n_train, n_val = int(train_fraction * n), int(val_fraction * n)
    out = np.full(n, "test", dtype="<U5")
    out[order[:n_train]] = "train"
    out[order[n_train : n_train + n_val]] = "val"
    return out


def assign_splits(df: pd.DataFrame, cfg: MoleculeDataConfig) -> np.ndarray:
    """Split names (n,) for the rows of a cleaned frame (smiles, target[, split]) per `cfg.split`."""
    if cfg.split == "scaffold":
        return scaffold_split(df["smiles"].tolist(), cfg.train_fraction, cfg.val_fraction, cfg.max_heavy_atoms)
    if cfg.split == "random":
        return random_split(len(df), cfg.train_fraction, cfg.val_fraction, cfg.seed)
    return df["split"].to_numpy(dtype="<U5")
