"""The benchmark's recurrent encoders (models/sensor/recurrent.py) in the sensor classifier."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.sensor.config import SensorFinetuneConfig, SensorModelConfig
from models.sensor.recurrent import RECURRENT_KINDS, RecurrentEncoder, matched_hidden, parameter_count
from models.sensor.training import finetune_member, predict_logits

CPU = torch.device("cpu")


@pytest.mark.parametrize("kind", sorted(RECURRENT_KINDS))
def test_matched_hidden_gives_the_closest_parameter_count(kind):
    hidden = matched_hidden(kind, 10, 5000)
    counts = {h: parameter_count(RecurrentEncoder(10, kind, h)) for h in (hidden - 1, hidden, hidden + 1)}
    assert min(counts, key=lambda h: abs(counts[h] - 5000)) == hidden
    assert abs(counts[hidden] - 5000) / 5000 < 0.1


def test_the_embedding_sees_the_whole_window_and_an_unknown_kind_is_refused():
    torch.manual_seed(0)
    encoder = RecurrentEncoder(4, "gru", 8).eval()
    x = torch.randn(3, 4, 12)
    early = x.clone()
    early[:, :, 0] += 5.0  # only the first step moves
    assert encoder(x).shape == (3, 16) and not torch.allclose(encoder(x), encoder(early))
    with pytest.raises(ValueError, match="unknown recurrent kind 'tcn'"):
        RecurrentEncoder(4, "tcn", 8)


def test_a_member_trains_with_a_recurrent_encoder_in_the_place_of_ours():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 6, 16)).astype(np.float32)
    y = (x[:, 0, -4:].mean(axis=1) > 0).astype(np.float32)  # the last steps of the first channel decide
    cfg = SensorFinetuneConfig(epochs=4, batch_size=32, lr=0.01, patience=4, checkpoint=False)
    model, result = finetune_member(x[:192], y[:192], x[192:], y[192:], SensorModelConfig(hidden=8, statistics_bins=0),
                                    cfg, None, 0, CPU, make_encoder=lambda channels: RecurrentEncoder(channels, "lstm", 12))
    assert isinstance(model.encoder, RecurrentEncoder) and result.best_score > 0.8
    assert predict_logits(model, x[192:], CPU).shape == (64,)
    with pytest.raises(ValueError, match="does not load into another encoder"):
        finetune_member(x, y, x, y, SensorModelConfig(hidden=8), cfg, {"w": torch.zeros(1)}, 0, CPU,
                        make_encoder=lambda channels: RecurrentEncoder(channels, "gru", 4))
