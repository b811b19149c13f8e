"""What molecule stages hand each other on disk: prepared splits and the fine-tuned ensemble."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from data.molecules.featurize import ATOM_FEATURE_SIZES, BOND_FEATURE_SIZES, MolGraph, featurize_smiles
from data.molecules.prepare import PreparedMolecules, load_prepared
from flows.paths import MOLECULE
from flows.tasks import compute_task, io_task
from models.molecule.config import MoleculeModelConfig
from models.molecule.network import MoleculeNet


@io_task(name="load-prepared-molecules")
def load_molecules() -> PreparedMolecules:
    return load_prepared(MOLECULE.prepared)


@compute_task(name="featurize-molecules")
def featurize(smiles: list[str]) -> list[MolGraph]:
    """Graphs of already-cleaned SMILES (n,)."""
    return [featurize_smiles(s) for s in smiles]


def save_ensemble(path: Path, members: list[MoleculeNet], model_cfg: MoleculeModelConfig, task: str,
                  target_mean: float, target_std: float, histories: list[list[dict]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model_cfg.model_dump(), "task": task, "target_mean": target_mean, "target_std": target_std,
                "members": [m.state_dict() for m in members], "histories": histories}, path)


def load_ensemble(path: Path) -> tuple[list[MoleculeNet], dict]:
    """Members in eval mode and the raw checkpoint (task, target_mean, target_std, ...)."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    cfg = MoleculeModelConfig(**state["model"])
    members = []
    for weights in state["members"]:
        member = MoleculeNet(ATOM_FEATURE_SIZES, BOND_FEATURE_SIZES, cfg)
        member.load_state_dict(weights)
        members.append(member.eval())
    return members, state


def targets(prepared: PreparedMolecules, split: str) -> np.ndarray:
    return prepared.splits[split]["target"].to_numpy(dtype=np.float64)
