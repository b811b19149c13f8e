"""A small, shared training loop: AdamW, early stopping on a validation score, best weights kept,
and optional per-epoch checkpoints so that an interrupted run resumes where it stopped."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from models.device import autocast


@dataclass
class TrainResult:
    """What a training run returns: per-epoch history and the best validation score."""

    history: list[dict[str, float]] = field(default_factory=list)
    best_score: float = float("-inf")
    best_epoch: int = -1
    resumed_from: int | None = None  # the last completed epoch found in the checkpoint, if any


def _save_atomic(state: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


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
) -> TrainResult:
    """Train `model` in place and leave it holding the weights of its best validation epoch.

    batches(epoch) yields training batches; loss_step(model, batch) returns a scalar loss;
    validate(model) returns a score, higher is better (None: keep the last epoch).

    checkpoint: a file written after every epoch (model, optimiser, torch RNG, early-stopping state).
    When it exists with the same `checkpoint_key` (describe the data and settings there), training
    resumes after its last epoch and ends as an uninterrupted run would, provided batches(epoch)
    depends only on the epoch (seed it from the epoch). A checkpoint with another key is ignored.
    """
    model.to(device)
    optimiser = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    result = TrainResult()
    best_state = None
    stale, start, stopped = 0, 0, False
    checkpoint = Path(checkpoint) if checkpoint is not None else None
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, map_location="cpu", weights_only=False)
        if state.get("key") == checkpoint_key:
            model.load_state_dict(state["model"])
            optimiser.load_state_dict(state["optimiser"])
            torch.set_rng_state(state["rng"])
            result = TrainResult(state["history"], state["best_score"], state["best_epoch"], state["epoch"])
            best_state, stale, stopped = state["best_state"], state["stale"], state["stopped"]
            start = state["epoch"] + 1
    progress = tqdm(range(start, epochs), desc=desc, unit="epoch", leave=False)
    for epoch in progress:
        if stopped:
            break
        model.train()
        total, count = 0.0, 0
        for batch in batches(epoch):
            optimiser.zero_grad(set_to_none=True)
            with autocast(device):
                loss = loss_step(model, batch)
            loss.backward()
            optimiser.step()
            total += float(loss.detach())
            count += 1
        record = {"epoch": epoch, "train_loss": total / max(count, 1)}
        if validate is not None:
            model.eval()
            with torch.no_grad():
                record["val_score"] = float(validate(model))
            if record["val_score"] > result.best_score:
                result.best_score, result.best_epoch = record["val_score"], epoch
                best_state = copy.deepcopy(model.state_dict())
                stale = 0
            else:
                stale += 1
        result.history.append(record)
        progress.set_postfix({k: round(v, 4) for k, v in record.items() if k != "epoch"})
        stopped = patience is not None and stale > patience
        if checkpoint is not None:
            _save_atomic({"key": checkpoint_key, "epoch": epoch, "model": model.state_dict(),
                          "optimiser": optimiser.state_dict(), "rng": torch.get_rng_state(),
                          "history": result.history, "best_score": result.best_score,
                          "best_epoch": result.best_epoch, "best_state": best_state, "stale": stale,
                          "stopped": stopped}, checkpoint)
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return result
