"""Training-stage sections of params.yaml shared by both model families."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from data.config import StrictModel


class PretrainConfig(StrictModel):
    """Self-supervised pretraining of the encoder."""

    enabled: bool = True
    epochs: int = Field(3, ge=1)
    batch_size: int = Field(128, ge=1)
    lr: float = Field(1e-3, gt=0)
    mask_ratio: float = Field(0.25, gt=0, lt=1, description="share of time steps (sensor) or atoms (molecule) masked")
    seed: int = 0


class FinetuneConfig(StrictModel):
    """Supervised fine-tuning of a small deep ensemble."""

    epochs: int = Field(10, ge=1)
    batch_size: int = Field(128, ge=1)
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(1e-4, ge=0)
    patience: int = Field(3, ge=0, description="epochs without validation improvement before stopping")
    ensemble_size: int = Field(3, ge=2, description="members; their spread is the uncertainty")
    use_pretrained: bool = Field(True, description="start from the pretrained encoder (switch off for ablation)")
    lr_schedule: Literal["exponential", "cosine"] = Field(
        "exponential", description="decay after warm-up, to lr * final_lr_ratio at the last epoch (models/schedules.py)")
    warmup_epochs: int = Field(0, ge=0, description="learning rate rises linearly to lr over these epochs (chemprop: 2)")
    final_lr_ratio: float = Field(1.0, gt=0, le=1, description="the last epoch's learning rate is lr * this (1: constant "
                                  "lr; chemprop's Noam-like schedule: exponential to 0.1)")
    max_grad_norm: float | None = Field(None, gt=0, description="clip the gradients' global L2 norm to this (null: off)")
    weight_average: float = Field(0.0, ge=0, lt=1, description="decay per step of an exponential moving average of the "
                                  "weights, which validation scores and training keeps (0: off)")
    seed: int = 0


class FixedMasksConfig(StrictModel):
    """MC-dropout with fixed masks in the calibrated, exported ensemble (a calibrate section of either family)."""

    mask_passes: int = Field(
        0, ge=0, le=64,
        description="MC-dropout with fixed masks (models/mc_dropout.py): passes per member whose outputs join the "
        "ensemble's spread, calibrated and exported with it; each is a forward pass at prediction. 0: members alone",
    )
    mask_seed: int = Field(0, ge=0, description="seed of the fixed masks (member i: mask_seed * 1000 + i)")
