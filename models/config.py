"""Training-stage sections of params.yaml shared by both model families.

A setting whose default differs between the families is a field type here (its bounds and meaning) and a field with
the family's default in the family's class; every default equals params.yaml's (tests/unit/test_params.py).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from data.config import StrictModel

Epochs = Annotated[int, Field(ge=1)]
BatchSize = Annotated[int, Field(ge=1)]
MaskRatio = Annotated[float, Field(gt=0, lt=1, description="share of time steps (sensor) or atoms (molecule) masked")]
Patience = Annotated[int, Field(ge=0, description="epochs without validation improvement before stopping")]
LrSchedule = Annotated[Literal["exponential", "cosine"], Field(
    description="decay after warm-up, to lr * final_lr_ratio at the last epoch (models/schedules.py)")]
WarmupEpochs = Annotated[int, Field(ge=0, description="learning rate rises linearly to lr over these epochs")]
FinalLrRatio = Annotated[float, Field(gt=0, le=1, description="the last epoch's learning rate is lr * this (1: constant lr)")]


class PretrainConfig(StrictModel):
    """Self-supervised pretraining of the encoder (a family adds `epochs` and `mask_ratio`)."""

    enabled: bool = True
    batch_size: BatchSize = 128
    lr: float = Field(1e-3, gt=0)
    seed: int = 0


class FinetuneConfig(StrictModel):
    """Supervised fine-tuning of a small deep ensemble (a family adds `epochs`, `batch_size`, `patience` and the
    learning-rate schedule: `lr_schedule`, `warmup_epochs`, `final_lr_ratio`)."""

    lr: float = Field(2e-3, gt=0)
    weight_decay: float = Field(1e-4, ge=0, description="AdamW's decoupled weight decay")
    ensemble_size: int = Field(3, ge=2, description="members; their spread is the uncertainty")
    use_pretrained: bool = Field(True, description="start from the pretrained encoder (switch off for ablation)")
    seed: int = Field(0, description="member i trains with seed + i")


class FixedMasksConfig(StrictModel):
    """MC-dropout with fixed masks in the calibrated, exported ensemble (a calibrate section of either family)."""

    mask_passes: int = Field(
        0, ge=0, le=64,
        description="MC-dropout with fixed masks (models/mc_dropout.py): passes per member whose outputs join the "
        "ensemble's spread, calibrated and exported with it; each is a forward pass at prediction. 0: members alone",
    )
    mask_seed: int = Field(0, ge=0, description="seed of the fixed masks (member i: mask_seed * 1000 + i)")
