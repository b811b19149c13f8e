"""Training-stage sections of params.yaml shared by both model families."""

from __future__ import annotations

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
    seed: int = 0
