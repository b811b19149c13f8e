"""Pretraining and fine-tuning of the molecule model on featurised graphs (data/molecules/featurize.py)."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

from data.molecules.featurize import ATOM_FEATURE_SIZES, BOND_FEATURE_SIZES, MolGraph, batch_graphs
from models.batching import index_batches
from models.config import FinetuneConfig, PretrainConfig
from models.molecule.config import MoleculeModelConfig
from models.molecule.network import MaskedAtomPrediction, MoleculeEncoder, MoleculeNet
from models.training import TrainResult, train

GRAPH_INPUTS = ["atom_features", "edge_index", "bond_features", "batch", "graph_mask"]


def graph_tensors(graphs: list[MolGraph], device: torch.device) -> list[torch.Tensor]:
    """Disjoint-union batch of `graphs` as tensors, in GRAPH_INPUTS order."""
    arrays = batch_graphs(graphs)
    return [torch.from_numpy(arrays[name]).to(device) for name in GRAPH_INPUTS]


def pretrain_encoder(
    graphs: list[MolGraph], model_cfg: MoleculeModelConfig, cfg: PretrainConfig, device: torch.device
) -> tuple[MoleculeEncoder, TrainResult]:
    """Masked atom (element) prediction on unlabelled molecules."""
    torch.manual_seed(cfg.seed)
    encoder = MoleculeEncoder(ATOM_FEATURE_SIZES, BOND_FEATURE_SIZES, model_cfg)
    objective = MaskedAtomPrediction(encoder, ATOM_FEATURE_SIZES[0], model_cfg.hidden)
    generator = torch.Generator().manual_seed(cfg.seed)

    def batches(epoch: int):
        for idx in index_batches(len(graphs), cfg.batch_size, cfg.seed + epoch):
            atoms, edges, bonds, _, _ = graph_tensors([graphs[i] for i in idx], device)
            hidden = torch.rand(len(atoms), generator=generator) < cfg.mask_ratio
            hidden[torch.randint(len(atoms), (1,), generator=generator)] = True
            yield atoms, edges, bonds, hidden.to(device)

    result = train(objective, batches, lambda model, batch: model(*batch), None,
                   epochs=cfg.epochs, lr=cfg.lr, device=device, desc="pretrain molecule")
    return encoder.cpu(), result


@torch.no_grad()
def predict_raw(model: MoleculeNet, graphs: list[MolGraph], device: torch.device, batch_size: int = 256) -> np.ndarray:
    """Raw outputs (n,): standardised values or logits, in eval mode."""
    model.eval().to(device)
    out = [model(*graph_tensors([graphs[i] for i in idx], device)).float().cpu()
           for idx in index_batches(len(graphs), batch_size, None)]
    return torch.cat(out).numpy()


def finetune_member(
    train_graphs: list[MolGraph],
    train_y: np.ndarray,
    val_graphs: list[MolGraph],
    val_y: np.ndarray,
    task: str,
    model_cfg: MoleculeModelConfig,
    cfg: FinetuneConfig,
    encoder_state: dict | None,
    seed: int,
    device: torch.device,
) -> tuple[MoleculeNet, TrainResult]:
    """One member. Regression: MSE on standardised targets (y given standardised), early stopping on
    validation -RMSE. Classification: BCE, early stopping on validation ROC-AUC."""
    torch.manual_seed(seed)
    model = MoleculeNet(ATOM_FEATURE_SIZES, BOND_FEATURE_SIZES, model_cfg)
    if encoder_state is not None:
        model.encoder.load_state_dict(encoder_state)
    targets = torch.from_numpy(np.asarray(train_y, dtype=np.float32))
    loss_fn = torch.nn.functional.mse_loss if task == "regression" else torch.nn.functional.binary_cross_entropy_with_logits

    def batches(epoch: int):
        for idx in index_batches(len(train_graphs), cfg.batch_size, seed * 1000 + epoch):
            yield graph_tensors([train_graphs[i] for i in idx], device), targets[idx].to(device)

    def validate(net) -> float:
        raw = predict_raw(net, val_graphs, device)
        if task == "regression":
            return -float(np.sqrt(np.mean((raw - val_y) ** 2)))
        return float(roc_auc_score(val_y, raw))

    result = train(model, batches, lambda net, batch: loss_fn(net(*batch[0]).float(), batch[1]), validate,
                   epochs=cfg.epochs, lr=cfg.lr, weight_decay=cfg.weight_decay, patience=cfg.patience,
                   device=device, desc=f"finetune molecule member (seed {seed})")
    return model.cpu(), result
