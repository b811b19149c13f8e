"""A 2D drawing of a molecule as SVG, by RDKit."""

from __future__ import annotations

from rdkit import Chem
from rdkit.Chem.Draw import rdMolDraw2D

from serving.inputs import BadInput


def molecule_svg(smiles: str, width: int = 320, height: int = 240) -> str:
    mol = Chem.MolFromSmiles(smiles) if smiles.strip() else None
    if mol is None:
        raise BadInput(f"SMILES {smiles!r} does not parse")
    drawer = rdMolDraw2D.MolDraw2DSVG(width, height)
    rdMolDraw2D.PrepareAndDrawMolecule(drawer, mol)
    drawer.FinishDrawing()
    return drawer.GetDrawingText()
