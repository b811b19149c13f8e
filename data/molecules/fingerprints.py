"""Morgan count fingerprints for the random-forest baseline (RDKit, numpy)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from rdkit.Chem import rdFingerprintGenerator

from data.molecules.standardize import parse_smiles


def morgan_counts(smiles: Sequence[str], radius: int = 2, n_bits: int = 2048) -> np.ndarray:
    """(n, n_bits) float32 hashed Morgan count fingerprints; raises InvalidSmilesError on bad SMILES."""
    generator = rdFingerprintGenerator.GetMorganGenerator(radius=radius, fpSize=n_bits)
    return np.stack([generator.GetCountFingerprintAsNumPy(parse_smiles(s)).astype(np.float32) for s in smiles])
