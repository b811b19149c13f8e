"""The prepared molecule splits as the stages read them; no torch, so the stages that need no network (baseline,
register) start without it."""

from __future__ import annotations

import numpy as np

from data.errors import DataValidationError
from data.molecules.prepare import PreparedMolecules, load_prepared
from data.molecules.tokenizer import SmilesTokenizer
from flows.paths import MOLECULE
from flows.tasks import io_task


@io_task(name="load-prepared-molecules")
def load_molecules() -> PreparedMolecules:
    return load_prepared(MOLECULE.prepared)


def tokenizer_of(prepared: PreparedMolecules) -> SmilesTokenizer:
    if prepared.tokenizer is None:
        raise DataValidationError("no tokenizer.json among the prepared molecules (run the molecule prepare step)",
                                  file=MOLECULE.prepared)
    return SmilesTokenizer.from_dict(prepared.tokenizer)


def targets(prepared: PreparedMolecules, split: str) -> np.ndarray:
    """(n,) float64 targets of one split."""
    return prepared.splits[split]["target"].to_numpy(dtype=np.float64)
