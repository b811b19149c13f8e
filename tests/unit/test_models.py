"""Sensor torch modules: shapes, causality, masking, the ability to fit, and ONNX parity on unseen sizes."""

from pathlib import Path

import numpy as np
import pytest
import torch

from models.device import autocast
from models.export import CalibratedClassifierEnsemble, export_onnx
from models.onnx_runtime import load_session, run
from models.sensor.config import SensorModelConfig
from models.sensor.network import CausalConvBlock, MaskedReconstruction, SensorClassifier, random_spans
from tests.devices import DEVICES

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


@pytest.mark.parametrize("device", DEVICES)
def test_sensor_classifier_shapes_and_overfits_a_tiny_batch(device):
    """As training runs it: bf16 autocast on CUDA, plain float32 on the CPU."""
    torch.manual_seed(0)
    model = SensorClassifier(6, SMALL_SENSOR).to(device)
    x, y = torch.randn(16, 6, 24, device=device), torch.tensor([0.0, 1.0] * 8, device=device)
    assert model(x).shape == (16,)
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(200):
        optimiser.zero_grad()
        with autocast(device):
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x).float(), y)
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


def featurised(batch: int, time: int, channels: int = 3) -> torch.Tensor:
    """Random (batch, 2C, time) featurised windows: values, then 0/1 observed-masks with ~10 % missing (value 0)."""
    mask = (torch.rand(batch, channels, time) > 0.1).float()
    return torch.cat([torch.randn(batch, channels, time) * mask, mask], dim=1)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """exported(bins) -> (a calibrated two-member ensemble with `bins` statistics bins, its ONNX file), each exported
    once for this module's tests."""
    made: dict[int, tuple[CalibratedClassifierEnsemble, Path]] = {}

    def export(bins: int) -> tuple[CalibratedClassifierEnsemble, Path]:
        if bins not in made:
            torch.manual_seed(0)
            cfg = SMALL_SENSOR.model_copy(update={"statistics_bins": bins})
            members = [SensorClassifier(6, cfg).fit_statistics(featurised(256, 32).numpy()) for _ in range(2)]
            model = CalibratedClassifierEnsemble(members, 1.7).eval()
            path = export_onnx(model, {"features": featurised(4, 32)}, {"features": {0: "batch", 2: "time"}},
                               ["probability", "uncertainty"], tmp_path_factory.mktemp("sensor") / "sensor.onnx")
            made[bins] = model, path
        return made[bins]

    return export


@pytest.mark.parametrize("bins", [0, 4])
def test_sensor_onnx_matches_torch_on_unseen_batch_and_length(exported, bins):
    model, path = exported(bins)
    session, provider = load_session(path)
    assert provider == "CPUExecutionProvider" or provider == "CUDAExecutionProvider"
    for shape in [(1, 6, 32), (64, 6, 32), (3, 6, 500)]:
        x = featurised(shape[0], shape[2])
        out = run(session, {"features": x.numpy()})
        with torch.no_grad():
            probability, uncertainty = model(x)
        assert np.abs(out["probability"] - probability.numpy()).max() <= 1e-4
        assert np.abs(out["uncertainty"] - uncertainty.numpy()).max() <= 1e-4


def test_int8_quantisation_replaces_conv_and_matmul_and_stays_close(tmp_path, exported):
    import onnx

    from models.quantization import quantize_sensor_model

    _, source = exported(4)
    calibration = featurised(128, 32).numpy()
    target = quantize_sensor_model(source, tmp_path / "int8.onnx", calibration)
    ops = [node.op_type for node in onnx.load(str(target)).graph.node]
    before = [node.op_type for node in onnx.load(str(source)).graph.node]
    assert "Conv" not in ops and ops.count("QLinearConv") == before.count("Conv")
    # every MatMul with a weight matrix is quantised; attention's activation x activation products stay float
    assert ops.count("MatMulInteger") > 0 and ops.count("MatMul") == 2 * 2  # members x (scores, weighted values)
    x = featurised(64, 32).numpy()  # not the calibration windows
    float_out = run(load_session(source, prefer_cuda=False)[0], {"features": x})
    int8_out = run(load_session(target, prefer_cuda=False)[0], {"features": x})
    diff = np.abs(int8_out["probability"] - float_out["probability"])
    assert 0 < diff.max() < 0.05  # int8 moves the outputs, a little
    with pytest.raises(ValueError, match="calibration window"):
        quantize_sensor_model(source, tmp_path / "none.onnx", calibration[:0])


def test_int8_quantisation_of_a_weight_that_two_gemms_share(tmp_path):
    """A Linear run on each fixed-mask pass is one weight read by several Gemms: each is quantised on its own copy."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from models.quantization import quantize_sensor_model

    rng = np.random.default_rng(0)
    weight = rng.normal(size=(3, 8)).astype(np.float32)
    gemms = [helper.make_node("Gemm", [x, "weight"], [f"y{i}"], name=f"gemm{i}", transB=1)
             for i, x in enumerate(["features", "negated"])]
    graph = helper.make_graph(
        [helper.make_node("Neg", ["features"], ["negated"]), *gemms, helper.make_node("Add", ["y0", "y1"], ["probability"])],
        "shared",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("probability", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(weight, "weight")])
    source = tmp_path / "float.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), str(source))
    x = rng.normal(size=(16, 8)).astype(np.float32)
    target = quantize_sensor_model(source, tmp_path / "int8.onnx", x)
    assert [node.op_type for node in onnx.load(str(target)).graph.node].count("MatMulInteger") == 2
    out = run(load_session(target, prefer_cuda=False)[0], {"features": x})["probability"]
    assert np.abs(out).max() < 0.05  # x W^T + (-x) W^T: neither weight transposed twice


def relu_model(folder: Path) -> Path:
    """A one-operator ONNX model (y = relu(x), x of shape (n,)) saved in `folder`."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save(model, folder / "relu.onnx")
    return folder / "relu.onnx"


def test_session_reports_the_provider_it_runs_on_and_a_missing_cuda_stays_quiet(tmp_path, capfd):
    """prefer_cuda: CUDA where its libraries load (the `gpu` extra), else the CPU, without the loader's messages."""
    path = relu_model(tmp_path)
    session, provider = load_session(path, prefer_cuda=True)
    assert provider == session.get_providers()[0]
    assert provider in ("CUDAExecutionProvider", "CPUExecutionProvider")
    np.testing.assert_array_equal(run(session, {"x": np.array([-1.0, 2.0], np.float32)})["y"], [0.0, 2.0])
    if provider == "CPUExecutionProvider":
        assert "Failed to load" not in capfd.readouterr().out
    assert load_session(path, prefer_cuda=False)[1] == "CPUExecutionProvider"


def test_sessions_take_the_thread_count_and_spinning_set_for_them(tmp_path, monkeypatch):
    """The service sets its intra-op threads and turns their spinning off (it burnt the event loop's CPU)."""
    from models import onnx_runtime

    for name in ("_intra_op_threads", "_intra_op_spinning"):  # this process's settings back after the test
        monkeypatch.setattr(onnx_runtime, name, getattr(onnx_runtime, name))
    path = relu_model(tmp_path)
    for threads, spinning, entry in [(2, False, "0"), (1, True, "1")]:
        onnx_runtime.set_intra_op_threads(threads, spinning)
        options = load_session(path, prefer_cuda=False)[0].get_session_options()
        assert options.intra_op_num_threads == threads
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == entry


@pytest.mark.parametrize("variable, threads", [("3", 3), ("2,1", 2), ("many", 0), (None, 0)])
def test_sessions_follow_omp_num_threads_until_the_threads_are_set(tmp_path, variable, threads):
    """OMP_NUM_THREADS (its first level), as torch does; unset or no count: ONNX Runtime's own default (0)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if variable is not None:
        env["OMP_NUM_THREADS"] = variable
    probe = ("import sys; from models.onnx_runtime import load_session; "
             "print(load_session(sys.argv[1], prefer_cuda=False)[0].get_session_options().intra_op_num_threads)")
    out = subprocess.run([sys.executable, "-c", probe, str(relu_model(tmp_path))], env=env, capture_output=True,
                         text=True, check=True, cwd=Path(__file__).resolve().parents[2])
    assert int(out.stdout) == threads
