"""A small, shared training loop: AdamW, early stopping on a validation score, best weights kept."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from models.device import autocast


@dataclass
class TrainResult:
    """What a training run returns: per-epoch history and the best validation score."""

    history: list[dict[str, float]] = field(default_factory=list)
    best_score: float = float("-inf")
    best_epoch: int = -1


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
) -> TrainResult:
    """Train `model` in place and leave it holding the weights of its best validation epoch.

    batches(epoch) yields training batches; loss_step(model, batch) returns a scalar loss;
    validate(model) returns a score, higher is better (None: keep the last epoch).
    """
    model.to(device)
    optimiser = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    result = TrainResult()
    best_state = None
    stale = 0
    progress = tqdm(range(epochs), desc=desc, unit="epoch", leave=False)
    for epoch in progress:
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
        if patience is not None and stale > patience:
            break
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return result
