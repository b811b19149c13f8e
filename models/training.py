"""A small, shared training loop: AdamW, early stopping on a validation score, best weights kept, optional per-epoch checkpoints so that an interrupted run resumes where it
stopped, and optional data parallelism across torchrun processes (models/distributed.py)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from models.config import FinetuneConfig
from models.device import autocast
from models.distributed import DistributedContext
from models.schedules import lr_factor
from models.serialization import load_state, save_state


@dataclass(frozen=True)
class TrainingSettings:
    """How `train` trains.

    epochs: the most epochs; lr: AdamW's learning rate, times lr_schedule(epoch) where given (a function of the epoch
    alone, so a resumed run follows the same schedule; None: constant); weight_decay: AdamW's decoupled weight decay;
    patience: that many epochs in a row without a better validation score end training (0: the first does; None:
    never); desc: the progress bar's label.
    """

    epochs: int
    lr: float
    weight_decay: float = 0.0
    patience: int | None = None
    lr_schedule: Callable[[int], float] | None = None
    desc: str = "train"

    @classmethod
    def from_finetune(cls, cfg: FinetuneConfig, desc: str) -> TrainingSettings:
        """A family's fine-tuning config (its epochs, patience and learning-rate schedule included)."""
        epochs, schedule, warmup, final = cfg.epochs, cfg.lr_schedule, cfg.warmup_epochs, cfg.final_lr_ratio
        return cls(epochs=epochs, lr=cfg.lr, weight_decay=cfg.weight_decay, patience=cfg.patience,
                   lr_schedule=lambda epoch: lr_factor(schedule, epoch, epochs, warmup, final),
                   desc=desc)


@dataclass(frozen=True)
class Checkpoint:
    """A file `train` writes after every epoch (model, optimiser, torch RNG, early-stopping state)
    and resumes from when it holds the same `key` (describe the data and settings there); one with another key is
    ignored. A file holding Python objects besides tensors and plain data is refused, never loaded
    (models/serialization.py: UnsafeFileError, delete it to train from scratch)."""

    path: Path
    key: str = ""


@dataclass(frozen=True)
class TrainingHooks:
    """The loop's calls into its caller. on_epoch(epoch, validation score): after each validated epoch; an exception
    it raises ends training there and propagates (a tuner stops a trial that way). after_step(): after each
    optimiser step (an EMA teacher follows its student there)."""

    on_epoch: Callable[[int, float], None] | None = None
    after_step: Callable[[], None] | None = None


@dataclass
class TrainResult:
    """What a training run returns: per-epoch history and the best validation score."""

    history: list[dict[str, float]] = field(default_factory=list)
    best_score: float = float("-inf")
    best_epoch: int = -1
    resumed_from: int | None = None  # the last completed epoch found in the checkpoint, if any


def _rng_state(device: torch.device) -> dict:
    """The generators an epoch draws from: the CPU's, and the device's on CUDA (dropout runs there)."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def train(
    model: torch.nn.Module,
    batches: Callable[[int], Iterable],
    loss_step: Callable[[torch.nn.Module, object], torch.Tensor],
    validate: Callable[[torch.nn.Module], float] | None,
    settings: TrainingSettings,
    *,
    device: torch.device,
    checkpoint: Checkpoint | None = None,
    distributed: DistributedContext | None = None,
    hooks: TrainingHooks = TrainingHooks(),
) -> TrainResult:
    """Train `model` in place and leave it holding the weights of its best validation epoch.

    batches(epoch) yields training batches; loss_step(model, batch) returns a scalar loss;
    validate(model) returns a score, higher is better (None: keep the last epoch).

    checkpoint: resume from it and write it after every epoch; a resumed run ends as an uninterrupted run would,
    provided batches(epoch) depends only on the epoch (seed it from the epoch).

    distributed: train data-parallel inside a torchrun process group (pass its device as `device`).
    Every rank must get the same global batches from batches(epoch); each runs loss_step on its own
    equal shard of each (DistributedContext.shard_batch: the last B % world_size rows are dropped, a
    batch of fewer rows than ranks is skipped) and DDP averages the gradients. That is the gradient of
    the global batch when loss_step returns a plain mean over rows; a loss normalised per batch
    otherwise (a weighted mean, dropping the largest losses) is then normalised per shard instead.
    train_loss is averaged over ranks; rank 0 validates and broadcasts its score, so every rank stops
    at the same epoch with the same weights; rank 0 alone writes the checkpoint (a path all can read).
    """
    loop = _Loop(model, settings, device, distributed, hooks, checkpoint)
    progress = tqdm(range(loop.start, settings.epochs), desc=settings.desc, unit="epoch", leave=False,
                    disable=not loop.main)
    for epoch in progress:
        if loop.stopped:
            break
        record = {"epoch": epoch, "train_loss": loop.train_epoch(batches, loss_step, epoch)}
        if validate is not None:
            record["val_score"] = loop.validate(validate, epoch)
        loop.result.history.append(record)
        if hooks.on_epoch is not None and validate is not None:
            hooks.on_epoch(epoch, record["val_score"])
        progress.set_postfix({k: round(v, 4) for k, v in record.items() if k != "epoch"})
        # `patience` epochs in a row without improvement end training (0: the first one does)
        loop.stopped = settings.patience is not None and loop.stale >= max(settings.patience, 1)
        loop.save(epoch)
    return loop.finish()


class _Loop:
    """One run of `train`: the model and its DDP wrapper, the optimiser and the early-stopping state (resumed from the
    checkpoint where it matches)."""

    def __init__(self, model: torch.nn.Module, settings: TrainingSettings, device: torch.device,
                 distributed: DistributedContext | None, hooks: TrainingHooks, checkpoint: Checkpoint | None):
        model.to(device)
        self.model, self.settings, self.device = model, settings, device
        self.distributed, self.hooks, self.checkpoint = distributed, hooks, checkpoint
        self.optimiser = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
        self.result = TrainResult()
        self.best_state: dict | None = None
        self.stale, self.start, self.stopped = 0, 0, False
        if checkpoint is not None and checkpoint.path.exists():
            self._resume(load_state(checkpoint.path, "delete it to train from scratch"))
        self.main = distributed is None or distributed.is_main
        self.net = model if distributed is None else DistributedDataParallel(model)

    def _resume(self, state: dict) -> None:
        if state.get("key") != self.checkpoint.key:
            return
        self.model.load_state_dict(state["model"])
        self.optimiser.load_state_dict(state["optimiser"])
        _set_rng_state(state["rng"], self.device)
        self.result = TrainResult(state["history"], state["best_score"], state["best_epoch"], state["epoch"])
        self.best_state, self.stale, self.stopped = state["best_state"], state["stale"], state["stopped"]
        self.start = state["epoch"] + 1

    def train_epoch(self, batches: Callable[[int], Iterable], loss_step: Callable, epoch: int) -> float:
        """One pass over batches(epoch); the mean training loss (over ranks too)."""
        model, optimiser, settings = self.model, self.optimiser, self.settings
        model.train()
        if settings.lr_schedule is not None:
            for group in optimiser.param_groups:
                group["lr"] = settings.lr * float(settings.lr_schedule(epoch))
        total, count = 0.0, 0
        for batch in batches(epoch):
            if self.distributed is not None:
                batch = self.distributed.shard_batch(batch)
                if batch is None:
                    continue
            optimiser.zero_grad(set_to_none=True)
            with autocast(self.device):
                loss = loss_step(self.net, batch)
            loss.backward()
            optimiser.step()
            if self.hooks.after_step is not None:
                self.hooks.after_step()
            total += float(loss.detach())
            count += 1
        mean = total / max(count, 1)
        return mean if self.distributed is None else self.distributed.all_reduce_mean(mean)

    def validate(self, validate: Callable[[torch.nn.Module], float], epoch: int) -> float:
        """The epoch's validation score (rank 0's, on every rank); a better one keeps these weights."""
        self.model.eval()
        with torch.no_grad():
            score = float(validate(self.model)) if self.main else 0.0  # the other ranks take rank 0's score
        score = score if self.distributed is None else self.distributed.broadcast(score)
        if score > self.result.best_score:
            self.result.best_score, self.result.best_epoch = score, epoch
            self.best_state = copy.deepcopy(self.model.state_dict())
            self.stale = 0
        else:
            self.stale += 1
        return score

    def save(self, epoch: int) -> None:
        """The checkpoint after `epoch` (rank 0 writes it, every rank waits for it)."""
        if self.checkpoint is None:
            return
        if self.main:
            save_state({"key": self.checkpoint.key, "epoch": epoch, "model": self.model.state_dict(),
                        "optimiser": self.optimiser.state_dict(), "rng": _rng_state(self.device),
                        "history": self.result.history, "best_score": self.result.best_score,
                        "best_epoch": self.result.best_epoch, "best_state": self.best_state, "stale": self.stale,
                        "stopped": self.stopped}, self.checkpoint.path)
        if self.distributed is not None:
            self.distributed.barrier()

    def finish(self) -> TrainResult:
        """The model with its best weights (without validation: the last epoch's), in eval mode."""
        if self.best_state is not None:
            self.model.load_state_dict(self.best_state)
        self.model.eval()
        return self.result
