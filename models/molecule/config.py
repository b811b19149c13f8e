"""The `molecule.model`, `molecule.pretrain`, `molecule.finetune`, `molecule.calibrate` and `molecule.baseline` sections
of params.yaml."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from data.config import StrictModel
from models.config import (BatchSize, Epochs, FinalLrRatio, FinetuneConfig, FixedMasksConfig, LrSchedule, MaskRatio,
                           Patience, PretrainConfig, WarmupEpochs)


class MoleculeModelConfig(StrictModel):
    """Sizes of the graph encoder, the SMILES encoder, the cross-attention and which views the model uses."""

    hidden: int = Field(64, ge=4)
    layers: int = Field(3, ge=1, description="GINE message-passing layers")
    dropout: float = Field(0.1, ge=0, lt=1)
    heads: int = Field(4, ge=1, description="attention heads (hidden must be a multiple)")
    smiles_layers: int = Field(1, ge=1, description="transformer layers over the SMILES tokens")
    cross_layers: int = Field(1, ge=0, description="bidirectional atom <-> token cross-attention layers")
    descriptors: Literal["rdkit", "physical", "none"] = Field(
        "rdkit", description="whole-molecule RDKit descriptors fed to the head (data/molecules/descriptors.py): rdkit: "
        "all of RDKit's 2D descriptors; physical: a short list of 16 (logP, TPSA, size, ...); none: not used")
    modalities: Literal["fused", "graph", "smiles"] = Field(
        "fused", description="fused: graph and SMILES views with a gate; graph or smiles: one view only (ablations)"
    )


class MoleculePretrainConfig(PretrainConfig):
    """Self-supervised pretraining: masked atoms, masked tokens and graph/SMILES contrastive alignment."""

    epochs: Epochs = 3
    mask_ratio: MaskRatio = 0.15
    token_mask_ratio: float = Field(0.15, gt=0, lt=1, description="share of SMILES tokens masked")
    contrastive_weight: float = Field(0.5, ge=0, description="weight of the InfoNCE graph/SMILES alignment loss")
    temperature: float = Field(0.1, gt=0, description="InfoNCE temperature")
    sign_flip: bool = Field(True, description="flip Laplacian eigenvector signs at random per molecule and batch")


class MoleculeFinetuneConfig(FinetuneConfig):
    """Supervised fine-tuning of the ensemble."""

    epochs: Epochs = 50
    batch_size: BatchSize = 64
    patience: Patience = 15
    lr_schedule: LrSchedule = "exponential"
    warmup_epochs: WarmupEpochs = 2
    final_lr_ratio: FinalLrRatio = 0.1
    regression_loss: Literal["mse", "huber"] = "mse"
    huber_delta: float = Field(1.0, gt=0, description="Huber transition, in standardised target units")
    classification_loss: Literal["bce", "focal"] = "bce"
    focal_gamma: float = Field(2.0, ge=0)
    modality_dropout: float = Field(
        0.1, ge=0, lt=0.5, description="per molecule and view, the chance to hide it (the fused model learns to answer from one)"
    )
    descriptor_dropout: float = Field(
        0.5, ge=0, le=1, description="the chance that a graph hidden by modality_dropout takes its descriptors with "
        "it (trains the SMILES-only answer without descriptors; docs/decisions/0009-molecule-descriptors.md)")
    sign_flip: bool = Field(True, description="flip Laplacian eigenvector signs at random per molecule and batch")


class MoleculeCalibrateConfig(FixedMasksConfig):
    """Uncertainty calibration on validation."""

    interval_z: float = Field(1.96, gt=0, description="regression: interval = value +- z * uncertainty (1.96: 95 %)")
    method: Literal["scaled_variance", "conformal"] = Field(
        "scaled_variance",
        description="scaled_variance: z-scores of unit variance; conformal: split-conformal quantile of |residual| / spread "
        "at the nominal coverage of interval_z",
    )


class MoleculeBaselineConfig(StrictModel):
    """The baseline trained in the same run: a random forest on Morgan counts (r=2, 2048 bits)."""

    n_trees: int = Field(500, ge=1, description="trees of the forest")
