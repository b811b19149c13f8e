"""Whole-molecule RDKit descriptors, part of the shared featurisation (numpy + RDKit, no torch).

A short list of physically meaningful 2D descriptors: lipophilicity and refractivity (Crippen), polar surface,
size, hydrogen-bond donors/acceptors, flexibility, rings and saturation. They carry what message passing over a
few hops sees poorly (e.g. solubility follows logP, size and aromatic share: Delaney 2004), and cost about 0.1 ms
per molecule. The model standardises them with training-set statistics it stores (models/molecule/network.py).
Changing this list changes the model's input: bump FEATURIZER_VERSION in data/molecules/featurize.py.
"""

from __future__ import annotations

import numpy as np
from rdkit import Chem
from rdkit.Chem import Descriptors

DESCRIPTORS = [
    "MolLogP", "MolMR", "TPSA", "MolWt", "LabuteASA", "HeavyAtomCount", "NumValenceElectrons", "NumHeteroatoms",
    "NumHDonors", "NumHAcceptors", "NHOHCount", "NOCount", "NumRotatableBonds", "RingCount", "NumAromaticRings",
    "FractionCSP3",
]
DESCRIPTOR_SIZE = len(DESCRIPTORS)
_FUNCTIONS = dict(Descriptors.descList)


def molecule_descriptors(mol: Chem.Mol) -> np.ndarray:
    """DESCRIPTORS of `mol` as float32 (DESCRIPTOR_SIZE,); a value RDKit cannot compute (NaN, inf) becomes 0."""
    values = np.array([_FUNCTIONS[name](mol) for name in DESCRIPTORS], dtype=np.float64)
    return np.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0).astype(np.float32)
