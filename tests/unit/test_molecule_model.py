"""The fused molecule model: modality fallbacks, per-molecule attention, fitting, pretraining objectives,
losses, conformal calibration and ONNX parity on unseen sizes (atoms, bonds, molecules, tokens)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from data.molecules.descriptors import DESCRIPTOR_SIZE, DESCRIPTORS, PHYSICAL_DESCRIPTORS
from data.molecules.featurize import ATOM_FEATURE_SIZES, MODEL_INPUT_AXES, MODEL_INPUTS, batch_inputs, featurize_smiles
from data.molecules.tokenizer import SmilesTokenizer
from models.export import CalibratedRegressorEnsemble, export_onnx
from models.molecule.calibration import fit_conformal_scale, nominal_coverage
from models.molecule import training as molecule_training
from models.molecule.config import MoleculeFinetuneConfig, MoleculeModelConfig, MoleculePretrainConfig
from models.molecule.network import MoleculePretrainer, info_nce
from models.molecule.training import (Molecules, build_model, focal_loss, loss_function, model_arrays,
                                      tensors)
from models.device import autocast
from models.training import TrainingSettings, train
from models.onnx_runtime import load_session, run
from tests.devices import DEVICES

SMALL = MoleculeModelConfig(hidden=16, layers=2, dropout=0.0, heads=2, smiles_layers=1, cross_layers=1,
                            descriptors="rdkit")
HANDFUL = ["CCO", "c1ccccc1", "CC(=O)O", "C[N+](C)(C)C", "O", "CCCCCCCC", "Clc1ccc(Br)cc1", "C1CC1"]
TOKENIZER = SmilesTokenizer.build([featurize_smiles(s).smiles for s in HANDFUL], max_length=24)
CPU = torch.device("cpu")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """As training does on the CPU (models.molecule.training.single_thread_on_cpu): much faster on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def molecules(smiles: list[str]) -> Molecules:
    return Molecules.from_smiles(smiles, TOKENIZER)


def inputs(smiles, drop_tokens=(), drop_graph=()) -> dict[str, np.ndarray]:
    data = molecules(smiles)
    arrays = batch_inputs(data.graphs, [None if i in drop_tokens else t for i, t in enumerate(data.tokens)])
    arrays["graph_mask"][list(drop_graph)] = 0.0
    return arrays


def forward(model, arrays) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(*tensors(arrays, CPU))


def model(modalities="fused", seed=0, **changes):
    torch.manual_seed(seed)
    return build_model(len(TOKENIZER), TOKENIZER.max_length,
                       SMALL.model_copy(update={"modalities": modalities, **changes}))


def test_each_fallback_mode_gives_finite_outputs_that_use_the_present_view():
    net = model()
    smiles = ["CCO", "c1ccccc1O", "C"]
    fused = forward(net, inputs(smiles))
    graph_only = forward(net, inputs(smiles, drop_tokens=(0, 1, 2)))
    smiles_only = forward(net, inputs(smiles, drop_graph=(0, 1, 2)))
    no_views = inputs(smiles, drop_tokens=(0, 1, 2), drop_graph=(0, 1, 2))
    no_views["descriptors"][:] = no_views["descriptors"][0]
    neither = forward(net, no_views)
    for out in (fused, graph_only, smiles_only, neither):
        assert out.shape == (3,) and torch.isfinite(out).all()
    assert not torch.allclose(fused, graph_only) and not torch.allclose(fused, smiles_only)
    # graph only: the (absent) tokens do not matter; SMILES only: the (absent) graph's atom types do not matter
    other = inputs(smiles, drop_graph=(0, 1, 2))
    other["atom_features"][:, 0] = 0
    assert torch.allclose(forward(net, other), smiles_only)
    assert torch.allclose(forward(net, inputs(["CCN", "c1ccccc1O", "C"], drop_tokens=(0, 1, 2)))[1:], graph_only[1:])
    assert torch.allclose(neither, neither[0].expand(3))  # only the (equal) descriptors known: the same answer for all


def test_descriptors_are_standardised_with_stored_training_statistics_and_clipped():
    net = model()
    train = inputs(HANDFUL)["descriptors"].astype(np.float64)
    assert train.shape[1] == DESCRIPTOR_SIZE
    train[:, 3] = 7.0  # a constant column keeps scale 1
    net.fit_descriptor_scaling(train)
    assert np.allclose(net.descriptor_mean.numpy(), train.mean(axis=0))
    expected_scale = train.std(axis=0)
    expected_scale[expected_scale <= 1e-8] = 1.0
    assert expected_scale[3] == 1.0 and np.allclose(net.descriptor_scale.numpy(), expected_scale)
    assert "descriptor_mean" in net.state_dict()  # travels with the checkpoint and into ONNX
    arrays = inputs(["CCO", "c1ccccc1O"])
    base = forward(net, arrays)
    changed = {**arrays, "descriptors": arrays["descriptors"].copy()}
    changed["descriptors"][0, 0] += 3.0  # logP of the first molecule only
    out = forward(net, changed)
    assert not torch.isclose(out[0], base[0]) and torch.isclose(out[1], base[1])
    huge, huger = ({**arrays, "descriptors": np.full_like(arrays["descriptors"], v)} for v in (1e6, 1e9))
    assert torch.allclose(forward(net, huge), forward(net, huger))  # clipped: far outside training is bounded
    plain = build_model(len(TOKENIZER), TOKENIZER.max_length, SMALL.model_copy(update={"descriptors": "none"}))
    assert torch.allclose(forward(plain, arrays), forward(plain, changed))  # descriptors: none ignores them


def test_a_descriptor_set_uses_its_leading_columns_only():
    physical = build_model(len(TOKENIZER), TOKENIZER.max_length, SMALL.model_copy(update={"descriptors": "physical"}))
    full = build_model(len(TOKENIZER), TOKENIZER.max_length, SMALL.model_copy(update={"descriptors": "rdkit"}))
    train = inputs(HANDFUL)["descriptors"]
    for net in (physical, full):
        net.fit_descriptor_scaling(train)
    assert physical.descriptor_mean.shape == (len(PHYSICAL_DESCRIPTORS),)
    arrays = inputs(["CCO", "c1ccccc1O"])
    beyond = {**arrays, "descriptors": arrays["descriptors"].copy()}
    beyond["descriptors"][:, DESCRIPTORS.index("Chi1")] += 50.0  # not in the physical list
    assert torch.allclose(forward(physical, arrays), forward(physical, beyond))
    assert not torch.allclose(forward(full, arrays), forward(full, beyond))


def test_descriptors_name_a_set():
    assert MoleculeModelConfig(descriptors="physical").descriptors == "physical"
    for value in (True, False, "all"):
        with pytest.raises(ValueError, match="descriptors"):
            MoleculeModelConfig(descriptors=value)


def test_attention_stays_inside_each_molecule():
    net = model()
    a = forward(net, inputs(["CCO", "c1ccccc1O", "CCCCN"]))
    b = forward(net, inputs(["CCO", "Clc1ccc(Br)cc1", "CCCCN"]))  # only the middle molecule changes
    assert torch.allclose(a[[0, 2]], b[[0, 2]], atol=1e-6) and not torch.allclose(a[1], b[1])
    alone = forward(net, inputs(["CCCCN"]))
    assert torch.allclose(alone, a[2:], atol=1e-6)


def test_single_view_models_ignore_the_other_view():
    graph_model, smiles_model = model("graph"), model("smiles")
    base = inputs(["CCO", "c1ccccc1"])
    no_tokens = inputs(["CCO", "c1ccccc1"], drop_tokens=(0, 1))
    assert torch.allclose(forward(graph_model, base), forward(graph_model, no_tokens))
    scrambled = dict(base, atom_features=np.zeros_like(base["atom_features"]))
    assert torch.allclose(forward(smiles_model, base), forward(smiles_model, scrambled))


@pytest.mark.parametrize("device", DEVICES)
def test_fused_model_fits_a_handful_and_its_fallbacks_stay_finite(device):
    """As training runs it: bf16 autocast on CUDA, plain float32 on the CPU."""
    net = model().to(device)
    y = torch.tensor([-0.5, 1.0, 0.3, -1.2, 2.0, -2.0, 0.8, -0.1], device=device)
    batch = tensors(inputs(HANDFUL), device)
    optimiser = torch.optim.Adam(net.parameters(), lr=1e-2)
    net.train()
    for _ in range(150):
        optimiser.zero_grad()
        with autocast(device):
            loss = torch.nn.functional.mse_loss(net(*batch).float(), y)
        loss.backward()
        optimiser.step()
    assert loss.item() < 0.01
    net.cpu()
    for arrays in (inputs(HANDFUL, drop_tokens=range(8)), inputs(HANDFUL, drop_graph=range(8))):
        assert torch.isfinite(forward(net, arrays)).all()


def test_training_augmentation_hides_at_most_one_view_per_molecule():
    data = molecules(HANDFUL * 8)
    arrays = model_arrays(data, np.random.default_rng(0), sign_flip=True, modality_dropout=0.3)
    no_graph = arrays["graph_mask"] == 0
    no_smiles = (arrays["tokens"] == 0).all(axis=1)
    assert no_graph.any() and no_smiles.any() and not (no_graph & no_smiles).any()
    plain = model_arrays(data)
    assert (plain["graph_mask"] == 1).all() and not (plain["tokens"] == 0).all(axis=1).any()
    assert not np.isnan(arrays["descriptors"]).any() and not np.isnan(plain["descriptors"]).any()
    # descriptor dropout: descriptors hidden only with a hidden graph, in part of those
    hidden = model_arrays(data, np.random.default_rng(0), modality_dropout=0.3, descriptor_dropout=0.5)
    no_graph, no_descriptors = hidden["graph_mask"] == 0, np.isnan(hidden["descriptors"]).all(axis=1)
    assert not (no_descriptors & ~no_graph).any() and 0 < no_descriptors.sum() < no_graph.sum()


@pytest.mark.parametrize("device", DEVICES)
def test_pretraining_objectives_are_finite_and_leave_inputs_alone(device):
    net = model()
    objective = MoleculePretrainer(net, ATOM_FEATURE_SIZES, len(TOKENIZER), SMALL.hidden, contrastive_weight=0.5,
                                   temperature=0.1).to(device)
    batch = tensors(inputs(["CCO", "c1ccncc1", "CC(=O)O"]), device)
    atoms, tokens = batch[0].clone(), batch[MODEL_INPUTS.index("tokens")].clone()
    hidden_atoms = torch.zeros(len(atoms), dtype=torch.bool, device=device)
    hidden_atoms[[0, 4]] = True
    hidden_tokens = torch.zeros_like(tokens, dtype=torch.bool)
    hidden_tokens[:, 1] = True
    with autocast(device):
        total, parts = objective(*batch, hidden_atoms, hidden_tokens)
    assert set(parts) == {"masked_atom", "masked_token", "contrastive"}
    assert torch.isfinite(total) and all(v.item() > 0 for v in parts.values())
    total.backward()
    assert net.smiles_encoder.token_embedding.weight.grad.abs().sum() > 0
    assert net.encoder.positional.weight.grad.abs().sum() > 0
    assert torch.equal(batch[0], atoms) and torch.equal(batch[MODEL_INPUTS.index("tokens")], tokens)


def test_a_hidden_atom_shows_none_of_its_own_features():
    """Masked-atom pretraining: what the graph view sees of a hidden atom does not depend on its features (its
    aromaticity, hybridisation or hydrogens would give its element away)."""
    net = model().eval()
    objective = MoleculePretrainer(net, ATOM_FEATURE_SIZES, len(TOKENIZER), SMALL.hidden, contrastive_weight=0.5,
                                   temperature=0.1).eval()
    batch = tensors(inputs(["c1ccncc1", "CCO"]), CPU)
    names = ["atom_features", "positional", "edge_index", "bond_features"]
    atoms, positional, edges, bonds = (batch[MODEL_INPUTS.index(n)] for n in names)
    nitrogen = int(torch.nonzero(atoms[:6, 0] == 1)[0])  # the pyridine N (element 1): aromatic, sp2, no hydrogen
    other = atoms.clone()
    other[nitrogen, 1:] = (other[nitrogen, 1:] + 1) % torch.tensor(ATOM_FEATURE_SIZES[1:])  # every other feature moved
    hidden = torch.zeros(len(atoms), dtype=torch.bool)
    hidden[nitrogen] = True
    with torch.no_grad():
        assert torch.equal(objective.atoms.states(atoms, positional, edges, bonds, hidden),
                           objective.atoms.states(other, positional, edges, bonds, hidden))
        shown = torch.zeros_like(hidden)
        assert not torch.allclose(objective.atoms.states(atoms, positional, edges, bonds, shown),
                                  objective.atoms.states(other, positional, edges, bonds, shown))


@pytest.mark.parametrize("sign_flip", [True, False])
def test_pretraining_flips_eigenvector_signs_only_when_told(monkeypatch, sign_flip):
    flipped = []
    real_flip = molecule_training.random_sign_flip
    monkeypatch.setattr(molecule_training, "random_sign_flip", lambda *args: flipped.append(1) or real_flip(*args))
    cfg = MoleculePretrainConfig(epochs=1, batch_size=4, sign_flip=sign_flip)
    molecule_training.pretrain_model(molecules(HANDFUL), len(TOKENIZER), TOKENIZER.max_length, SMALL, cfg, CPU)
    assert bool(flipped) is sign_flip


def test_info_nce_prefers_aligned_pairs():
    torch.manual_seed(0)
    a = torch.randn(8, 16)
    assert info_nce(a, a + 0.01 * torch.randn(8, 16), 0.1) < info_nce(a, a[torch.randperm(8)], 0.1)


def test_losses_from_params():
    logits, y = torch.tensor([2.0, -1.0, 0.5]), torch.tensor([1.0, 0.0, 0.0])
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, y)
    assert torch.isclose(focal_loss(logits, y, 0.0), bce)
    assert focal_loss(logits, y, 2.0) < bce  # easy examples down-weighted
    cfg = MoleculeFinetuneConfig(regression_loss="huber", huber_delta=0.5, classification_loss="focal")
    assert torch.isclose(loss_function("regression", cfg)(torch.tensor([3.0]), torch.tensor([0.0])),
                         torch.tensor(0.5 * (3.0 - 0.25)))
    assert torch.isclose(loss_function("classification", cfg)(logits, y), focal_loss(logits, y, 2.0))


def test_train_applies_the_lr_schedule_per_epoch(monkeypatch):
    lrs, original = [], torch.optim.AdamW.step

    def spy(self, *args, **kwargs):
        lrs.append(self.param_groups[0]["lr"])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", spy)
    net = torch.nn.Linear(2, 1)
    train(net, lambda epoch: [torch.ones(4, 2)] * 2, lambda model, batch: model(batch).pow(2).mean(), None,
          TrainingSettings(epochs=3, lr=0.01, lr_schedule=lambda epoch: 1.0 / (epoch + 1)), device=CPU)
    assert lrs == pytest.approx([0.01, 0.01, 0.005, 0.005, 0.01 / 3, 0.01 / 3])


def test_conformal_scale_covers_at_the_nominal_level():
    rng = np.random.default_rng(0)
    spread = rng.uniform(0.2, 2.0, 4000)
    residuals = rng.standard_t(3, 4000) * spread  # heavy tails: a normal z would under-cover
    scale = fit_conformal_scale(residuals[:1000], spread[:1000], 1.96)
    covered = np.abs(residuals[1000:]) <= 1.96 * scale * spread[1000:]
    assert abs(covered.mean() - nominal_coverage(1.96)) < 0.02
    assert scale > 1.05  # t(3) is wider than a unit normal


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    scaled = model(seed=1)  # one member with fitted descriptor scaling: its statistics export too
    scaled.fit_descriptor_scaling(inputs(HANDFUL)["descriptors"])
    ensemble = CalibratedRegressorEnsemble([model(seed=0), scaled], target_mean=-3.0, target_std=2.0,
                                           scale=1.5).eval()
    example = inputs(["CCN", "c1ccccc1", "CCO"])
    path = export_onnx(ensemble, {k: torch.from_numpy(example[k]) for k in MODEL_INPUTS}, MODEL_INPUT_AXES,
                       ["value", "uncertainty"], tmp_path_factory.mktemp("onnx") / "molecule.onnx")
    return ensemble, load_session(path, prefer_cuda=False)[0], path


@pytest.mark.parametrize("smiles, drop_tokens, drop_graph", [
    (["C"], (), ()),
    (["CCO"] * 64, (), ()),
    (["c1ccccc1O", "[Na+].[Cl-]", "CC(C)(C)N", "Clc1ccc(Br)cc1CCCCCCCC"], (1,), (2,)),
    (["CCCCCCCCCCCCCCCCCCCC", "C1CC1"], (0, 1), ()),
    (["CCCCCCCCCCCCCCCCCCCC", "C1CC1"], (), (0, 1)),
])
def test_onnx_matches_torch_on_unseen_sizes_and_fallbacks(exported, smiles, drop_tokens, drop_graph):
    ensemble, session, _ = exported
    arrays = inputs(smiles, drop_tokens, drop_graph)
    out = run(session, arrays)
    value, uncertainty = forward(ensemble, arrays)
    assert out["value"].shape == (len(smiles),)
    assert np.abs(out["value"] - value.numpy()).max() <= 1e-4
    assert np.abs(out["uncertainty"] - uncertainty.numpy()).max() <= 1e-4


def test_bucketed_batches_cover_every_molecule_once_with_less_padding():
    from models.molecule.training import bucketed_batches
    data = molecules(HANDFUL * 16)
    batches = list(bucketed_batches(data, 8, seed=0, bucket=4))
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(data)))
    lengths = np.array([len(t) for t in data.tokens])
    padded = sum(len(b) * lengths[b].max() for b in batches)
    shuffled = np.random.default_rng(0).permutation(len(data))
    plain = sum(8 * lengths[shuffled[i:i + 8]].max() for i in range(0, len(data), 8))
    assert padded < plain
    again = list(bucketed_batches(data, 8, seed=0, bucket=4))
    assert all(np.array_equal(a, b) for a, b in zip(batches, again))


def test_predictor_answers_from_smiles_with_errors_and_graph_only_fallback(exported):
    from data.molecules.featurize import FEATURIZER_VERSION
    from models.predictors import MoleculePredictor
    ensemble, _, path = exported
    card = {"task": "regression", "featurizer_version": FEATURIZER_VERSION, "tokenizer": TOKENIZER.to_dict()}
    predictor = MoleculePredictor(path, card, prefer_cuda=False)
    long = "C" * 40  # 40 tokens: more than max_length 24 takes
    out = predictor.predict(["OCC", "C1CC", long, "[Na+].[Cl-]"])
    assert out["error"][0] is None and "C1CC" in out["error"][1] and out["error"][2] is None
    assert np.isfinite(out["prediction"][[0, 2, 3]]).all() and np.isnan(out["prediction"][1])
    assert out["modality"].tolist() == ["fused", None, "graph_only", "fused"]
    expected, _ = forward(ensemble, inputs(["CCO"]))  # a raw SMILES is standardised and canonicalised first
    assert abs(out["prediction"][0] - expected.item()) <= 1e-4
    with pytest.raises(ValueError, match="featurizer version"):
        MoleculePredictor(path, {**card, "featurizer_version": "1"}, prefer_cuda=False)


def test_unknown_descriptors_count_as_the_training_mean():
    net = model()
    net.fit_descriptor_scaling(np.stack([g.descriptors for g in molecules(HANDFUL).graphs]))
    arrays = inputs(["CCO", "c1ccccc1O"])
    arrays["descriptors"][0, :] = np.nan
    arrays["descriptors"][1, 3] = np.nan
    out = forward(net, arrays)
    arrays["descriptors"][0, :] = net.descriptor_mean.numpy()
    arrays["descriptors"][1, 3] = net.descriptor_mean[3].item()
    assert torch.isfinite(out).all() and torch.allclose(out, forward(net, arrays))


def test_a_graph_less_molecule_is_answered_as_its_smiles_view_with_unknown_descriptors():
    from data.molecules.featurize import graph_less
    net = model()
    net.fit_descriptor_scaling(np.stack([g.descriptors for g in molecules(HANDFUL).graphs]))
    data = molecules(["c1ccccc1O", "CC(=O)O"])
    hidden = Molecules([graph_less(g.smiles, "hidden") for g in data.graphs], data.tokens)
    arrays = model_arrays(hidden)
    assert arrays["graph_mask"].tolist() == [0.0, 0.0] and np.isnan(arrays["descriptors"]).all()
    expected = inputs(["c1ccccc1O", "CC(=O)O"], drop_graph=(0, 1))  # the real graphs, hidden by the mask
    expected["descriptors"][:] = net.descriptor_mean.numpy()
    assert torch.allclose(forward(net, arrays), forward(net, expected), atol=1e-6)


def test_featurisation_falls_back_to_the_smiles_view_where_the_graph_cannot_be_built():
    from data.molecules.featurize import featurize_or_smiles_view
    from data.molecules.standardize import InvalidSmilesError
    hypervalent = featurize_or_smiles_view("[Na+].OC(=O)C(C)(C)(C)(C)C")  # a five-bonded carbon: RDKit refuses it
    assert not hypervalent.has_graph and "valence" in hypervalent.graph_error
    assert hypervalent.smiles == "CC(C)(C)(C)(C)C(=O)O"  # the largest fragment, canonical
    assert np.isnan(hypervalent.descriptors).all()  # nothing RDKit can compute them from
    large = featurize_or_smiles_view("c1ccccc1" + "C" * 20, max_heavy_atoms=10)
    assert not large.has_graph and "26 heavy atoms" in large.graph_error and large.smiles.startswith("CCCC")
    assert np.array_equal(large.descriptors, featurize_smiles("c1ccccc1" + "C" * 20).descriptors)  # a valid molecule keeps them
    assert featurize_or_smiles_view("c1ccccc1O").has_graph
    for text in ("C1CC", "", "(("):
        with pytest.raises(InvalidSmilesError):
            featurize_or_smiles_view(text)


def test_predictor_answers_a_molecule_without_its_graph_from_its_smiles_where_the_card_allows(exported):
    from data.molecules.featurize import FEATURIZER_VERSION, featurize_or_smiles_view
    from models.predictors import MoleculePredictor
    ensemble, _, path = exported
    card = {"task": "regression", "featurizer_version": FEATURIZER_VERSION, "tokenizer": TOKENIZER.to_dict()}
    hypervalent, too_long = "CC(C)(C)(C)(C)C", "CC(C)(C)(C)(C)" + "C" * 30
    out = MoleculePredictor(path, {**card, "smiles_only": True}, prefer_cuda=False).predict(["CCO", hypervalent,
                                                                                             too_long])
    assert out["modality"].tolist() == ["fused", "smiles_only", None]
    assert out["error"][0] is None and out["error"][1] is None and "longer than the model's tokenizer" in out["error"][2]
    graph = featurize_or_smiles_view(hypervalent)
    arrays = batch_inputs([graph], [TOKENIZER.encode(graph.smiles)])
    expected, _ = forward(ensemble, arrays)
    assert np.isfinite(out["prediction"][:2]).all() and abs(out["prediction"][1] - expected.item()) <= 1e-4
    older = MoleculePredictor(path, card, prefer_cuda=False).predict([hypervalent])  # a card without `smiles_only`
    assert older["modality"].tolist() == [None] and "cannot answer from the SMILES alone" in older["error"][0]
    assert np.isnan(older["prediction"][0])


def test_the_export_parity_check_skips_smiles_views_the_tokenizer_cannot_take(exported):
    """A molecule too long for the tokenizer has no SMILES view to answer from without its graph: the export's
    parity check compares only the answers there are."""
    from data.molecules.featurize import FEATURIZER_VERSION
    from flows.molecule.onnx_export import parity
    from models.predictors import MoleculePredictor
    ensemble, _, path = exported
    card = {"task": "regression", "featurizer_version": FEATURIZER_VERSION, "tokenizer": TOKENIZER.to_dict(),
            "smiles_only": True}
    smiles = ["CCO", "c1ccccc1O", "OCC" + "C" * 30]
    molecules = Molecules.from_smiles(smiles, TOKENIZER)
    assert molecules.tokens[2] is None and molecules.tokens[0] is not None
    assert parity.fn(ensemble, MoleculePredictor(path, card, prefer_cuda=False), molecules, smiles) <= 1e-4


def test_featurisation_runs_its_linear_algebra_on_one_blas_thread_where_the_process_allows_more(exported, monkeypatch):
    from threadpoolctl import threadpool_info, threadpool_limits

    from data.molecules import featurize as featurize_module
    from models.predictors import MoleculePredictor

    def blas_threads() -> set[int]:
        return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}

    seen, encodings = [], featurize_module.positional_encodings

    def recording(edge_index, n_atoms):
        seen.append(blas_threads())
        return encodings(edge_index, n_atoms)

    monkeypatch.setattr(featurize_module, "positional_encodings", recording)
    _, _, path = exported
    card = {"task": "regression", "featurizer_version": featurize_module.FEATURIZER_VERSION,
            "tokenizer": TOKENIZER.to_dict()}
    predictor = MoleculePredictor(path, card, prefer_cuda=False)
    with threadpool_limits(2, user_api="blas"):
        if blas_threads() != {2}:
            pytest.skip(f"this machine's BLAS does not take 2 threads ({blas_threads()})")
        Molecules.from_smiles(["CCO", "c1ccccc1"], TOKENIZER)  # the stages' featurisation
        predictor.predict(["CCN"])  # the register stage's check of the exported model
        assert blas_threads() == {2}  # the process's own limit comes back
    assert seen == [{1}, {1}, {1}]
