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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

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
from models.training import Checkpoint, TrainingHooks, TrainingSettings, TrainResult, train

MASK_SPAN = 4


@dataclass(frozen=True)
class SensorPretrainBatch:
    """One pretraining batch, on the training device: x (B, 2C, T) features, hidden (B, T) bool the time steps
    masked for reconstruction, view_a and view_b (B, 2C, T) two augmented views of x (x itself without the
    contrastive objective)."""

    x: torch.Tensor
    hidden: torch.Tensor
    view_a: torch.Tensor
    view_b: torch.Tensor


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

    def batches(epoch: int) -> Iterator[SensorPretrainBatch]:
        rng = np.random.default_rng([cfg.seed, epoch])
        generator = torch.Generator().manual_seed(cfg.seed * 100_003 + epoch)
        tensor = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
        for idx in index_batches(len(features), cfg.batch_size, cfg.seed + epoch):
            x = features[idx]
            hidden = random_spans(len(idx), x.shape[-1], cfg.mask_ratio, MASK_SPAN, generator)
            views = [augment(x, rng, cfg.augmentations, cfg.augment_probability) if contrastive else x for _ in range(2)]
            yield SensorPretrainBatch(tensor(x), hidden.to(device), tensor(views[0]), tensor(views[1]))

    def loss_step(model: nn.Module, batch: SensorPretrainBatch) -> torch.Tensor:
        return model(batch.x, batch.hidden, batch.view_a, batch.view_b)

    result = train(objective, batches, loss_step, None,
                   TrainingSettings(epochs=cfg.epochs, lr=cfg.lr, desc="pretrain sensor"), device=device)
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


@dataclass(frozen=True)
class SensorSplits:
    """What a member trains on: train_x (n, 2C, T) features with train_y (n,) float32 0/1 labels, val_x (m, 2C, T)
    with val_y (m,), and unlabelled_x (u, 2C, T) windows without a label (the mean teacher's; u may be 0)."""

    train_x: np.ndarray
    train_y: np.ndarray
    val_x: np.ndarray
    val_y: np.ndarray
    unlabelled_x: np.ndarray


@dataclass(frozen=True, kw_only=True)
class SensorBatch:
    """One fine-tuning batch, on the training device.

    x: (B, 2C, T) features; y: (B,) targets in [0, 1] (mixup mixes them); w: (B,) sample weights (the sampling's);
    drop: the share of the largest losses left out (the small-loss curriculum). With the mean teacher also x_aug
    (B, 2C, T), x's augmented view; x_u and x_u_aug (U, 2C, T), unlabelled windows and their augmented view (U may
    be 0); ramp: the epoch's factor of the unsupervised weights (models/sensor/teacher.py). Sharded for data
    parallelism by models/distributed.shard_batch (tensors of B rows).
    """

    x: torch.Tensor
    x_aug: torch.Tensor | None = None
    y: torch.Tensor
    w: torch.Tensor
    drop: float
    x_u: torch.Tensor | None = None
    x_u_aug: torch.Tensor | None = None
    ramp: float = 1.0


class SensorBatches:
    """The fine-tuning batches of an epoch, `batches(epoch)`: the configured sampling (which may ask for the member's
    MC-dropout `spread(epoch)`, (n,), from the second epoch on), mixup, the curriculum's drop rate and, with the mean
    teacher, augmented views and unlabelled windows. Every random choice is seeded from (seed, epoch)."""

    def __init__(self, data: SensorSplits, cfg: SensorFinetuneConfig, seed: int, device: torch.device,
                 spread: Callable[[int], np.ndarray]):
        self.data, self.cfg, self.seed, self.device, self.spread = data, cfg, seed, device, spread

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(self.device)

    def __call__(self, epoch: int) -> Iterator[SensorBatch]:
        cfg, data, teacher = self.cfg, self.data, self.cfg.mean_teacher
        rng = np.random.default_rng([self.seed, epoch])
        order, weights = SAMPLINGS[cfg.sampling](data.train_y, rng, (lambda: self.spread(epoch)) if epoch else None)
        drop = small_loss_rate(cfg, epoch)
        unlabelled_order = rng.permutation(len(data.unlabelled_x)) if teacher.enabled else None
        for batch, start in enumerate(range(0, len(order), cfg.batch_size)):
            idx = order[start:start + cfg.batch_size]
            x, y, w = data.train_x[idx], data.train_y[idx], weights[idx]
            if cfg.mixup_alpha > 0:
                x, y, w = mixup(x, y, w, cfg.mixup_alpha, rng)
            if not teacher.enabled:
                yield SensorBatch(x=self._tensor(x), y=self._tensor(y), w=self._tensor(w), drop=drop)
                continue
            size = min(teacher.unlabelled_batch_size, len(unlabelled_order))
            x_u = data.unlabelled_x[np.take(unlabelled_order, np.arange(batch * size, (batch + 1) * size), mode="wrap")]
            views = [augment(a, rng, teacher.augmentations, teacher.augment_probability) for a in (x, x_u)]
            yield SensorBatch(x=self._tensor(x), x_aug=self._tensor(views[0]), y=self._tensor(y), w=self._tensor(w),
                              drop=drop, x_u=self._tensor(x_u), x_u_aug=self._tensor(views[1]),
                              ramp=ramp_up(epoch, teacher.ramp_epochs))


def _fingerprint(*parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.tobytes() if isinstance(part, np.ndarray) else repr(part).encode())
    return h.hexdigest()


def _checkpoint_key(model_cfg: SensorModelConfig, cfg: SensorFinetuneConfig, seed: int, encoder_state: dict | None,
                    data: SensorSplits) -> str:
    """What a member's checkpoint must match to be resumed: settings, seed, the pretrained encoder and the data."""
    encoder_sum = None if encoder_state is None else float(sum(v.double().sum() for v in encoder_state.values()))
    return _fingerprint(model_cfg.model_dump_json(), cfg.model_dump_json(), seed, encoder_sum,
                        np.ascontiguousarray(data.train_x), data.train_y, np.ascontiguousarray(data.val_x),
                        np.asarray(data.val_y),
                        np.ascontiguousarray(data.unlabelled_x) if cfg.mean_teacher.enabled else None)


def _new_member(in_channels: int, model_cfg: SensorModelConfig, encoder_state: dict | None,
                make_encoder: Callable[[int], nn.Module] | None) -> SensorClassifier:
    """An untrained member (its encoder pretrained where `encoder_state` is given, or built by `make_encoder`)."""
    if make_encoder is not None and encoder_state is not None:
        raise ValueError("a pretrained encoder state is SensorEncoder's: it does not load into another encoder")
    encoder = None if make_encoder is None else make_encoder(in_channels)
    return SensorClassifier(in_channels, model_cfg, encoder)


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
    device = device if distributed is None else distributed.device()
    torch.manual_seed(seed)
    model = _new_member(train_x.shape[1], model_cfg, encoder_state, make_encoder).fit_statistics(train_x)
    if encoder_state is not None:
        model.encoder.load_state_dict(encoder_state)
    data = SensorSplits(train_x, np.asarray(train_y, dtype=np.float32), val_x, val_y,
                        np.empty((0, *train_x.shape[1:]), np.float32) if unlabelled_x is None else unlabelled_x)
    loss_fn = make_loss(cfg.loss.terms, focal_gamma=cfg.loss.focal_gamma, focal_alpha=cfg.loss.focal_alpha,
                        gce_q=cfg.loss.gce_q, sce_alpha=cfg.loss.sce_alpha, sce_beta=cfg.loss.sce_beta)
    trained = MeanTeacher(model, cfg.mean_teacher, loss_fn) if cfg.mean_teacher.enabled else model
    member = trained.teacher.module if cfg.mean_teacher.enabled else model
    hooks = TrainingHooks(on_epoch, trained.update_teacher if cfg.mean_teacher.enabled else None)

    def spread(epoch: int) -> np.ndarray:
        """MC-dropout spread of the member being trained, on its training windows; back to training mode after."""
        values = mc_dropout_spread(model, train_x, device, cfg.uncertainty_passes, seed * 100_003 + epoch)
        trained.train()
        return values

    def loss_step(net: nn.Module, batch: SensorBatch) -> torch.Tensor:
        if cfg.mean_teacher.enabled:
            return net(batch.x, batch.x_aug, batch.y, batch.w, batch.drop, batch.x_u, batch.x_u_aug, batch.ramp)
        return reduce_loss(loss_fn(net(batch.x).float(), batch.y), batch.w, batch.drop)

    def validate(_) -> float:
        return float(average_precision_score(val_y, predict_logits(member, val_x, device)))

    resume = None if checkpoint is None or not cfg.checkpoint else Checkpoint(
        Path(checkpoint), _checkpoint_key(model_cfg, cfg, seed, encoder_state, data))
    result = train(trained, SensorBatches(data, cfg, seed, device, spread), loss_step, validate,
                   TrainingSettings.from_finetune(cfg, f"finetune sensor member (seed {seed})"), device=device,
                   checkpoint=resume, distributed=distributed, hooks=hooks)
    return member.cpu(), result
