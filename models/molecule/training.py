"""Pretraining and fine-tuning of the molecule model on featurised molecules (data/molecules/featurize.py).

A molecule is a MolGraph plus the token ids of its canonical SMILES (None: over-long, graph view only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

from data.molecules.encodings import random_sign_flip
from data.molecules.featurize import (ATOM_FEATURE_SIZES, BOND_FEATURE_SIZES, MODEL_INPUTS, MolGraph, batch_inputs,
                                      encode_tokens, featurize_smiles, one_blas_thread)
from data.molecules.standardize import MAX_HEAVY_ATOMS
from data.molecules.tokenizer import CLS_ID, PAD_ID, SEP_ID, SmilesTokenizer
from models.batching import index_batches
from models import mc_dropout
from models.mc_dropout import sample_dropout
from models.molecule.config import MoleculeFinetuneConfig, MoleculeModelConfig, MoleculePretrainConfig
from models.molecule.network import MoleculeNet, MoleculePretrainer
from models.training import TrainingHooks, TrainingSettings, TrainResult, train


@dataclass
class Molecules:
    """Featurised molecules: graphs (n,) and their SMILES token ids (n,), None where there is no SMILES view."""

    graphs: list[MolGraph]
    tokens: list[np.ndarray | None]

    @classmethod
    def from_smiles(cls, smiles: list[str], tokenizer: SmilesTokenizer, max_heavy_atoms: int | None = MAX_HEAVY_ATOMS) -> Molecules:
        """Featurise already-cleaned SMILES (n,) with the shared featurisation and `tokenizer` (MoleculeTooLargeError
        above `max_heavy_atoms`)."""
        with one_blas_thread():
            graphs = [featurize_smiles(s, max_heavy_atoms) for s in smiles]
        return cls(graphs, encode_tokens(graphs, tokenizer))

    def __len__(self) -> int:
        return len(self.graphs)

    def subset(self, idx) -> Molecules:
        return Molecules([self.graphs[i] for i in idx], [self.tokens[i] for i in idx])


@dataclass(frozen=True)
class MoleculeBatch:
    """One fine-tuning batch of B molecules, on the training device: `inputs`, MoleculeNet's tensors in MODEL_INPUTS
    order (the batch's graphs, SMILES tokens and descriptors: data/molecules/featurize.batch_inputs), and `y` (B,)
    float32 targets (standardised values, or 0/1)."""

    inputs: list[torch.Tensor]
    y: torch.Tensor


@dataclass(frozen=True)
class MoleculePretrainBatch:
    """One pretraining batch of B molecules with N atoms, on the training device: `inputs` as MoleculeBatch's,
    hidden_atoms (N,) and hidden_tokens (B, T) bool the masked atoms and tokens."""

    inputs: list[torch.Tensor]
    hidden_atoms: torch.Tensor
    hidden_tokens: torch.Tensor


def bucketed_batches(molecules: Molecules, batch_size: int, seed: int, bucket: int = 8):
    """Shuffled index batches (like models.batching.index_batches) whose members have similar SMILES lengths:
    a seeded permutation cut into chunks of `bucket` batches, each chunk sorted by token count and cut into
    batches, the batches then shuffled. Less padding for the attention layers; every molecule once per epoch."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(molecules))
    lengths = np.array([0 if t is None else len(t) for t in molecules.tokens])
    batches = []
    for start in range(0, len(order), batch_size * bucket):
        chunk = order[start : start + batch_size * bucket]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    for i in rng.permutation(len(batches)):
        yield batches[i]


def single_thread_on_cpu(device: torch.device) -> None:
    """One intra-op thread on the CPU: these small kernels gain little from more, and lose a lot (10x measured on
    2 cores) when other processes compete for the cores."""
    if device.type == "cpu":
        torch.set_num_threads(1)


def build_model(vocab_size: int, max_length: int, cfg: MoleculeModelConfig) -> MoleculeNet:
    return MoleculeNet(ATOM_FEATURE_SIZES, BOND_FEATURE_SIZES, vocab_size, max_length, cfg)


def model_arrays(molecules: Molecules, rng: np.random.Generator | None = None, sign_flip: bool = False,
                 modality_dropout: float = 0.0, descriptor_dropout: float = 0.0) -> dict[str, np.ndarray]:
    """MODEL_INPUTS arrays of a batch; with `rng`, training augmentation: random Laplacian signs and, per molecule,
    hiding the graph or the SMILES view (never both) with probability `modality_dropout` each; a hidden graph takes
    its descriptors with it with probability `descriptor_dropout` (unknown, as for a molecule RDKit cannot
    sanitise), which trains the service's SMILES-only answer without descriptors."""
    tokens = list(molecules.tokens)
    hide_graph = np.zeros(len(molecules), dtype=bool)
    if rng is not None and modality_dropout > 0:
        draw = rng.random(len(molecules))
        hide_graph = draw < modality_dropout
        hide_smiles = (draw >= modality_dropout) & (draw < 2 * modality_dropout)
        tokens = [None if hide else t for t, hide in zip(tokens, hide_smiles)]
        hide_graph &= np.array([t is not None for t in tokens])  # keep at least one view
    arrays = batch_inputs(molecules.graphs, tokens)
    arrays["graph_mask"][hide_graph] = 0.0
    if rng is not None and modality_dropout > 0 and descriptor_dropout > 0:
        arrays["descriptors"][hide_graph & (rng.random(len(molecules)) < descriptor_dropout)] = np.nan
    if rng is not None and sign_flip:
        arrays["positional"] = random_sign_flip(arrays["positional"], arrays["batch"], len(molecules), rng)
    return arrays


def tensors(arrays: dict[str, np.ndarray], device: torch.device) -> list[torch.Tensor]:
    return [torch.from_numpy(arrays[name]).to(device) for name in MODEL_INPUTS]


def pretrain_model(molecules: Molecules, vocab_size: int, max_length: int, model_cfg: MoleculeModelConfig,
                   cfg: MoleculePretrainConfig, device: torch.device) -> tuple[MoleculeNet, TrainResult]:
    """Masked atoms + masked tokens + InfoNCE alignment of the graph and SMILES views (MoleculePretrainer).
    Returns the model whose graph and SMILES encoders are pretrained (cross-attention, gate and head are not)."""
    single_thread_on_cpu(device)
    torch.manual_seed(cfg.seed)
    model = build_model(vocab_size, max_length, model_cfg)
    objective = MoleculePretrainer(model, ATOM_FEATURE_SIZES, vocab_size, model_cfg.hidden,
                                   cfg.contrastive_weight, cfg.temperature)
    rng = np.random.default_rng(cfg.seed)
    with_tokens = molecules.subset([i for i, t in enumerate(molecules.tokens) if t is not None])
    if not len(with_tokens):
        raise ValueError("pretraining needs molecules whose SMILES fit the tokenizer")

    def batches(epoch: int) -> Iterator[MoleculePretrainBatch]:
        for idx in bucketed_batches(with_tokens, cfg.batch_size, cfg.seed + epoch):
            arrays = model_arrays(with_tokens.subset(idx), rng, sign_flip=cfg.sign_flip)
            n_atoms, tokens = len(arrays["batch"]), arrays["tokens"]
            hidden_atoms = rng.random(n_atoms) < cfg.mask_ratio
            hidden_atoms[rng.integers(n_atoms)] = True
            maskable = (tokens != PAD_ID) & (tokens != CLS_ID) & (tokens != SEP_ID)
            hidden_tokens = maskable & (rng.random(tokens.shape) < cfg.token_mask_ratio)
            rows, cols = np.nonzero(maskable)
            pick = rng.integers(len(rows))
            hidden_tokens[rows[pick], cols[pick]] = True
            yield MoleculePretrainBatch(tensors(arrays, device), torch.from_numpy(hidden_atoms).to(device),
                                        torch.from_numpy(hidden_tokens).to(device))

    def step(net, batch: MoleculePretrainBatch) -> torch.Tensor:
        total, parts = net(*batch.inputs, batch.hidden_atoms, batch.hidden_tokens)
        return total

    result = train(objective, batches, step, None,
                   TrainingSettings(epochs=cfg.epochs, lr=cfg.lr, desc="pretrain molecule"), device=device)
    return model.cpu(), result


@torch.no_grad()
def predict_raw(model: MoleculeNet, molecules: Molecules, device: torch.device, batch_size: int = 256,
                dropout: bool = False) -> np.ndarray:
    """Raw outputs (n,): standardised values or logits, in eval mode (`dropout`: with dropout sampled, one
    MC-dropout pass)."""
    (sample_dropout(model) if dropout else model.eval()).to(device)
    order = np.argsort([0 if t is None else len(t) for t in molecules.tokens], kind="stable")  # less padding
    out = np.empty(len(molecules), dtype=np.float32)
    for idx in index_batches(len(molecules), batch_size, None):
        rows = order[idx]
        out[rows] = model(*tensors(model_arrays(molecules.subset(rows)), device)).float().cpu().numpy()
    return out


def fixed_mask_members(members: list[MoleculeNet], passes: int, seed: int, probe: Molecules) -> list[torch.nn.Module]:
    """Each member with `passes` fixed dropout masks (models/mc_dropout.py), member i's drawn with seed * 1000 + i,
    so that calibration, export and the benchmark build the same sub-networks; `probe` shows the feature sizes."""
    cpu = torch.device("cpu")
    return mc_dropout.fixed_mask_members(members, passes, seed, lambda copy: predict_raw(copy, probe, cpu))


def ensemble_raw(members: list[MoleculeNet], molecules: Molecules, device: torch.device, mask_passes: int = 0,
                 mask_seed: int = 0) -> np.ndarray:
    """Raw outputs (n, members), or (n, members * mask_passes) with fixed-mask passes, member by member (the order
    of the exported graph)."""
    first = range(min(8, len(molecules)))  # the probe that shows fixed_mask_members the feature sizes
    return mc_dropout.ensemble_outputs(members, mask_passes, lambda m: predict_raw(m, molecules, device),
                                       lambda: fixed_mask_members(members, mask_passes, mask_seed, molecules.subset(first)))


def focal_loss(logits: torch.Tensor, y: torch.Tensor, gamma: float) -> torch.Tensor:
    """Binary focal loss: BCE weighted by (1 - p_true) ** gamma (gamma 0: BCE)."""
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="none")
    p_true = torch.exp(-bce)
    return ((1 - p_true) ** gamma * bce).mean()


def loss_function(task: str, cfg: MoleculeFinetuneConfig):
    """(raw outputs, targets) -> scalar loss per `cfg` (regression: mse|huber, classification: bce|focal)."""
    F = torch.nn.functional
    if task == "regression":
        if cfg.regression_loss == "huber":
            return lambda out, y: F.huber_loss(out, y, delta=cfg.huber_delta)
        return F.mse_loss
    if cfg.classification_loss == "focal":
        return lambda out, y: focal_loss(out, y, cfg.focal_gamma)
    return F.binary_cross_entropy_with_logits


def finetune_member(
    train_data: Molecules,
    train_y: np.ndarray,
    val_data: Molecules,
    val_y: np.ndarray,
    task: str,
    model_cfg: MoleculeModelConfig,
    cfg: MoleculeFinetuneConfig,
    pretrained_state: dict | None,
    vocab_size: int,
    max_length: int,
    seed: int,
    device: torch.device,
    on_epoch: Callable[[int, float], None] | None = None,
) -> tuple[MoleculeNet, TrainResult]:
    """One member. Regression on standardised targets (y given standardised), early stopping on validation -RMSE.
    Classification: early stopping on validation ROC-AUC. `pretrained_state`: a pretrained MoleculeNet state_dict.
    on_epoch: (epoch, that validation score) after each epoch (models/training.train)."""
    single_thread_on_cpu(device)
    torch.manual_seed(seed)
    model = build_model(vocab_size, max_length, model_cfg)
    if pretrained_state is not None:
        model.load_state_dict(pretrained_state)
    model.fit_descriptor_scaling(np.stack([g.descriptors for g in train_data.graphs]))
    targets = torch.from_numpy(np.asarray(train_y, dtype=np.float32))
    loss_fn = loss_function(task, cfg)
    rng = np.random.default_rng(seed)
    dropout = cfg.modality_dropout if model_cfg.modalities == "fused" else 0.0

    def batches(epoch: int) -> Iterator[MoleculeBatch]:
        for idx in bucketed_batches(train_data, cfg.batch_size, seed * 1000 + epoch):
            arrays = model_arrays(train_data.subset(idx), rng, cfg.sign_flip, dropout, cfg.descriptor_dropout)
            yield MoleculeBatch(tensors(arrays, device), targets[idx].to(device))

    def validate(net) -> float:
        raw = predict_raw(net, val_data, device)
        if task == "regression":
            return -float(np.sqrt(np.mean((raw - val_y) ** 2)))
        return float(roc_auc_score(val_y, raw))

    result = train(model, batches, lambda net, batch: loss_fn(net(*batch.inputs).float(), batch.y), validate,
                   TrainingSettings.from_finetune(cfg, f"finetune molecule member (seed {seed})"), device=device,
                   hooks=TrainingHooks(on_epoch=on_epoch))
    return model.cpu(), result
