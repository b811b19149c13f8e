"""The shared training loop's early stopping."""

from __future__ import annotations

import pytest
import torch

from models.training import train


@pytest.mark.parametrize(("patience", "epochs_run"), [(0, 3), (1, 3), (2, 4), (3, 5)])
def test_patience_epochs_without_improvement_end_training(patience, epochs_run):
    """Validation improves over epochs 0-1 and never after: `patience` stale epochs (at least one) are run, then
    training stops, holding the weights of epoch 1."""
    scores = iter([0.1, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0, -0.1])
    net = torch.nn.Linear(1, 1)
    result = train(net, lambda epoch: [torch.ones(4, 1)], lambda model, batch: model(batch).pow(2).mean(),
                   lambda model: next(scores), epochs=8, lr=0.01, patience=patience, device=torch.device("cpu"))
    assert len(result.history) == epochs_run
    assert result.best_epoch == 1 and result.best_score == pytest.approx(0.5)
