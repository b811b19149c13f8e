"""The shared training loop: early stopping, the weight average and its resumption from a checkpoint."""

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


def _fit(weight_average, epochs, validate=None, checkpoint=None):
    """A linear model fitted to y = 3x by plain steps; (model, weights after every optimiser step)."""
    torch.manual_seed(0)
    net = torch.nn.Linear(1, 1)
    x = torch.linspace(-1, 1, 8).unsqueeze(1)
    trajectory = []

    def loss_step(model, batch):
        trajectory.append(torch.cat([p.detach().flatten() for p in net.parameters()]))  # before this step
        return (model(batch) - 3 * batch).pow(2).mean()

    train(net, lambda epoch: [x, x], loss_step, validate, TrainingSettings(epochs=epochs, lr=0.1,
                                                                          weight_average=weight_average),
          device=torch.device("cpu"), checkpoint=None if checkpoint is None else Checkpoint(checkpoint))
    return net, trajectory


def test_weight_average_keeps_the_exponential_moving_average_of_the_steps():
    """The kept weights are the EMA (decay 0.8, started at the first step's result) of the weights after each step."""
    plain, steps = _fit(0.0, epochs=3)
    after = steps[1:] + [torch.cat([p.detach().flatten() for p in plain.parameters()])]
    expected = after[0]
    for weights in after[1:]:
        expected = 0.8 * expected + 0.2 * weights
    averaged, _ = _fit(0.8, epochs=3)
    kept = torch.cat([p.detach().flatten() for p in averaged.parameters()])
    assert torch.allclose(kept, expected, atol=1e-6)
    assert not torch.allclose(kept, after[-1], atol=1e-3)  # not the last step's weights


def test_validation_scores_the_averaged_weights_and_a_resumed_run_ends_alike(tmp_path):
    _, steps = _fit(0.0, epochs=1)                     # a plain epoch: two steps, the weights before each
    plain_after_epoch = _fit(0.0, epochs=1)[0].weight.item()
    average_after_epoch = 0.8 * steps[1][0].item() + 0.2 * plain_after_epoch  # the EMA of the two steps' results
    seen = []
    averaged, _ = _fit(0.8, epochs=4, validate=lambda model: seen.append(model.weight.item()) or -len(seen))
    assert seen[0] == pytest.approx(average_after_epoch) and seen[0] != pytest.approx(plain_after_epoch)
    assert averaged.weight.item() == pytest.approx(seen[0])  # the best (first) epoch's averaged weights are kept
    straight, _ = _fit(0.8, epochs=4)
    _fit(0.8, epochs=2, checkpoint=tmp_path / "run.pt")
    resumed, steps = _fit(0.8, epochs=4, checkpoint=tmp_path / "run.pt")
    assert len(steps) == 4  # two epochs of two steps were left
    assert torch.allclose(resumed.weight, straight.weight) and torch.allclose(resumed.bias, straight.bias)
