"""RDKit parsing and standardisation of one SMILES (shared by training and serving; data/molecules/clean.py cleans a
whole frame).

Standardisation (the same for training and serving):
1. `rdMolStandardize.Cleanup`: remove explicit H, disconnect metals, normalise functional groups
   (e.g. charge-separated nitro), reionise;
2. `FragmentParent`: keep the largest fragment (drops salts and counter-ions);
3. `Uncharger`: neutralise acids/bases where a neutral form exists (quaternary N stays charged);
4. sanitise. Stereo is kept; the canonical SMILES is RDKit's isomeric canonical SMILES.
"""

from __future__ import annotations

from rdkit import Chem, rdBase
from rdkit.Chem.MolStandardize import rdMolStandardize

from data.errors import DataValidationError

# Scaffolds and the structural encodings grow about cubically with atoms: a larger molecule is refused before them.
MAX_HEAVY_ATOMS = 200


class InvalidSmilesError(DataValidationError):
    """A SMILES that is empty, does not parse, or cannot be standardised."""


class MoleculeTooLargeError(InvalidSmilesError):
    """A SMILES with more heavy atoms than the configured limit (refused before any expensive step)."""


def parse_smiles(smiles: str, max_heavy_atoms: int | None = MAX_HEAVY_ATOMS) -> Chem.Mol:
    """Parse one SMILES (surrounding whitespace ignored) into a sanitised Mol; RDKit's own log stays quiet.

    More than `max_heavy_atoms` heavy atoms (None: no limit) raises MoleculeTooLargeError, counted before sanitising."""
    text = smiles.strip() if isinstance(smiles, str) else ""
    if not text:
        raise InvalidSmilesError(f"empty SMILES ({smiles!r})")
    with rdBase.BlockLogs():
        if max_heavy_atoms is not None:
            raw = Chem.MolFromSmiles(text, sanitize=False)
            heavy = 0 if raw is None else sum(atom.GetAtomicNum() > 1 for atom in raw.GetAtoms())
            if heavy > max_heavy_atoms:
                raise MoleculeTooLargeError(f"SMILES {_short(text)} has {heavy} heavy atoms; at most {max_heavy_atoms}")
        mol = Chem.MolFromSmiles(text)
        if mol is None:
            raise InvalidSmilesError(f"could not parse SMILES {text!r}: {_why_unparseable(text)}")
    if mol.GetNumAtoms() == 0:
        raise InvalidSmilesError(f"SMILES {text!r} has no atoms")
    return mol


def _short(text: str, keep: int = 40) -> str:
    """The SMILES quoted, cut to `keep` characters for messages."""
    return repr(text) if len(text) <= keep else repr(text[:keep]) + f"... ({len(text)} characters)"


def _why_unparseable(text: str) -> str:
    """RDKit's reason a SMILES fails: bad syntax, or the chemistry problems (valence, kekulisation)."""
    raw = Chem.MolFromSmiles(text, sanitize=False)
    if raw is None:
        return "invalid SMILES syntax"
    problems = [p.Message() for p in Chem.DetectChemistryProblems(raw)]
    return "; ".join(problems) if problems else "RDKit cannot sanitise it"


def standardize_mol(mol: Chem.Mol) -> Chem.Mol:
    """Cleanup, keep the largest fragment, uncharge, sanitise (see module docstring); returns a new Mol."""
    try:
        with rdBase.BlockLogs():
            out = rdMolStandardize.Cleanup(mol)
            out = rdMolStandardize.FragmentParent(out)
            out = rdMolStandardize.Uncharger().uncharge(out)
            Chem.SanitizeMol(out)
    except Exception as exc:  # RDKit raises assorted types; report them as bad input
        raise InvalidSmilesError(f"could not standardise {Chem.MolToSmiles(mol)!r}: {exc}") from exc
    return out


def canonical_smiles(smiles: str, max_heavy_atoms: int | None = MAX_HEAVY_ATOMS) -> str:
    """Standardised, isomeric canonical SMILES of `smiles`; raises InvalidSmilesError (MoleculeTooLargeError above
    `max_heavy_atoms`)."""
    return Chem.MolToSmiles(standardize_mol(parse_smiles(smiles, max_heavy_atoms)))
