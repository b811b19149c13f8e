"""The sensor sections of params.yaml that belong to the model: `sensor.model`, `sensor.pretrain`,
`sensor.finetune`, `sensor.calibrate`, `sensor.novelty` and `sensor.baseline`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from data.config import StrictModel
from models.config import (BatchSize, Epochs, FinalLrRatio, FinetuneConfig, FixedMasksConfig, LrSchedule, MaskRatio,
                           Patience, PretrainConfig, WarmupEpochs)

LOSS_NAMES = ("bce", "focal", "gce", "sce")
Augmentation = Literal["jitter", "scaling", "magnitude_warp", "time_warp", "crop", "frequency_noise"]  # augment.py


class SensorModelConfig(StrictModel):
    """Sizes of the sensor encoder: conv stem -> TCN blocks -> transformer layers -> pooled embedding (2 * hidden)."""

    hidden: int = Field(32, ge=4)
    layers: int = Field(3, ge=1, description="dilated causal convolution (TCN) blocks")
    kernel_size: int = Field(3, ge=2)
    dropout: float = Field(0.1, ge=0, lt=1)
    attention_layers: int = Field(1, ge=0, description="transformer encoder layers after the TCN (0: none)")
    heads: int = Field(2, ge=1, description="attention heads; must divide hidden")
    ff_multiplier: int = Field(2, ge=1, description="transformer feed-forward width = ff_multiplier * hidden")
    projection: int = Field(32, ge=2, description="size of the contrastive projection head's output")
    relative_channels: bool = Field(
        True, description="each channel also relative to its unit's level over its first data.reference_steps rows "
        "(data/sensors/featurize.py); for a unit the service has no reference for they are masked as missing")
    level_dropout: float = Field(
        0.5, ge=0, lt=1, description="relative channels: this share of the training windows is featurised without "
        "its unit's level (seeded), so the network also answers windows of units without a reference")
    statistics_bins: int = Field(
        16, ge=0, le=256, description="0: off; K: per-channel window statistics (last, mean, std, min, max, slope), "
        "piecewise-linear encoded over K training-quantile bins, also feed the head (models/piecewise.py)"
    )

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> "SensorModelConfig":
        if self.attention_layers and (self.hidden % self.heads or self.hidden % 2):
            raise ValueError(f"hidden ({self.hidden}) must be even and divisible by heads ({self.heads})")
        return self


class SensorPretrainConfig(PretrainConfig):
    """Self-supervised pretraining: masked reconstruction plus SimCLR (NT-Xent) on augmented views."""

    epochs: Epochs = 2
    mask_ratio: MaskRatio = 0.25
    contrastive_weight: float = Field(1.0, ge=0, description="weight of NT-Xent next to masked reconstruction (0: off)")
    reconstruction_weight: float = Field(1.0, ge=0, description="weight of masked reconstruction (0: off)")
    temperature: float = Field(0.2, gt=0, description="NT-Xent temperature")
    augmentations: list[Augmentation] = Field(
        default_factory=lambda: ["jitter", "scaling", "magnitude_warp", "time_warp", "crop", "frequency_noise"],
        description="each applied with probability augment_probability to each view",
    )
    augment_probability: float = Field(0.5, ge=0, le=1)

    @model_validator(mode="after")
    def _some_objective(self) -> "SensorPretrainConfig":
        if self.contrastive_weight == 0 and self.reconstruction_weight == 0:
            raise ValueError("contrastive_weight and reconstruction_weight cannot both be 0")
        return self


class LossConfig(StrictModel):
    """Fine-tuning loss: a weighted sum of terms (see models/losses.py)."""

    terms: dict[str, float] = Field(default_factory=lambda: {"gce": 1.0},
                                    description="loss name -> weight; names: bce, focal, gce, sce")
    focal_gamma: float = Field(2.0, ge=0)
    focal_alpha: float | None = Field(None, gt=0, lt=1, description="weight of positives in focal loss (None: 1 for both)")
    gce_q: float = Field(0.3, gt=0, le=1, description="generalized cross entropy exponent (q -> 0: CE, q = 1: MAE)")
    sce_alpha: float = Field(0.1, ge=0, description="symmetric CE: weight of cross entropy")
    sce_beta: float = Field(1.0, ge=0, description="symmetric CE: weight of reverse cross entropy")

    @field_validator("terms")
    @classmethod
    def _known_terms(cls, terms: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(terms) - set(LOSS_NAMES))
        if unknown or not terms:
            raise ValueError(f"loss terms must be a non-empty subset of {list(LOSS_NAMES)}; unknown: {unknown}")
        if any(w < 0 for w in terms.values()) or sum(terms.values()) <= 0:
            raise ValueError("loss weights must be >= 0 with a positive sum")
        return terms


class MeanTeacherConfig(StrictModel):
    """Semi-supervised fine-tuning (models/sensor/teacher.py): an EMA teacher whose soft labels smooth noisy
    annotations, consistency between student and teacher, pseudo-labels on the unlabelled windows."""

    enabled: bool = Field(False, description="train each member as a mean teacher; the teacher is the member kept")
    ema_decay: float = Field(0.99, gt=0, lt=1, description="teacher = decay * teacher + (1 - decay) * student, per step")
    soft_label_weight: float = Field(0.5, ge=0, le=1, description="a: the target is (1 - a) * label + a * teacher")
    consistency_weight: float = Field(1.0, ge=0, description="c: squared difference of student and teacher probability")
    pseudo_label_threshold: float = Field(0.95, gt=0.5, le=1, description="tau: a pseudo-label where the teacher's "
                                          "probability of its class reaches this")
    pseudo_label_weight: float = Field(1.0, ge=0, description="u: BCE of the student on the pseudo-labels")
    unlabelled_batch_size: int = Field(128, ge=1, description="unlabelled windows drawn with each labelled batch")
    ramp_epochs: int = Field(2, ge=0, description="a, c and u ramp up as exp(-5 (1 - t)^2) over these epochs")
    augmentations: list[Augmentation] = Field(
        default_factory=lambda: ["jitter", "scaling"], description="the student's view (data/sensors/augment.py)")
    augment_probability: float = Field(0.5, ge=0, le=1)


class SensorFinetuneConfig(FinetuneConfig):
    """Supervised fine-tuning for noisy, imbalanced labels."""

    epochs: Epochs = 20
    batch_size: BatchSize = 128
    patience: Patience = 4
    lr_schedule: LrSchedule = "cosine"
    warmup_epochs: WarmupEpochs = 1
    final_lr_ratio: FinalLrRatio = 0.05
    loss: LossConfig = Field(default_factory=LossConfig)
    sampling: Literal["none", "uncertainty"] = Field(
        "none", description="uncertainty: inverse-frequency loss weights, and minority windows weighed by the model's "
        "confidence in them (models/sensor/sampling.py)")
    uncertainty_passes: int = Field(4, ge=2, description="sampling=uncertainty: MC-dropout passes over the training "
                                    "windows before each epoch after the first (their spread is the uncertainty)")
    mixup_alpha: float = Field(0.2, ge=0, description="time-series mixup Beta(alpha, alpha) (0: off)")
    small_loss_drop: float = Field(0.0, ge=0, lt=1, description="small-loss curriculum: drop this share of the largest per-sample losses (0: off)")
    small_loss_warmup: int = Field(1, ge=0, description="epochs before the drop rate reaches small_loss_drop (linear ramp)")
    checkpoint: bool = Field(True, description="checkpoint every epoch; a killed run resumes from the last one")
    mean_teacher: MeanTeacherConfig = Field(default_factory=MeanTeacherConfig)


class SensorCalibrateConfig(FixedMasksConfig):
    """Calibration and the alert operating point, both fitted on validation."""

    target_precision: float = Field(0.8, gt=0, le=1, description="alert threshold: lowest with this validation precision")
    methods: list[Literal["temperature", "isotonic"]] = Field(
        default_factory=lambda: ["temperature", "isotonic"],
        description="candidates; the one with the lowest cross-validated validation NLL is kept")


class SensorNoveltyConfig(StrictModel):
    """The departure-from-normal score next to the failure probability (models/sensor/novelty.py), fitted on
    validation; it needs the pretrained encoder and decoder (off when pretraining is)."""

    enabled: bool = True
    rules: list[Literal["supervised", "novelty", "stacker", "max"]] = Field(
        default_factory=lambda: ["stacker"], min_length=1,
        description="combination rules to choose from by cross-fitted validation NLL (models/sensor/combination.py)")


class SensorBaselineConfig(StrictModel):
    """Baselines trained in the same run: HistGradientBoosting on summaries (always) and MiniRocket."""

    minirocket: bool = True
    minirocket_features: int = Field(2016, ge=84, description="MiniRocket features (multiple of 84 used)")
    cv_folds: int = Field(3, ge=2, description="grouped (by unit) CV folds choosing the logistic regression C")
    c_grid: list[float] = Field(default_factory=lambda: [1e-3, 1e-2, 1e-1], min_length=1)
