"""What molecule stages hand each other on disk besides the prepared splits (flows/molecule/splits.py): the
pretrained model and the fine-tuned ensemble (.pt files of tensors and plain data only: models/serialization.py)."""

from __future__ import annotations

from pathlib import Path

from data.molecules.tokenizer import SmilesTokenizer
from flows.tasks import compute_task
from models.molecule.config import MoleculeModelConfig
from models.molecule.network import MoleculeNet
from models.molecule.training import Molecules, build_model
from models.serialization import load_state, save_state


@compute_task(name="featurize-molecules")
def featurize(smiles: list[str], tokenizer: SmilesTokenizer, max_heavy_atoms: int) -> Molecules:
    """Graphs and SMILES tokens of already-cleaned SMILES (n,); `molecule.data.max_heavy_atoms` as in prepare."""
    return Molecules.from_smiles(smiles, tokenizer, max_heavy_atoms)


def load_pretrained(path: Path) -> dict:
    """The pretraining stage's output: weights under "state" (None: pretraining was disabled), "model", "tokenizer"."""
    return load_state(path, "re-create it with `dvc repro molecule_pretrain`")


def save_ensemble(path: Path, members: list[MoleculeNet], model_cfg: MoleculeModelConfig, task: str,
                  target_mean: float, target_std: float, histories: list[list[dict]], tokenizer: SmilesTokenizer) -> None:
    save_state({"model": model_cfg.model_dump(), "task": task, "target_mean": target_mean, "target_std": target_std,
                "tokenizer": tokenizer.to_dict(), "members": [m.state_dict() for m in members],
                "histories": histories}, path)


def load_ensemble(path: Path) -> tuple[list[MoleculeNet], dict]:
    """Members in eval mode and the raw checkpoint (task, target_mean, target_std, tokenizer, ...)."""
    state = load_state(path, "re-create it with `dvc repro molecule_finetune`")
    cfg = MoleculeModelConfig(**state["model"])
    tokenizer = SmilesTokenizer.from_dict(state["tokenizer"])
    members = []
    for weights in state["members"]:
        member = build_model(len(tokenizer), tokenizer.max_length, cfg)
        member.load_state_dict(weights)
        members.append(member.eval())
    return members, state
