"""Morgan count fingerprints for the random-forest baseline (RDKit, numpy)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from rdkit.Chem import rdFingerprintGenerator

from data.molecules.standardize import MAX_HEAVY_ATOMS, parse_smiles


def morgan_counts(smiles: Sequence[str], radius: int = 2, n_bits: int = 2048,
                  max_heavy_atoms: int | None = MAX_HEAVY_ATOMS) -> np.ndarray:
    """(n, n_bits) float32 hashed Morgan count fingerprints; raises InvalidSmilesError on bad SMILES (and
    MoleculeTooLargeError above `max_heavy_atoms`)."""
    generator = rdFingerprintGenerator.GetMorganGenerator(radius=radius, fpSize=n_bits)
    return np.stack([generator.GetCountFingerprintAsNumPy(parse_smiles(s, max_heavy_atoms)).astype(np.float32) for s in smiles])
