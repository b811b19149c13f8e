"""The shared training loop: early stopping and resumption from a checkpoint."""

from __future__ import annotations

import pytest
import torch

from models.training import Checkpoint, TrainingSettings, train


@pytest.mark.parametrize(("patience", "epochs_run"), [(0, 3), (1, 3), (2, 4), (3, 5)])
def test_patience_epochs_without_improvement_end_training(patience, epochs_run):
    """Validation improves over epochs 0-1 and never after: `patience` stale epochs (at least one) are run, then
    training stops, holding the weights of epoch 1."""
    scores = iter([0.1, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0, -0.1])
    net = torch.nn.Linear(1, 1)
    result = train(net, lambda epoch: [torch.ones(4, 1)], lambda model, batch: model(batch).pow(2).mean(),
                   lambda model: next(scores), TrainingSettings(epochs=8, lr=0.01, patience=patience),
                   device=torch.device("cpu"))
    assert len(result.history) == epochs_run
    assert result.best_epoch == 1 and result.best_score == pytest.approx(0.5)


def _fit(epochs, checkpoint=None):
    """A linear model fitted to y = 3x by plain steps; (model, weights before every optimiser step)."""
    torch.manual_seed(0)
    net = torch.nn.Linear(1, 1)
    x = torch.linspace(-1, 1, 8).unsqueeze(1)
    trajectory = []

    def loss_step(model, batch):
        trajectory.append(torch.cat([p.detach().flatten() for p in net.parameters()]))  # before this step
        return (model(batch) - 3 * batch).pow(2).mean()

    train(net, lambda epoch: [x, x], loss_step, None, TrainingSettings(epochs=epochs, lr=0.1),
          device=torch.device("cpu"), checkpoint=None if checkpoint is None else Checkpoint(checkpoint))
    return net, trajectory


def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(tmp_path):
    straight, _ = _fit(epochs=4)
    _fit(epochs=2, checkpoint=tmp_path / "run.pt")
    resumed, steps = _fit(epochs=4, checkpoint=tmp_path / "run.pt")
    assert len(steps) == 4  # two epochs of two steps were left
    assert torch.allclose(resumed.weight, straight.weight) and torch.allclose(resumed.bias, straight.bias)
