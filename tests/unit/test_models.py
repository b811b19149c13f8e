"""Sensor torch modules: shapes, causality, masking, the ability to fit, and ONNX parity on unseen sizes."""

import numpy as np
import torch

from models.export import CalibratedClassifierEnsemble, export_onnx
from models.onnx_runtime import load_session, run
from models.sensor.config import SensorModelConfig
from models.sensor.network import CausalConvBlock, MaskedReconstruction, SensorClassifier, random_spans

SMALL_SENSOR = SensorModelConfig(hidden=8, layers=2, dropout=0.0)

# The molecule model's tests (fusion, fallbacks, pretraining objectives, ONNX parity) are in test_molecule_model.py.


def test_causal_block_never_looks_ahead():
    torch.manual_seed(0)
    block = CausalConvBlock(4, kernel_size=3, dilation=2, dropout=0.0).eval()
    x = torch.randn(1, 4, 20)
    changed = x.clone()
    changed[..., 12:] += 5.0
    assert torch.allclose(block(x)[..., :12], block(changed)[..., :12])
    assert not torch.allclose(block(x)[..., 12:], block(changed)[..., 12:])


def test_sensor_classifier_shapes_and_overfits_a_tiny_batch():
    torch.manual_seed(0)
    model = SensorClassifier(6, SMALL_SENSOR)
    x, y = torch.randn(16, 6, 24), torch.tensor([0.0, 1.0] * 8)
    assert model(x).shape == (16,)
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(200):
        optimiser.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), y)
        loss.backward()
        optimiser.step()
    assert loss.item() < 0.05


def test_masked_reconstruction_scores_only_hidden_observed_steps():
    torch.manual_seed(0)
    model = SensorClassifier(4, SMALL_SENSOR)
    objective = MaskedReconstruction(model.encoder, 2, SMALL_SENSOR.hidden)
    x = torch.cat([torch.randn(3, 2, 10), torch.ones(3, 2, 10)], dim=1)
    assert objective(x, torch.zeros(3, 10, dtype=torch.bool)).item() == 0.0
    hidden = torch.zeros(3, 10, dtype=torch.bool)
    hidden[:, 4:6] = True
    assert objective(x, hidden).item() > 0
    x_missing = x.clone()
    x_missing[:, 2:] = 0.0  # nothing observed: nothing to reconstruct
    assert objective(x_missing, hidden).item() == 0.0


def test_random_spans_hide_about_the_requested_share():
    mask = random_spans(256, 64, 0.25, 4, torch.Generator().manual_seed(0))
    assert mask.shape == (256, 64)
    assert 0.15 < mask.float().mean().item() <= 0.25


def test_sensor_onnx_matches_torch_on_unseen_batch_and_length(tmp_path):
    torch.manual_seed(0)
    model = CalibratedClassifierEnsemble([SensorClassifier(6, SMALL_SENSOR) for _ in range(2)], 1.7).eval()
    path = export_onnx(model, {"features": torch.randn(4, 6, 32)}, {"features": {0: "batch", 2: "time"}},
                       ["probability", "uncertainty"], tmp_path / "sensor.onnx")
    session, provider = load_session(path)
    assert provider == "CPUExecutionProvider" or provider == "CUDAExecutionProvider"
    for shape in [(1, 6, 32), (64, 6, 32), (3, 6, 500)]:
        x = torch.randn(*shape)
        out = run(session, {"features": x.numpy()})
        with torch.no_grad():
            probability, uncertainty = model(x)
        assert np.abs(out["probability"] - probability.numpy()).max() <= 1e-4
        assert np.abs(out["uncertainty"] - uncertainty.numpy()).max() <= 1e-4
