"""A small, shared training loop: AdamW, optionally an exponential moving average of the weights, early stopping on
a validation score, best weights kept, optional per-epoch checkpoints so that an interrupted run resumes where it
stopped, and optional data parallelism across torchrun processes (models/distributed.py)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from tqdm.auto import tqdm

from models.device import autocast
from models.distributed import DistributedContext
from models.serialization import load_state, save_state


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


def _set_rng_state(state: dict | torch.Tensor, device: torch.device) -> None:
    if isinstance(state, torch.Tensor):  # a checkpoint written before the device's generator was saved
        state = {"cpu": state}
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def train(
    model: torch.nn.Module,
    batches: Callable[[int], Iterable],
    loss_step: Callable[[torch.nn.Module, object], torch.Tensor],
    validate: Callable[[torch.nn.Module], float] | None,
    *,
    epochs: int,
    lr: float,
    weight_decay: float = 0.0,
    patience: int | None = None,
    device: torch.device,
    desc: str = "train",
    checkpoint: str | Path | None = None,
    checkpoint_key: str = "",
    distributed: DistributedContext | None = None,
    lr_schedule: Callable[[int], float] | None = None,
    max_grad_norm: float | None = None,
    on_epoch: Callable[[int, float], None] | None = None,
    after_step: Callable[[], None] | None = None,
    weight_average: float = 0.0,
) -> TrainResult:
    """Train `model` in place and leave it holding the weights of its best validation epoch.

    batches(epoch) yields training batches; loss_step(model, batch) returns a scalar loss;
    validate(model) returns a score, higher is better (None: keep the last epoch).

    checkpoint: a file written after every epoch (model, optimiser, torch RNG, early-stopping state).
    When it exists with the same `checkpoint_key` (describe the data and settings there), training
    resumes after its last epoch and ends as an uninterrupted run would, provided batches(epoch)
    depends only on the epoch (seed it from the epoch). A checkpoint with another key is ignored.
    A checkpoint that holds Python objects besides tensors and plain data is refused, never loaded
    (models/serialization.py: UnsafeFileError, delete it to train from scratch).

    distributed: train data-parallel inside a torchrun process group (pass its device as `device`).
    Every rank must get the same global batches from batches(epoch); each runs loss_step on its own
    equal shard of each (DistributedContext.shard_batch: the last B % world_size rows are dropped, a
    batch of fewer rows than ranks is skipped) and DDP averages the gradients. That is the gradient of
    the global batch when loss_step returns a plain mean over rows; a loss normalised per batch
    otherwise (a weighted mean, dropping the largest losses) is then normalised per shard instead.
    train_loss is averaged over ranks; rank 0 validates and broadcasts its score, so every rank stops
    at the same epoch with the same weights; rank 0 alone writes the checkpoint (a path all can read).

    lr_schedule: epoch -> factor; the learning rate of that epoch is lr * factor (None: constant lr). A function
    of the epoch alone, so a resumed run follows the same schedule.
    max_grad_norm: clip the gradients' global L2 norm to this before each step (None: no clipping).
    on_epoch: called with (epoch, validation score) after each validated epoch; an exception it raises ends
    training there and propagates (a tuner stops a trial that way).
    after_step: called after each optimiser step (an EMA teacher follows its student there).
    weight_average: the decay per optimiser step of an exponential moving average of the weights (torch's
    AveragedModel; 0: off). Validation then scores the averaged weights, and they are the ones kept.
    """
    model.to(device)
    optimiser = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    result = TrainResult()
    best_state = None
    average = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(weight_average)) if weight_average else None
    stale, start, stopped = 0, 0, False
    checkpoint = Path(checkpoint) if checkpoint is not None else None
    if checkpoint is not None and checkpoint.exists():
        state = load_state(checkpoint, "delete it to train from scratch")
        if state.get("key") == checkpoint_key:
            model.load_state_dict(state["model"])
            optimiser.load_state_dict(state["optimiser"])
            if average is not None:
                average.load_state_dict(state["average"])
            _set_rng_state(state["rng"], device)
            result = TrainResult(state["history"], state["best_score"], state["best_epoch"], state["epoch"])
            best_state, stale, stopped = state["best_state"], state["stale"], state["stopped"]
            start = state["epoch"] + 1
    main = distributed is None or distributed.is_main
    net = model if distributed is None else DistributedDataParallel(model)
    progress = tqdm(range(start, epochs), desc=desc, unit="epoch", leave=False, disable=not main)
    for epoch in progress:
        if stopped:
            break
        model.train()
        if lr_schedule is not None:
            for group in optimiser.param_groups:
                group["lr"] = lr * float(lr_schedule(epoch))
        total, count = 0.0, 0
        for batch in batches(epoch):
            if distributed is not None:
                batch = distributed.shard_batch(batch)
                if batch is None:
                    continue
            optimiser.zero_grad(set_to_none=True)
            with autocast(device):
                loss = loss_step(net, batch)
            loss.backward()
            if max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimiser.step()
            if average is not None:
                average.update_parameters(model)
            if after_step is not None:
                after_step()
            total += float(loss.detach())
            count += 1
        record = {"epoch": epoch, "train_loss": total / max(count, 1)}
        if distributed is not None:
            record["train_loss"] = distributed.all_reduce_mean(record["train_loss"])
        if validate is not None:
            scored = model if average is None else _averaged(average, model)
            scored.eval()
            with torch.no_grad():
                score = float(validate(scored)) if main else 0.0  # the other ranks take rank 0's score
            record["val_score"] = score if distributed is None else distributed.broadcast(score)
            if record["val_score"] > result.best_score:
                result.best_score, result.best_epoch = record["val_score"], epoch
                best_state = copy.deepcopy(scored.state_dict())
                stale = 0
            else:
                stale += 1
        result.history.append(record)
        if on_epoch is not None and validate is not None:
            on_epoch(epoch, record["val_score"])
        progress.set_postfix({k: round(v, 4) for k, v in record.items() if k != "epoch"})
        # `patience` epochs in a row without improvement end training (0: the first one does)
        stopped = patience is not None and stale >= max(patience, 1)
        if checkpoint is not None and main:
            save_state({"key": checkpoint_key, "epoch": epoch, "model": model.state_dict(),
                        "optimiser": optimiser.state_dict(), "rng": _rng_state(device),
                        "average": None if average is None else average.state_dict(),
                        "history": result.history, "best_score": result.best_score,
                        "best_epoch": result.best_epoch, "best_state": best_state, "stale": stale,
                        "stopped": stopped}, checkpoint)
        if checkpoint is not None and distributed is not None:
            distributed.barrier()
    if best_state is None and average is not None:  # no validation: the last epoch's averaged weights
        best_state = _averaged(average, model).state_dict()
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return result


def _averaged(average: AveragedModel, model: torch.nn.Module) -> torch.nn.Module:
    """The averaged weights as a module like `model`, with `model`'s current buffers (only parameters are averaged)."""
    for kept, current in zip(average.module.buffers(), model.buffers()):
        kept.copy_(current)
    return average.module
