"""Pretraining and fine-tuning of the sensor model on featurised windows (n, 2C, T).

Pretraining (train + validation windows, never test): masked reconstruction of hidden spans plus
SimCLR NT-Xent between two augmented views (data/sensors/augment.py). Fine-tuning: a configurable
robust loss (models/losses.py), a sampling (models/sensor/sampling.py), time-series mixup,
a small-loss curriculum, optionally a mean teacher with pseudo-labels on unlabelled windows
(models/sensor/teacher.py), early stopping on validation PR-AUC and a checkpoint every epoch.
Every random choice of an epoch is seeded from (seed, epoch), so a resumed run repeats it exactly.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from sklearn.metrics import average_precision_score
from torch import nn

from data.sensors.augment import augment
from models.batching import index_batches
from models import mc_dropout
from models.mc_dropout import mc_dropout_passes, sample_dropout
from models.distributed import DistributedContext
from models.losses import make_loss, reduce_loss
from models.sensor.config import SensorFinetuneConfig, SensorModelConfig, SensorPretrainConfig
from models.sensor.sampling import SAMPLINGS
from models.sensor.network import ContrastiveModel, MaskedReconstruction, SensorClassifier, SensorEncoder, random_spans
from models.sensor.teacher import MeanTeacher, ramp_up
from models.schedules import lr_factor
from models.training import TrainResult, train

MASK_SPAN = 4


class PretrainObjective(nn.Module):
    """reconstruction_weight * masked reconstruction + contrastive_weight * NT-Xent, one shared encoder."""

    def __init__(self, encoder: SensorEncoder, n_channels: int, model_cfg: SensorModelConfig, cfg: SensorPretrainConfig):
        super().__init__()
        self.encoder = encoder
        self.reconstruction = MaskedReconstruction(encoder, n_channels, model_cfg.hidden)
        self.contrastive = ContrastiveModel(encoder, model_cfg, cfg.temperature)
        self.weights = (cfg.reconstruction_weight, cfg.contrastive_weight)

    def forward(self, x, hidden, view_a, view_b) -> torch.Tensor:
        loss = x.new_zeros(())
        if self.weights[0]:
            loss = loss + self.weights[0] * self.reconstruction(x, hidden)
        if self.weights[1] and len(x) > 1:
            loss = loss + self.weights[1] * self.contrastive(view_a, view_b)
        return loss


def pretrain_encoder(
    features: np.ndarray, model_cfg: SensorModelConfig, cfg: SensorPretrainConfig, device: torch.device
) -> tuple[SensorEncoder, nn.Conv1d, TrainResult]:
    """Self-supervised pretraining on unlabelled windows. features: (n, 2C, T) -> the trained encoder and the
    masked-reconstruction decoder ((B, H, T) -> (B, C, T), the novelty score's: models/sensor/novelty.py)."""
    torch.manual_seed(cfg.seed)
    n_channels = features.shape[1] // 2
    encoder = SensorEncoder(features.shape[1], model_cfg)
    objective = PretrainObjective(encoder, n_channels, model_cfg, cfg)
    contrastive = cfg.contrastive_weight > 0

    def batches(epoch: int):
        rng = np.random.default_rng([cfg.seed, epoch])
        generator = torch.Generator().manual_seed(cfg.seed * 100_003 + epoch)
        for idx in index_batches(len(features), cfg.batch_size, cfg.seed + epoch):
            x = features[idx]
            hidden = random_spans(len(idx), x.shape[-1], cfg.mask_ratio, MASK_SPAN, generator)
            views = [augment(x, rng, cfg.augmentations, cfg.augment_probability) if contrastive else x for _ in range(2)]
            yield tuple(torch.from_numpy(a).to(device) if isinstance(a, np.ndarray) else a.to(device)
                        for a in (x, hidden, *views))

    result = train(
        objective, batches, lambda model, batch: model(*batch), None,
        epochs=cfg.epochs, lr=cfg.lr, device=device, desc="pretrain sensor",
    )
    return encoder.cpu(), objective.reconstruction.decoder.cpu(), result


@torch.no_grad()
def predict_logits(model: torch.nn.Module, features: np.ndarray, device: torch.device, batch_size: int = 1024,
                   dropout: bool = False) -> np.ndarray:
    """features (n, 2C, T) -> logits (n,), in eval mode (`dropout`: with dropout sampled, one MC-dropout pass)."""
    (sample_dropout(model) if dropout else model.eval()).to(device)
    out = [
        model(torch.from_numpy(features[idx]).to(device)).float().cpu()
        for idx in index_batches(len(features), batch_size, None)
    ]
    return torch.cat(out).numpy() if out else np.empty(0, np.float32)


def fixed_mask_members(members: list[torch.nn.Module], passes: int, seed: int,
                       probe: np.ndarray) -> list[torch.nn.Module]:
    """Each member with `passes` fixed dropout masks over its channels and features (models/mc_dropout.py), member i's
    drawn with seed * 1000 + i, so that calibration, novelty, export and the benchmark build the same sub-networks;
    `probe` (k, 2C, T) features show the sizes."""
    cpu = torch.device("cpu")
    return mc_dropout.fixed_mask_members(members, passes, seed, lambda copy: predict_logits(copy, probe, cpu))


def ensemble_logits(members: list[torch.nn.Module], features: np.ndarray, device: torch.device, mask_passes: int = 0,
                    mask_seed: int = 0) -> np.ndarray:
    """features (n, 2C, T) -> logits (n, members), or (n, members * mask_passes) with fixed-mask passes, member by
    member (the order of the exported graph)."""
    return mc_dropout.ensemble_outputs(members, mask_passes, lambda m: predict_logits(m, features, device),
                                       lambda: fixed_mask_members(members, mask_passes, mask_seed, features[:8]))


def mc_dropout_spread(model: torch.nn.Module, features: np.ndarray, device: torch.device, passes: int,
                      seed: int) -> np.ndarray:
    """(n,) standard deviation of the failure probability over `passes` MC-dropout passes of `model` (seeded; the
    caller's torch RNG is left as it was)."""
    logits = mc_dropout_passes(lambda: predict_logits(model, features, device, dropout=True), passes, seed)
    return np.std(1 / (1 + np.exp(-logits)), axis=0)


def mixup(x: np.ndarray, y: np.ndarray, w: np.ndarray, alpha: float, rng: np.random.Generator):
    """Time-series mixup: each window mixed with a random partner of the batch, lambda ~ Beta(alpha, alpha),
    values, masks, labels and weights alike. Returns (x, y, w) of the same shapes."""
    lam = rng.beta(alpha, alpha, len(x)).astype(np.float32)
    partner = rng.permutation(len(x))
    mix = lambda a: lam.reshape(-1, *[1] * (a.ndim - 1)) * a + (1 - lam.reshape(-1, *[1] * (a.ndim - 1))) * a[partner]  # noqa: E731
    return mix(x), mix(y), mix(w)


def small_loss_rate(cfg: SensorFinetuneConfig, epoch: int) -> float:
    """Share of largest losses dropped at `epoch`: a linear ramp to small_loss_drop over small_loss_warmup epochs."""
    if cfg.small_loss_drop == 0:
        return 0.0
    return cfg.small_loss_drop * min(1.0, epoch / cfg.small_loss_warmup) if cfg.small_loss_warmup else cfg.small_loss_drop


def _fingerprint(*parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.tobytes() if isinstance(part, np.ndarray) else repr(part).encode())
    return h.hexdigest()


def finetune_member(
    train_x: np.ndarray,
    train_y: np.ndarray,
    val_x: np.ndarray,
    val_y: np.ndarray,
    model_cfg: SensorModelConfig,
    cfg: SensorFinetuneConfig,
    encoder_state: dict | None,
    seed: int,
    device: torch.device,
    checkpoint: str | Path | None = None,
    distributed: DistributedContext | None = None,
    make_encoder: Callable[[int], nn.Module] | None = None,
    on_epoch: Callable[[int, float], None] | None = None,
    unlabelled_x: np.ndarray | None = None,
) -> tuple[SensorClassifier, TrainResult]:
    """One ensemble member: the configured loss, sampling, mixup and curriculum; early stopping on
    validation PR-AUC; a checkpoint every epoch at `checkpoint` (resumed when it matches).

    train_x, val_x: (n, 2C, T) features; train_y, val_y: (n,) 0/1; unlabelled_x: (m, 2C, T) windows without a
    label, used by the mean teacher (cfg.mean_teacher.enabled) only.
    distributed: data-parallel in a torchrun process group (models/training.train), on its device.
    make_encoder: in_channels -> an encoder in the place of SensorEncoder (SensorClassifier's `encoder`), built
    after seeding; `encoder_state` must then be None.
    on_epoch: (epoch, validation PR-AUC) after each epoch (models/training.train).
    """
    if distributed is not None:
        device = distributed.device()
    torch.manual_seed(seed)
    if make_encoder is not None and encoder_state is not None:
        raise ValueError("a pretrained encoder state is SensorEncoder's: it does not load into another encoder")
    encoder = None if make_encoder is None else make_encoder(train_x.shape[1])
    model = SensorClassifier(train_x.shape[1], model_cfg, encoder).fit_statistics(train_x)
    if encoder_state is not None:
        model.encoder.load_state_dict(encoder_state)
    train_y = np.asarray(train_y, dtype=np.float32)
    loss_fn = make_loss(cfg.loss.terms, focal_gamma=cfg.loss.focal_gamma, focal_alpha=cfg.loss.focal_alpha,
                        gce_q=cfg.loss.gce_q, sce_alpha=cfg.loss.sce_alpha, sce_beta=cfg.loss.sce_beta)
    teacher_cfg = cfg.mean_teacher
    unlabelled_x = np.empty((0, *train_x.shape[1:]), np.float32) if unlabelled_x is None else unlabelled_x
    tensor = lambda a: torch.from_numpy(a).to(device)  # noqa: E731

    def uncertainty(epoch: int) -> np.ndarray:
        """MC-dropout spread of the member being trained, on its training windows; back to training mode after."""
        spread = mc_dropout_spread(model, train_x, device, cfg.uncertainty_passes, seed * 100_003 + epoch)
        trained.train()
        return spread

    def batches(epoch: int):
        rng = np.random.default_rng([seed, epoch])
        order, weights = SAMPLINGS[cfg.sampling](train_y, rng, (lambda: uncertainty(epoch)) if epoch else None)
        drop = small_loss_rate(cfg, epoch)
        unlabelled_order = rng.permutation(len(unlabelled_x)) if teacher_cfg.enabled else None
        for batch, start in enumerate(range(0, len(order), cfg.batch_size)):
            idx = order[start:start + cfg.batch_size]
            x, y, w = train_x[idx], train_y[idx], weights[idx]
            if cfg.mixup_alpha > 0:
                x, y, w = mixup(x, y, w, cfg.mixup_alpha, rng)
            if not teacher_cfg.enabled:
                yield tensor(x), tensor(y), tensor(w), drop
                continue
            size = min(teacher_cfg.unlabelled_batch_size, len(unlabelled_order))
            x_u = unlabelled_x[np.take(unlabelled_order, np.arange(batch * size, (batch + 1) * size), mode="wrap")]
            views = [augment(a, rng, teacher_cfg.augmentations, teacher_cfg.augment_probability) for a in (x, x_u)]
            yield (tensor(x), tensor(views[0]), tensor(y), tensor(w), drop, tensor(x_u), tensor(views[1]),
                   ramp_up(epoch, teacher_cfg.ramp_epochs))

    trained, member, after_step = model, model, None
    if teacher_cfg.enabled:
        trained = MeanTeacher(model, teacher_cfg, loss_fn)
        member, after_step = trained.teacher.module, trained.update_teacher

    def loss_step(net, batch):
        if teacher_cfg.enabled:
            return net(*batch)
        x, y, w, drop = batch
        return reduce_loss(loss_fn(net(x).float(), y), w, drop)

    def validate(_) -> float:
        return float(average_precision_score(val_y, predict_logits(member, val_x, device)))

    key = None
    if checkpoint is not None:
        encoder_sum = None if encoder_state is None else float(sum(v.double().sum() for v in encoder_state.values()))
        key = _fingerprint(model_cfg.model_dump_json(), cfg.model_dump_json(), seed, encoder_sum,
                           np.ascontiguousarray(train_x), train_y, np.ascontiguousarray(val_x), np.asarray(val_y),
                           np.ascontiguousarray(unlabelled_x) if teacher_cfg.enabled else None)
    result = train(
        trained, batches, loss_step, validate, epochs=cfg.epochs, lr=cfg.lr, weight_decay=cfg.weight_decay,
        patience=cfg.patience, device=device, desc=f"finetune sensor member (seed {seed})",
        checkpoint=checkpoint if cfg.checkpoint else None, checkpoint_key=key or "", distributed=distributed,
        lr_schedule=lambda epoch: lr_factor(cfg.lr_schedule, epoch, cfg.epochs, cfg.warmup_epochs, cfg.final_lr_ratio),
        max_grad_norm=cfg.max_grad_norm, on_epoch=on_epoch,
        weight_average=cfg.weight_average, after_step=after_step,
    )
    return member.cpu(), result
