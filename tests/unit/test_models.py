"""Torch modules: shapes, causality, masking, the ability to fit, and ONNX parity on unseen sizes."""

import numpy as np
import pytest
import torch

from data.molecules.featurize import ATOM_FEATURE_SIZES, BOND_FEATURE_SIZES, batch_graphs, featurize_smiles
from models.export import CalibratedClassifierEnsemble, CalibratedRegressorEnsemble, export_onnx
from models.molecule.config import MoleculeModelConfig
from models.molecule.network import MaskedAtomPrediction, MoleculeEncoder, MoleculeNet
from models.molecule.training import GRAPH_INPUTS
from models.onnx_runtime import load_session, run
from models.sensor.config import SensorModelConfig
from models.sensor.network import CausalConvBlock, MaskedReconstruction, SensorClassifier, random_spans

SMALL_SENSOR = SensorModelConfig(hidden=8, layers=2, dropout=0.0)
SMALL_MOLECULE = MoleculeModelConfig(hidden=16, layers=2, dropout=0.0)


def graph_inputs(smiles):
    arrays = batch_graphs([featurize_smiles(s) for s in smiles])
    return [torch.from_numpy(arrays[name]) for name in GRAPH_INPUTS]


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


def test_molecule_net_handles_a_single_atom_and_fits_a_handful():
    torch.manual_seed(0)
    model = MoleculeNet(ATOM_FEATURE_SIZES, BOND_FEATURE_SIZES, SMALL_MOLECULE)
    assert torch.isfinite(model(*graph_inputs(["C"]))).all()
    smiles = ["CCO", "c1ccccc1", "CC(=O)O", "C[N+](C)(C)C", "O", "CCCCCCCC"]
    y = torch.tensor([-0.5, 1.0, 0.3, -1.2, 2.0, -2.0])
    inputs = graph_inputs(smiles)
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(200):
        optimiser.zero_grad()
        loss = torch.nn.functional.mse_loss(model(*inputs), y)
        loss.backward()
        optimiser.step()
    assert loss.item() < 0.01


def test_masked_atom_prediction_is_a_finite_loss_on_hidden_atoms():
    torch.manual_seed(0)
    encoder = MoleculeEncoder(ATOM_FEATURE_SIZES, BOND_FEATURE_SIZES, SMALL_MOLECULE)
    objective = MaskedAtomPrediction(encoder, ATOM_FEATURE_SIZES[0], SMALL_MOLECULE.hidden)
    atoms, edges, bonds, _, _ = graph_inputs(["CCO", "c1ccncc1"])
    hidden = torch.zeros(len(atoms), dtype=torch.bool)
    hidden[[0, 4]] = True
    loss = objective(atoms, edges, bonds, hidden)
    assert torch.isfinite(loss) and loss.item() > 0
    assert atoms[0, 0] != ATOM_FEATURE_SIZES[0]  # the caller's features are not modified


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


@pytest.mark.parametrize("smiles", [["C"], ["CCO"] * 64, ["c1ccccc1O", "[Na+].[Cl-]", "CC(C)(C)N"]])
def test_molecule_onnx_matches_torch_on_unseen_graph_sizes(tmp_path, smiles):
    torch.manual_seed(0)
    members = [MoleculeNet(ATOM_FEATURE_SIZES, BOND_FEATURE_SIZES, SMALL_MOLECULE) for _ in range(2)]
    model = CalibratedRegressorEnsemble(members, target_mean=-3.0, target_std=2.0, scale=1.5).eval()
    axes = {"atom_features": {0: "atoms"}, "edge_index": {1: "bonds"}, "bond_features": {0: "bonds"},
            "batch": {0: "atoms"}, "graph_mask": {0: "molecules"}}
    example = dict(zip(GRAPH_INPUTS, graph_inputs(["CCN", "c1ccccc1"])))
    path = export_onnx(model, example, axes, ["value", "uncertainty"], tmp_path / "molecule.onnx")
    session, _ = load_session(path, prefer_cuda=False)
    inputs = graph_inputs(smiles)
    out = run(session, {name: t.numpy() for name, t in zip(GRAPH_INPUTS, inputs)})
    with torch.no_grad():
        value, uncertainty = model(*inputs)
    assert out["value"].shape == (len(smiles),)
    assert np.abs(out["value"] - value.numpy()).max() <= 1e-4
    assert np.abs(out["uncertainty"] - uncertainty.numpy()).max() <= 1e-4
