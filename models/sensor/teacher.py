"""Semi-supervised fine-tuning: a mean teacher (Tarvainen & Valpola 2017) with confidence-thresholded pseudo-labels
(FixMatch, Sohn et al. 2020) on unlabelled windows.

The teacher is an exponential moving average of the student's weights (torch's AveragedModel), updated after every
optimiser step; it is the model kept (validated every epoch, exported). The student sees augmented windows, the
teacher the clean ones. The loss of a batch, with every unsupervised weight ramped up over the first epochs:

    supervised(z_s(aug x), (1 - a) y + a p_t(x))         the teacher's soft labels smooth noisy annotations
  + c * mean (p_s(aug x) - p_t(x))^2                     consistency, labelled and unlabelled windows alike
  + u * mean [max(p_t, 1 - p_t) >= tau] BCE(z_s(aug x_u), p_t(x_u) >= 0.5)   pseudo-labels, confident ones only
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from models.losses import reduce_loss
from models.sensor.config import MeanTeacherConfig


def ramp_up(epoch: int, ramp_epochs: int) -> float:
    """exp(-5 (1 - t)^2) with t = (epoch + 1) / ramp_epochs capped at 1 (Laine & Aila 2017); 1 without a ramp."""
    if ramp_epochs == 0:
        return 1.0
    t = min(1.0, (epoch + 1) / ramp_epochs)
    return math.exp(-5.0 * (1.0 - t) ** 2)


class MeanTeacher(nn.Module):
    """A student network and its EMA teacher; forward returns the batch's training loss (a scalar).

    loss_fn: per-sample supervised loss (logits (n,), targets (n,) in [0, 1]) -> (n,), models/losses.make_loss.
    """

    def __init__(self, student: nn.Module, cfg: MeanTeacherConfig,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
        super().__init__()
        self.student = student
        self.teacher = AveragedModel(student, multi_avg_fn=get_ema_multi_avg_fn(cfg.ema_decay), use_buffers=True)
        self.teacher.requires_grad_(False)
        self.cfg = cfg
        self.loss_fn = loss_fn

    @torch.no_grad()
    def update_teacher(self) -> None:
        """One EMA step of the teacher towards the student's current weights."""
        self.teacher.update_parameters(self.student)

    def forward(self, x: torch.Tensor, x_aug: torch.Tensor, y: torch.Tensor, w: torch.Tensor, drop: float,
                x_u: torch.Tensor, x_u_aug: torch.Tensor, ramp: float) -> torch.Tensor:
        """x, x_aug: (B, 2C, T) a labelled batch and its augmented view; y, w: (B,) targets and weights;
        x_u, x_u_aug: (U, 2C, T) unlabelled windows (U may be 0); ramp: the epoch's factor of a, c and u."""
        cfg = self.cfg
        with torch.no_grad():
            p_t = torch.sigmoid(self.teacher(torch.cat([x, x_u])).float())
        p_t, p_t_u = p_t[:len(x)], p_t[len(x):]
        z_s = self.student(torch.cat([x_aug, x_u_aug])).float()
        z_s, z_s_u = z_s[:len(x)], z_s[len(x):]
        target = (1 - ramp * cfg.soft_label_weight) * y + ramp * cfg.soft_label_weight * p_t
        loss = reduce_loss(self.loss_fn(z_s, target), w, drop)
        if cfg.consistency_weight:
            consistency = F.mse_loss(torch.sigmoid(torch.cat([z_s, z_s_u])), torch.cat([p_t, p_t_u]))
            loss = loss + ramp * cfg.consistency_weight * consistency
        if cfg.pseudo_label_weight and len(x_u):
            confident = (torch.maximum(p_t_u, 1 - p_t_u) >= cfg.pseudo_label_threshold).float()
            pseudo = F.binary_cross_entropy_with_logits(z_s_u, (p_t_u >= 0.5).float(), reduction="none")
            loss = loss + ramp * cfg.pseudo_label_weight * (confident * pseudo).mean()
        return loss
