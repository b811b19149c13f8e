"""The sensor network: TCN + transformer encoder, positional encoding, heads, calibrated export."""

import numpy as np
import pytest
import torch

from models.calibration import calibrated_probability, fit_isotonic
from models.export import export_onnx
from models.mc_dropout import FixedMaskPasses
from models.onnx_runtime import load_session, run
from models.sensor.calibrated import IsotonicCalibratedEnsemble, PiecewiseLinear, calibrated_ensemble
from models.sensor.config import SensorModelConfig
from models.sensor.encoder import SensorEncoder
from models.sensor.network import ContrastiveModel, SensorClassifier
from models.sensor.positional import SinusoidalPositionalEncoding
from models.sensor.training import ensemble_logits, fixed_mask_members

TINY = SensorModelConfig(hidden=8, layers=2, dropout=0.0, attention_layers=1, heads=2, projection=4)


def test_positional_encoding_counts_back_from_the_most_recent_step():
    pe = SinusoidalPositionalEncoding(8)
    short, long = pe.encoding(5), pe.encoding(12)
    assert short.shape == (5, 8)
    assert torch.allclose(short[-1], torch.tensor([0.0, 1.0] * 4))  # position 0: sin 0, cos 0
    assert torch.allclose(short, long[-5:])  # the same step keeps its code in a longer window
    with pytest.raises(ValueError, match="even"):
        SinusoidalPositionalEncoding(7)


def test_tcn_part_is_causal_and_attention_mixes_the_window():
    torch.manual_seed(0)
    encoder = SensorEncoder(4, TINY).eval()
    x = torch.randn(1, 4, 20)
    changed = x.clone()
    changed[..., 15:] += 3.0
    tcn = lambda v: encoder.blocks(torch.relu(encoder.stem(v)))  # noqa: E731
    # the stem ('same' padding, kernel 3) reaches one step ahead; the TCN blocks add no look-ahead
    assert torch.allclose(tcn(x)[..., :14], tcn(changed)[..., :14])
    # after attention, earlier steps see later ones
    assert not torch.allclose(encoder.sequence(x)[..., :14], encoder.sequence(changed)[..., :14])
    assert encoder(x).shape == (1, 16)


def test_config_rejects_heads_that_do_not_divide_hidden():
    with pytest.raises(ValueError, match="divisible"):
        SensorModelConfig(hidden=10, heads=3)
    SensorModelConfig(hidden=10, heads=3, attention_layers=0)  # no attention: no constraint


def test_contrastive_model_gives_a_finite_loss_and_trains_the_encoder():
    torch.manual_seed(0)
    encoder = SensorEncoder(4, TINY)
    model = ContrastiveModel(encoder, TINY, temperature=0.5)
    x = torch.randn(6, 4, 16)
    loss = model(x, x + 0.01 * torch.randn_like(x))
    loss.backward()
    assert torch.isfinite(loss) and encoder.stem.weight.grad.abs().sum() > 0


def test_piecewise_linear_matches_numpy_interp():
    knots_x, knots_y = [0.1, 0.3, 0.35, 0.8], [0.01, 0.2, 0.4, 0.95]  # increasing x, as IsotonicRegression gives
    p = np.linspace(-0.2, 1.2, 301)
    got = PiecewiseLinear(knots_x, knots_y)(torch.tensor(p, dtype=torch.float32)).numpy()
    assert np.abs(got - np.interp(p, knots_x, knots_y)).max() < 1e-6


@pytest.mark.parametrize("mask_passes", [0, 2])
def test_isotonic_ensemble_onnx_matches_torch_and_the_numpy_calibration(tmp_path, mask_passes):
    torch.manual_seed(0)
    plain = [SensorClassifier(6, TINY.model_copy(update={"dropout": 0.3})).eval() for _ in range(2)]
    members = plain
    if mask_passes:  # each member's fixed-mask passes inside the graph, as sensor_export builds them
        members = [FixedMaskPasses(m, mask_passes)
                   for m in fixed_mask_members(plain, mask_passes, 0, np.zeros((2, 6, 32), np.float32))]
    rng = np.random.default_rng(0)
    p = rng.random(300)
    knots_x, knots_y = fit_isotonic(p, (rng.random(300) < p**2).astype(int))
    calibration = {"method": "isotonic", "temperature": 1.0, "knots_x": knots_x, "knots_y": knots_y}
    model = calibrated_ensemble(members, calibration).eval()
    assert isinstance(model, IsotonicCalibratedEnsemble)
    path = export_onnx(model, {"features": torch.randn(4, 6, 32)}, {"features": {0: "batch", 2: "time"}},
                       ["probability", "uncertainty"], tmp_path / "sensor.onnx")
    session, _ = load_session(path, prefer_cuda=False)
    for shape in [(1, 6, 32), (7, 6, 50)]:
        x = torch.randn(*shape)
        out = run(session, {"features": x.numpy()})
        with torch.no_grad():
            probability, uncertainty = model(x)
        logits = ensemble_logits(plain, x.numpy(), torch.device("cpu"), mask_passes, 0)  # what calibrate fits on
        assert logits.shape == (len(x), 2 * max(1, mask_passes))
        assert np.abs(out["probability"] - probability.numpy()).max() <= 1e-4
        assert np.abs(out["uncertainty"] - uncertainty.numpy()).max() <= 1e-4
        # evaluation (numpy, from member logits) and serving (ONNX graph) agree
        assert np.abs(calibrated_probability(logits, calibration) - out["probability"]).max() <= 1e-4


def test_window_statistics_match_the_baseline_summary_features():
    from data.sensors.summary_features import summary_features
    from models.sensor.statistics import WindowStatistics

    rng = np.random.default_rng(0)
    X = rng.normal(size=(5, 3, 20))
    X[0, 1, 3:7] = np.nan       # a gap
    X[1, 2, :-1] = np.nan       # one observed step: std 0, slope 0
    X[2, 0, :] = np.nan         # all missing: zeros
    observed = ~np.isnan(X)
    x = torch.from_numpy(np.concatenate([np.where(observed, X, 0.0), observed], axis=1).astype(np.float32))
    stats = WindowStatistics(3)(x).numpy()
    # the last step is observed wherever a channel has data, so "last" is the baseline's last observed value
    np.testing.assert_allclose(stats, summary_features(X), atol=1e-5)


def test_piecewise_linear_encoding_by_hand():
    from models.piecewise import PiecewiseLinearEncoding

    encoding = PiecewiseLinearEncoding(2, bins=4)
    values = np.stack([np.arange(9.0), np.full(9, 5.0)], axis=1)    # feature 0: 0..8; feature 1: constant
    encoding.fit(values)
    edges = encoding.edges.numpy()
    np.testing.assert_allclose(edges[0], [0, 2, 4, 6, 8])           # the training quantiles
    assert (np.diff(edges, axis=1) > 0).all()                        # a constant feature still gets increasing edges
    out = encoding(torch.tensor([[5.0, 4.0], [-3.0, 6.0], [99.0, 5.0]])).numpy().reshape(3, 2, 4)
    np.testing.assert_allclose(out[0, 0], [1, 1, 0.5, 0])           # 5 is half-way through the third bin
    np.testing.assert_allclose(out[1, 0], [0, 0, 0, 0])             # below the first edge
    np.testing.assert_allclose(out[2, 0], [1, 1, 1, 1])             # above the last edge
    assert out[1, 1].sum() > out[0, 1].sum()                         # monotone in the value, even for the constant one
    with pytest.raises(ValueError, match="expected"):
        encoding.fit(np.zeros((3, 5)))
    far = PiecewiseLinearEncoding(1, bins=4).fit(np.full((9, 1), 127.0))  # a tie far from 0: float32 steps
    assert (far.edges[:, 1:] > far.edges[:, :-1]).all()
    assert torch.isfinite(far(torch.tensor([[127.0], [126.0], [128.0]]))).all()


def test_statistics_branch_is_fitted_on_training_features_and_sees_a_level_shift():
    torch.manual_seed(0)
    cfg = TINY.model_copy(update={"statistics_bins": 8})
    x = torch.cat([torch.randn(64, 3, 16), torch.ones(64, 3, 16)], dim=1)
    model = SensorClassifier(6, cfg).fit_statistics(x.numpy()).eval()
    edges = model.statistics[1].edges
    assert edges.shape == (18, 9) and (edges[:, 1:] > edges[:, :-1]).all()
    shifted = x.clone()
    shifted[:, 0] += 0.5
    with torch.no_grad():
        assert model(x).shape == (64,)
        assert not torch.allclose(model.statistics(x), model.statistics(shifted))
    plain = SensorClassifier(6, TINY.model_copy(update={"statistics_bins": 0}))
    assert plain.statistics is None and plain.fit_statistics(x.numpy()) is plain
