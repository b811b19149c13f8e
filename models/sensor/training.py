"""Pretraining and fine-tuning of the sensor model on featurised windows (n, 2C, T)."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.metrics import average_precision_score

from models.batching import index_batches
from models.config import FinetuneConfig, PretrainConfig
from models.sensor.config import SensorModelConfig
from models.sensor.network import MaskedReconstruction, SensorClassifier, SensorEncoder, random_spans
from models.training import TrainResult, train

MASK_SPAN = 4


def pretrain_encoder(
    features: np.ndarray, model_cfg: SensorModelConfig, cfg: PretrainConfig, device: torch.device
) -> tuple[SensorEncoder, TrainResult]:
    """Masked reconstruction on unlabelled windows. features: (n, 2C, T) -> trained encoder."""
    torch.manual_seed(cfg.seed)
    n_channels = features.shape[1] // 2
    encoder = SensorEncoder(features.shape[1], model_cfg)
    objective = MaskedReconstruction(encoder, n_channels, model_cfg.hidden)
    x_all = torch.from_numpy(features)
    generator = torch.Generator().manual_seed(cfg.seed)

    def batches(epoch: int):
        for idx in index_batches(len(x_all), cfg.batch_size, cfg.seed + epoch):
            hidden = random_spans(len(idx), x_all.shape[-1], cfg.mask_ratio, MASK_SPAN, generator)
            yield x_all[idx].to(device), hidden.to(device)

    result = train(
        objective, batches, lambda model, batch: model(*batch), None,
        epochs=cfg.epochs, lr=cfg.lr, device=device, desc="pretrain sensor",
    )
    return encoder.cpu(), result


@torch.no_grad()
def predict_logits(model: torch.nn.Module, features: np.ndarray, device: torch.device, batch_size: int = 1024) -> np.ndarray:
    """features (n, 2C, T) -> logits (n,), in eval mode."""
    model.eval().to(device)
    out = [
        model(torch.from_numpy(features[idx]).to(device)).float().cpu()
        for idx in index_batches(len(features), batch_size, None)
    ]
    return torch.cat(out).numpy() if out else np.empty(0, np.float32)


def finetune_member(
    train_x: np.ndarray,
    train_y: np.ndarray,
    val_x: np.ndarray,
    val_y: np.ndarray,
    model_cfg: SensorModelConfig,
    cfg: FinetuneConfig,
    encoder_state: dict | None,
    seed: int,
    device: torch.device,
) -> tuple[SensorClassifier, TrainResult]:
    """One ensemble member: binary cross entropy, early stopping on validation PR-AUC.

    train_x, val_x: (n, 2C, T) features; train_y, val_y: (n,) 0/1.
    """
    torch.manual_seed(seed)
    model = SensorClassifier(train_x.shape[1], model_cfg)
    if encoder_state is not None:
        model.encoder.load_state_dict(encoder_state)
    x_all, y_all = torch.from_numpy(train_x), torch.from_numpy(train_y.astype(np.float32))

    def batches(epoch: int):
        for idx in index_batches(len(y_all), cfg.batch_size, seed * 1000 + epoch):
            yield x_all[idx].to(device), y_all[idx].to(device)

    def loss_step(net, batch):
        x, y = batch
        return torch.nn.functional.binary_cross_entropy_with_logits(net(x).float(), y)

    def validate(net) -> float:
        return float(average_precision_score(val_y, predict_logits(net, val_x, device)))

    result = train(
        model, batches, loss_step, validate, epochs=cfg.epochs, lr=cfg.lr, weight_decay=cfg.weight_decay,
        patience=cfg.patience, device=device, desc=f"finetune sensor member (seed {seed})",
    )
    return model.cpu(), result
