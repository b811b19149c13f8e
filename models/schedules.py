"""Learning-rate schedules of fine-tuning, shared by both families (params: `<family>.finetune.lr_schedule`,
`warmup_epochs`, `final_lr_ratio`). A schedule is a registered function of the decay's progress, so a new one is
added by registering it here, not by another branch in the training loop.

Every schedule rises linearly over `warmup_epochs` ((epoch + 1) / (warmup + 1)), then decays from 1 at the first
epoch after warm-up to `final_lr_ratio` at the last epoch; `final_lr_ratio` 1 keeps the learning rate constant.
"""

from __future__ import annotations

import math
from collections.abc import Callable

Decay = Callable[[float, float], float]  # (progress in [0, 1], final ratio) -> factor


def exponential(progress: float, final: float) -> float:
    """chemprop's Noam-like decay, per epoch."""
    return final ** progress


def cosine(progress: float, final: float) -> float:
    """Half a cosine from 1 down to `final` (Loshchilov & Hutter's SGDR without restarts)."""
    return final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * progress))


LR_SCHEDULES: dict[str, Decay] = {"exponential": exponential, "cosine": cosine}


def lr_factor(schedule: str, epoch: int, epochs: int, warmup_epochs: int, final_lr_ratio: float) -> float:
    """The factor of `lr` for `epoch` (0-based) of `epochs` under `schedule` (a key of LR_SCHEDULES)."""
    if epoch < warmup_epochs:
        return (epoch + 1) / (warmup_epochs + 1)
    decay_epochs = max(epochs - 1 - warmup_epochs, 1)
    return float(LR_SCHEDULES[schedule](min(epoch - warmup_epochs, decay_epochs) / decay_epochs, final_lr_ratio))
