"""Cleaning a molecule frame: bad and oversized SMILES dropped and reported, duplicate structures resolved."""

from __future__ import annotations

import numpy as np
import pandas as pd

from data.errors import DataValidationError
from data.molecules.standardize import MAX_HEAVY_ATOMS, InvalidSmilesError, MoleculeTooLargeError, canonical_smiles

CONFLICT_SPREAD = 0.5  # regression duplicates whose targets span more than this (log units) conflict
MAX_EXAMPLES = 5


def clean_molecules(
    df: pd.DataFrame,
    task: str,
    duplicates_policy: str,
    source: str,
    conflict_spread: float = CONFLICT_SPREAD,
    max_heavy_atoms: int | None = MAX_HEAVY_ATOMS,
) -> tuple[pd.DataFrame, dict]:
    """Standardise `df` (n rows: smiles, target[, split]); drop bad SMILES and molecules with more than
    `max_heavy_atoms` heavy atoms (refused before standardisation); resolve duplicate structures.

    Duplicates are rows with the same canonical SMILES. They conflict when (regression) their targets span
    more than `conflict_spread` or (classification) their labels differ. Policies:
    keep: every row stays (report only); first: the first row of each group;
    mean: one row with the mean target (classification: majority label, a tie takes the first row's label);
    drop_conflicts: conflicting groups removed, the other groups merged as in `mean`.
    A merged row takes the place (and split) of the group's first row, so row order stays that of first occurrences.
    Returns (frame (m rows: smiles, target[, split]), report); row numbers in the report are 0-based positions in `df`.
    """
    canon, invalid, too_large = [], [], []
    for row, raw in enumerate(df["smiles"].tolist()):
        try:
            canon.append(canonical_smiles(raw, max_heavy_atoms))
        except MoleculeTooLargeError as exc:
            canon.append(None)
            too_large.append({"row": row, "error": exc.message})
        except InvalidSmilesError as exc:
            canon.append(None)
            invalid.append({"row": row, "smiles": raw, "error": exc.message})
    out = df.reset_index(drop=True).assign(smiles=canon)
    out["row"] = np.arange(len(out))
    out = out[out["smiles"].notna()].reset_index(drop=True)
    if out.empty:
        why = f" ({len(too_large)} over {max_heavy_atoms} heavy atoms)" if too_large else ""
        raise DataValidationError(f"none of the {len(df)} SMILES is valid{why}", file=source, column="smiles")
    out, duplicates = _resolve_duplicates(out, task, duplicates_policy, conflict_spread)
    report = {
        "rows_in": len(df),
        "invalid": {"count": len(invalid), "examples": invalid[:MAX_EXAMPLES]},
        "too_large": {"count": len(too_large), "max_heavy_atoms": max_heavy_atoms, "examples": too_large[:MAX_EXAMPLES]},
        "duplicates": duplicates,
        "rows_out": len(out),
    }
    return out.drop(columns="row"), report


def _resolve_duplicates(df: pd.DataFrame, task: str, policy: str, spread: float) -> tuple[pd.DataFrame, dict]:
    """Apply `policy` to groups of equal `smiles` in `df` (with a `row` column); return (frame, duplicates report)."""
    n_in = len(df)
    groups = [g for _, g in df.groupby("smiles", sort=False) if len(g) > 1]
    conflicting = [g for g in groups if _conflicts(g["target"], task, spread)]
    report = {
        "policy": policy,
        "groups": len(groups),
        "rows": int(sum(len(g) for g in groups)),
        "conflicting_groups": len(conflicting),
        "conflict_rule": f"target spread > {spread}" if task == "regression" else "labels differ",
        "conflict_examples": [
            {"smiles": g["smiles"].iloc[0], "rows": g["row"].tolist(), "targets": g["target"].tolist()}
            for g in conflicting[:MAX_EXAMPLES]
        ],
    }
    if policy == "keep":
        out = df
    elif policy == "first":
        out = df.drop_duplicates("smiles", keep="first")
    elif policy in ("mean", "drop_conflicts"):
        if policy == "drop_conflicts":
            dropped = {s for g in conflicting for s in g["smiles"]}
            df = df[~df["smiles"].isin(dropped)]
        merged = {g["smiles"].iloc[0]: _merge(g["target"], task) for g in groups}
        out = df.drop_duplicates("smiles", keep="first").copy()
        out["target"] = [merged.get(s, t) for s, t in zip(out["smiles"], out["target"])]
        out["target"] = out["target"].astype(df["target"].dtype)
    else:
        raise ValueError(f"unknown duplicates policy {policy!r}")
    report["rows_removed"] = n_in - len(out)
    return out.reset_index(drop=True), report


def _conflicts(targets: pd.Series, task: str, spread: float) -> bool:
    """Whether the targets of one duplicate group disagree."""
    if task == "regression":
        return float(targets.max() - targets.min()) > spread
    return targets.nunique() > 1


def _merge(targets: pd.Series, task: str) -> float | int:
    """One target for a duplicate group: mean (regression) or majority label, ties to the first row."""
    if task == "regression":
        return float(targets.mean())
    counts = targets.value_counts(sort=False)
    best = counts.max()
    return int(next(t for t in targets if counts[t] == best))
