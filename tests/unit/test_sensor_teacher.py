"""The mean teacher: EMA updates, the loss's three parts, pseudo-labels from unlabelled windows, resumable training."""

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score
from torch import nn

import models.sensor.training as sensor_training
from models.losses import bce
from models.sensor.config import MeanTeacherConfig
from models.sensor.teacher import MeanTeacher, ramp_up
from models.sensor.training import finetune_member
from tests.unit.test_sensor_training import TINY, data, finetune_cfg

CPU = torch.device("cpu")


class Constant(nn.Module):
    """Logit `bias` for every window: (B, 2C, T) -> (B,)."""

    def __init__(self, bias: float):
        super().__init__()
        self.bias = nn.Parameter(torch.tensor(float(bias)))

    def forward(self, x):
        return self.bias.expand(len(x))


def test_ramp_rises_to_one_and_none_is_one():
    values = [ramp_up(epoch, 4) for epoch in range(6)]
    assert all(a < b for a, b in zip(values[:3], values[1:4])) and values[3] == values[5] == 1.0
    assert values[0] == pytest.approx(np.exp(-5 * 0.75 ** 2))
    assert ramp_up(0, 0) == 1.0


def test_teacher_follows_the_student_by_its_decay():
    student = Constant(0.0)
    pair = MeanTeacher(student, MeanTeacherConfig(ema_decay=0.9), bce)
    assert not any(p.requires_grad for p in pair.teacher.parameters())
    pair.update_teacher()  # the first update copies the student
    with torch.no_grad():
        student.bias.fill_(1.0)
    pair.update_teacher()
    assert pair.teacher.module.bias.item() == pytest.approx(0.1)
    pair.update_teacher()
    assert pair.teacher.module.bias.item() == pytest.approx(0.19)


def _loss(student_logit, teacher_logit, cfg, y, x_u=2, ramp=1.0):
    pair = MeanTeacher(Constant(student_logit), cfg, bce)
    with torch.no_grad():
        pair.teacher.module.bias.fill_(teacher_logit)
    x, u = torch.zeros(len(y), 2, 4), torch.zeros(x_u, 2, 4)
    return pair(x, x, torch.tensor(y), torch.ones(len(y)), 0.0, u, u, ramp).item()


def test_loss_parts_by_hand():
    z_s, z_t, y = 0.5, 2.0, [1.0, 0.0]
    p_s, p_t = torch.sigmoid(torch.tensor(z_s)).item(), torch.sigmoid(torch.tensor(z_t)).item()
    supervised = lambda target: float(np.mean([bce(torch.tensor(z_s), torch.tensor(t)).item() for t in target]))  # noqa: E731
    off = MeanTeacherConfig(soft_label_weight=0.0, consistency_weight=0.0, pseudo_label_weight=0.0)
    assert _loss(z_s, z_t, off, y) == pytest.approx(supervised(y), rel=1e-5)
    soft = off.model_copy(update={"soft_label_weight": 0.5})
    assert _loss(z_s, z_t, soft, y) == pytest.approx(supervised([0.5 + 0.5 * p_t, 0.5 * p_t]), rel=1e-5)
    assert _loss(z_s, z_t, soft, y, ramp=0.0) == pytest.approx(supervised(y), rel=1e-5)  # ramped off
    consistency = off.model_copy(update={"consistency_weight": 2.0})
    assert _loss(z_s, z_t, consistency, y) == pytest.approx(supervised(y) + 2 * (p_s - p_t) ** 2, rel=1e-5)
    # p_t = 0.88: a pseudo-label 1 at threshold 0.85, none at 0.95 (the term is then 0)
    pseudo = off.model_copy(update={"pseudo_label_weight": 1.0, "pseudo_label_threshold": 0.85})
    pseudo_bce = bce(torch.tensor(z_s), torch.tensor(1.0)).item()
    assert _loss(z_s, z_t, pseudo, y) == pytest.approx(supervised(y) + pseudo_bce, rel=1e-5)
    strict = pseudo.model_copy(update={"pseudo_label_threshold": 0.95})
    assert _loss(z_s, z_t, strict, y) == pytest.approx(supervised(y), rel=1e-5)
    assert _loss(z_s, z_t, pseudo, y, x_u=0) == pytest.approx(supervised(y), rel=1e-5)  # no unlabelled windows


def teacher_cfg(**kw):
    return finetune_cfg(mixup_alpha=0.0, mean_teacher={"enabled": True, "ema_decay": 0.9, "ramp_epochs": 2,
                                                       "pseudo_label_threshold": 0.6, **kw})


def test_unlabelled_windows_change_training_only_with_the_teacher():
    x, y = data()
    vx, vy = data(seed=1)
    ux, _ = data(n=64, seed=2)
    cfg = teacher_cfg()
    _, without = finetune_member(x, y, vx, vy, TINY, cfg, None, seed=3, device=CPU)
    _, with_unlabelled = finetune_member(x, y, vx, vy, TINY, cfg, None, seed=3, device=CPU, unlabelled_x=ux)
    assert with_unlabelled.history[0]["train_loss"] != without.history[0]["train_loss"]
    plain = finetune_cfg()  # mixup draws from the epoch's generator: unlabelled windows must not move it
    _, a = finetune_member(x, y, vx, vy, TINY, plain, None, seed=3, device=CPU)
    _, b = finetune_member(x, y, vx, vy, TINY, plain, None, seed=3, device=CPU, unlabelled_x=ux)
    assert a.history == b.history


def test_the_member_kept_is_the_teacher_and_it_learns():
    x, y = data(n=256)
    vx, vy = data(n=128, seed=1)
    member, result = finetune_member(x, y, vx, vy, TINY, teacher_cfg(), None, seed=3, device=CPU,
                                     unlabelled_x=data(n=128, seed=2)[0])
    assert type(member).__name__ == "SensorClassifier"
    assert result.best_score > 0.8  # separable by construction: positives carry a ramp (prior 0.25)
    logits = sensor_training.predict_logits(member, vx, CPU)
    assert average_precision_score(vy, logits) == pytest.approx(result.best_score)


def test_killed_mean_teacher_resumes_with_its_teacher(tmp_path, monkeypatch):
    """The teacher's EMA weights are in the checkpoint: a resumed run ends as an uninterrupted one."""
    x, y = data()
    vx, vy = data(seed=1)
    ux, _ = data(n=64, seed=2)
    cfg = teacher_cfg()
    torch.use_deterministic_algorithms(True)
    try:
        reference, uninterrupted = finetune_member(x, y, vx, vy, TINY, cfg, None, seed=3, device=CPU, unlabelled_x=ux)
        real_ramp = sensor_training.ramp_up

        def interrupted(epoch, ramp_epochs):
            if epoch == 2:
                raise KeyboardInterrupt("killed during epoch 2")
            return real_ramp(epoch, ramp_epochs)

        checkpoint = tmp_path / "member.pt"
        monkeypatch.setattr(sensor_training, "ramp_up", interrupted)
        with pytest.raises(KeyboardInterrupt):
            finetune_member(x, y, vx, vy, TINY, cfg, None, seed=3, device=CPU, checkpoint=checkpoint, unlabelled_x=ux)
        monkeypatch.setattr(sensor_training, "ramp_up", real_ramp)
        resumed, result = finetune_member(x, y, vx, vy, TINY, cfg, None, seed=3, device=CPU, checkpoint=checkpoint,
                                          unlabelled_x=ux)
    finally:
        torch.use_deterministic_algorithms(False)
    assert result.resumed_from == 1 and result.history == uninterrupted.history
    for name, tensor in reference.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), name
