"""Whole-molecule RDKit descriptors, part of the shared featurisation (numpy + RDKit, no torch).

Every molecule gets RDKit's 2D descriptors (`DESCRIPTORS`), in a fixed order: first a short list of physically
meaningful ones (`PHYSICAL_DESCRIPTORS`: lipophilicity and refractivity (Crippen), polar surface, size, hydrogen-bond
donors/acceptors, flexibility, rings and saturation; solubility follows logP, size and aromatic share, Delaney 2004),
then the rest of RDKit's list (E-state, charges, connectivity and shape indices, VSA bins, fragment counts, QED) but
those whose cost grows steeply with a molecule's size: `Ipc` and `AvgIpc` (a characteristic polynomial; Ipc's values
also span tens of orders of magnitude), the eight `BCUT2D_*`, `BertzCT` and `BalabanJ`
(docs/decisions/0009-molecule-descriptors.md). A model uses the leading columns of a set (`DESCRIPTOR_SETS`;
`molecule.model.descriptors`) and standardises them with training-set statistics it stores
(models/molecule/network.py). Names are pinned here, not read from the installed RDKit, so a column means the same in
training and serving. Changing the list changes the model's input: bump FEATURIZER_VERSION in
data/molecules/featurize.py.
"""

from __future__ import annotations

import numpy as np
from rdkit import Chem
from rdkit.Chem import Descriptors
from rdkit.Chem.EState import EState

PHYSICAL_DESCRIPTORS = [
    "MolLogP", "MolMR", "TPSA", "MolWt", "LabuteASA", "HeavyAtomCount", "NumValenceElectrons", "NumHeteroatoms",
    "NumHDonors", "NumHAcceptors", "NHOHCount", "NOCount", "NumRotatableBonds", "RingCount", "NumAromaticRings",
    "FractionCSP3",
]
DESCRIPTORS = PHYSICAL_DESCRIPTORS + [
    "MaxAbsEStateIndex", "MaxEStateIndex", "MinAbsEStateIndex", "MinEStateIndex", "qed", "SPS", "HeavyAtomMolWt",
    "ExactMolWt", "NumRadicalElectrons", "MaxPartialCharge", "MinPartialCharge", "MaxAbsPartialCharge",
    "MinAbsPartialCharge", "FpDensityMorgan1", "FpDensityMorgan2", "FpDensityMorgan3", "Chi0", "Chi0n", "Chi0v",
    "Chi1", "Chi1n", "Chi1v", "Chi2n", "Chi2v", "Chi3n", "Chi3v", "Chi4n", "Chi4v", "HallKierAlpha", "Kappa1",
    "Kappa2", "Kappa3", "PEOE_VSA1", "PEOE_VSA10", "PEOE_VSA11", "PEOE_VSA12", "PEOE_VSA13", "PEOE_VSA14",
    "PEOE_VSA2", "PEOE_VSA3", "PEOE_VSA4", "PEOE_VSA5", "PEOE_VSA6", "PEOE_VSA7", "PEOE_VSA8", "PEOE_VSA9",
    "SMR_VSA1", "SMR_VSA10", "SMR_VSA2", "SMR_VSA3", "SMR_VSA4", "SMR_VSA5", "SMR_VSA6", "SMR_VSA7", "SMR_VSA8",
    "SMR_VSA9", "SlogP_VSA1", "SlogP_VSA10", "SlogP_VSA11", "SlogP_VSA12", "SlogP_VSA2", "SlogP_VSA3", "SlogP_VSA4",
    "SlogP_VSA5", "SlogP_VSA6", "SlogP_VSA7", "SlogP_VSA8", "SlogP_VSA9", "EState_VSA1", "EState_VSA10",
    "EState_VSA11", "EState_VSA2", "EState_VSA3", "EState_VSA4", "EState_VSA5", "EState_VSA6", "EState_VSA7",
    "EState_VSA8", "EState_VSA9", "VSA_EState1", "VSA_EState10", "VSA_EState2", "VSA_EState3", "VSA_EState4",
    "VSA_EState5", "VSA_EState6", "VSA_EState7", "VSA_EState8", "VSA_EState9", "NumAliphaticCarbocycles",
    "NumAliphaticHeterocycles", "NumAliphaticRings", "NumAmideBonds", "NumAromaticCarbocycles",
    "NumAromaticHeterocycles", "NumAtomStereoCenters", "NumBridgeheadAtoms", "NumHeterocycles",
    "NumSaturatedCarbocycles", "NumSaturatedHeterocycles", "NumSaturatedRings", "NumSpiroAtoms",
    "NumUnspecifiedAtomStereoCenters", "Phi", "fr_Al_COO", "fr_Al_OH", "fr_Al_OH_noTert", "fr_ArN", "fr_Ar_COO",
    "fr_Ar_N", "fr_Ar_NH", "fr_Ar_OH", "fr_COO", "fr_COO2", "fr_C_O", "fr_C_O_noCOO", "fr_C_S", "fr_HOCCN",
    "fr_Imine", "fr_NH0", "fr_NH1", "fr_NH2", "fr_N_O", "fr_Ndealkylation1", "fr_Ndealkylation2", "fr_Nhpyrrole",
    "fr_SH", "fr_aldehyde", "fr_alkyl_carbamate", "fr_alkyl_halide", "fr_allylic_oxid", "fr_amide", "fr_amidine",
    "fr_aniline", "fr_aryl_methyl", "fr_azide", "fr_azo", "fr_barbitur", "fr_benzene", "fr_benzodiazepine",
    "fr_bicyclic", "fr_diazo", "fr_dihydropyridine", "fr_epoxide", "fr_ester", "fr_ether", "fr_furan", "fr_guanido",
    "fr_halogen", "fr_hdrzine", "fr_hdrzone", "fr_imidazole", "fr_imide", "fr_isocyan", "fr_isothiocyan",
    "fr_ketone", "fr_ketone_Topliss", "fr_lactam", "fr_lactone", "fr_methoxy", "fr_morpholine", "fr_nitrile",
    "fr_nitro", "fr_nitro_arom", "fr_nitro_arom_nonortho", "fr_nitroso", "fr_oxazole", "fr_oxime",
    "fr_para_hydroxylation", "fr_phenol", "fr_phenol_noOrthoHbond", "fr_phos_acid", "fr_phos_ester", "fr_piperdine",
    "fr_piperzine", "fr_priamide", "fr_prisulfonamd", "fr_pyridine", "fr_quatN", "fr_sulfide", "fr_sulfonamd",
    "fr_sulfone", "fr_term_acetylene", "fr_tetrazole", "fr_thiazole", "fr_thiocyan", "fr_thiophene",
    "fr_unbrch_alkane", "fr_urea",
]
DESCRIPTOR_SIZE = len(DESCRIPTORS)
# molecule.model.descriptors -> the leading columns of DESCRIPTORS a model uses
DESCRIPTOR_SETS = {"rdkit": DESCRIPTOR_SIZE, "physical": len(PHYSICAL_DESCRIPTORS), "none": 0}

_FUNCTIONS = dict(Descriptors.descList)
_MISSING = [name for name in DESCRIPTORS if name not in _FUNCTIONS]
if _MISSING:
    raise ImportError(f"this RDKit lacks the descriptors {_MISSING}; install the RDKit of constraints.txt")
_FLOAT32_MAX = float(np.finfo(np.float32).max)
# RDKit's four E-state descriptors each compute the atoms' E-state indices again (O(atoms^2) in Python): once here
_FROM_ESTATE = {"MaxEStateIndex": np.max, "MinEStateIndex": np.min,
                "MaxAbsEStateIndex": lambda v: np.abs(v).max(), "MinAbsEStateIndex": lambda v: np.abs(v).min()}


def molecule_descriptors(mol: Chem.Mol) -> np.ndarray:
    """DESCRIPTORS of `mol` as float32 (DESCRIPTOR_SIZE,); a value RDKit cannot compute (NaN, inf, or an error, as
    the spacial score of a molecule without heavy atoms) becomes 0."""
    estate = np.asarray(EState.EStateIndices(mol))
    values = np.array([_FROM_ESTATE[name](estate) if name in _FROM_ESTATE and len(estate) else _value(name, mol)
                       for name in DESCRIPTORS], dtype=np.float64)
    values = np.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)
    return values.clip(-_FLOAT32_MAX, _FLOAT32_MAX).astype(np.float32)


def _value(name: str, mol: Chem.Mol) -> float:
    """RDKit's descriptor `name` of `mol`, NaN where RDKit fails on it."""
    try:
        return float(_FUNCTIONS[name](mol))
    except (ArithmeticError, ValueError, RuntimeError):
        return float("nan")
