"""What molecule stages hand each other on disk: prepared splits, the tokenizer and the fine-tuned ensemble."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from data.errors import DataValidationError
from data.molecules.prepare import PreparedMolecules, load_prepared
from data.molecules.tokenizer import SmilesTokenizer
from flows.paths import MOLECULE
from flows.tasks import compute_task, io_task
from models.molecule.config import MoleculeModelConfig
from models.molecule.network import MoleculeNet
from models.molecule.training import Molecules, build_model


@io_task(name="load-prepared-molecules")
def load_molecules() -> PreparedMolecules:
    return load_prepared(MOLECULE.prepared)


def tokenizer_of(prepared: PreparedMolecules) -> SmilesTokenizer:
    if prepared.tokenizer is None:
        raise DataValidationError("no tokenizer.json among the prepared molecules (run the molecule prepare step)",
                                  file=MOLECULE.prepared)
    return SmilesTokenizer.from_dict(prepared.tokenizer)


@compute_task(name="featurize-molecules")
def featurize(smiles: list[str], tokenizer: SmilesTokenizer, max_heavy_atoms: int) -> Molecules:
    """Graphs and SMILES tokens of already-cleaned SMILES (n,); `molecule.data.max_heavy_atoms` as in prepare."""
    return Molecules.from_smiles(smiles, tokenizer, max_heavy_atoms)


def save_ensemble(path: Path, members: list[MoleculeNet], model_cfg: MoleculeModelConfig, task: str,
                  target_mean: float, target_std: float, histories: list[list[dict]], tokenizer: SmilesTokenizer) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model_cfg.model_dump(), "task": task, "target_mean": target_mean, "target_std": target_std,
                "tokenizer": tokenizer.to_dict(), "members": [m.state_dict() for m in members],
                "histories": histories}, path)


def load_ensemble(path: Path) -> tuple[list[MoleculeNet], dict]:
    """Members in eval mode and the raw checkpoint (task, target_mean, target_std, tokenizer, ...)."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    cfg = MoleculeModelConfig(**state["model"])
    tokenizer = SmilesTokenizer.from_dict(state["tokenizer"])
    members = []
    for weights in state["members"]:
        member = build_model(len(tokenizer), tokenizer.max_length, cfg)
        member.load_state_dict(weights)
        members.append(member.eval())
    return members, state


def targets(prepared: PreparedMolecules, split: str) -> np.ndarray:
    return prepared.splits[split]["target"].to_numpy(dtype=np.float64)
