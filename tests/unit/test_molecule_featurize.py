"""Featurisation of hand-checked molecules and graph batching."""

from __future__ import annotations

import numpy as np
import pytest

from data.molecules.featurize import (
    ATOM_FEATURE_SIZES,
    ATOM_FEATURES,
    BOND_FEATURE_SIZES,
    BOND_TYPES,
    DEGREES,
    ELEMENTS,
    FORMAL_CHARGES,
    batch_graphs,
    featurize_smiles,
)
from data.molecules.standardize import InvalidSmilesError, canonical_smiles, parse_smiles
from rdkit import Chem
from rdkit.Chem import Descriptors

ELEMENT, DEGREE, CHARGE, AROMATIC, HYBRID, TOTAL_H, IN_RING = range(len(ATOM_FEATURES))
BOND_TYPE, CONJUGATED, BOND_RING, STEREO = range(4)


def _check_shapes(g, n_atoms, n_edges):
    assert g.atom_features.shape == (n_atoms, len(ATOM_FEATURE_SIZES)) and g.atom_features.dtype == np.int64
    assert g.edge_index.shape == (2, n_edges) and g.edge_index.dtype == np.int64
    assert g.bond_features.shape == (n_edges, len(BOND_FEATURE_SIZES)) and g.bond_features.dtype == np.int64
    assert (g.atom_features < np.array(ATOM_FEATURE_SIZES)).all() and (g.atom_features >= 0).all()
    assert (g.bond_features < np.array(BOND_FEATURE_SIZES)).all() and (g.bond_features >= 0).all()


def test_ethanol():
    g = featurize_smiles("CCO")
    _check_shapes(g, 3, 4)
    elements = [ELEMENTS[i] for i in g.atom_features[:, ELEMENT]]
    assert sorted(elements) == ["C", "C", "O"]
    o = elements.index("O")
    assert DEGREES[g.atom_features[o, DEGREE]] == 1
    assert g.atom_features[o, TOTAL_H] == 1
    # the C bonded to O has degree 2 and 2 H; the methyl has degree 1 and 3 H
    assert sorted(g.atom_features[:, DEGREE].tolist()) == [1, 1, 2]
    assert sorted(g.atom_features[:, TOTAL_H].tolist()) == [1, 2, 3]
    assert (g.atom_features[:, AROMATIC] == 0).all() and (g.atom_features[:, IN_RING] == 0).all()
    # each bond in both directions
    pairs = set(map(tuple, g.edge_index.T.tolist()))
    assert len(pairs) == 4 and all((v, u) in pairs for u, v in pairs)
    assert (g.bond_features[:, BOND_TYPE] == BOND_TYPES.index(Chem.BondType.SINGLE)).all()


def test_benzene_aromatic_ring():
    g = featurize_smiles("c1ccccc1")
    _check_shapes(g, 6, 12)
    assert (g.atom_features[:, AROMATIC] == 1).all() and (g.atom_features[:, IN_RING] == 1).all()
    assert (g.atom_features[:, DEGREE] == 2).all()
    assert (g.bond_features[:, BOND_TYPE] == BOND_TYPES.index(Chem.BondType.AROMATIC)).all()
    assert (g.bond_features[:, BOND_RING] == 1).all() and (g.bond_features[:, CONJUGATED] == 1).all()
    assert np.bincount(g.edge_index[0], minlength=6).tolist() == [2] * 6


def test_quaternary_ammonium_keeps_its_charge():
    g = featurize_smiles("C[N+](C)(C)C")
    _check_shapes(g, 5, 8)
    n = [ELEMENTS[i] for i in g.atom_features[:, ELEMENT]].index("N")
    assert FORMAL_CHARGES[g.atom_features[n, CHARGE]] == 1
    assert DEGREES[g.atom_features[n, DEGREE]] == 4
    assert g.atom_features[n, TOTAL_H] == 0


def test_salt_is_stripped_and_neutralised():
    g = featurize_smiles("CC(=O)[O-].[Na+]")
    assert g.num_atoms == 4
    assert (np.array(FORMAL_CHARGES)[g.atom_features[:, CHARGE]] == 0).all()
    assert canonical_smiles("CC(=O)[O-].[Na+]") == "CC(=O)O"


def test_single_atom_has_no_edges():
    g = featurize_smiles("C")
    _check_shapes(g, 1, 0)
    assert g.atom_features[0, TOTAL_H] == 4 and g.atom_features[0, DEGREE] == 0


def test_unknown_element_goes_to_the_unknown_bucket():
    g = featurize_smiles("[Te]")
    assert g.atom_features[0, ELEMENT] == len(ELEMENTS) == ATOM_FEATURE_SIZES[ELEMENT] - 1


def test_same_molecule_any_smiles_gives_identical_arrays():
    for a, b in [("CCO", "OCC"), ("Oc1ccccc1C", "Cc1ccccc1O"), ("CC(=O)[O-].[Na+]", "OC(C)=O")]:
        ga, gb = featurize_smiles(a), featurize_smiles(b)
        for field in ("atom_features", "edge_index", "bond_features"):
            np.testing.assert_array_equal(getattr(ga, field), getattr(gb, field))
    # training featurises the cleaned canonical SMILES; serving the raw one
    raw = "C[NH+](C)CCc1ccc(O)cc1.[Cl-]"
    np.testing.assert_array_equal(featurize_smiles(raw).atom_features, featurize_smiles(canonical_smiles(raw)).atom_features)


@pytest.mark.parametrize("bad, words", [("", "empty"), ("   ", "empty"), ("C1CC", "syntax"), ("c1cccc1", "kekulize"), ("CN(=O)(=O)(=O)C", "valence")])
def test_invalid_smiles_raise_clear_errors(bad, words):
    with pytest.raises(InvalidSmilesError) as err:
        featurize_smiles(bad)
    assert words in str(err.value).lower()


def test_batch_graphs_offsets():
    graphs = [featurize_smiles(s) for s in ("CCO", "C", "c1ccccc1")]
    b = batch_graphs(graphs)
    assert b["atom_features"].shape == (10, len(ATOM_FEATURE_SIZES))
    assert b["edge_index"].shape == (2, 16) and b["bond_features"].shape == (16, len(BOND_FEATURE_SIZES))
    assert b["batch"].tolist() == [0, 0, 0, 1, 2, 2, 2, 2, 2, 2]
    assert b["graph_mask"].dtype == np.float32 and b["graph_mask"].tolist() == [1.0, 1.0, 1.0]
    np.testing.assert_array_equal(b["edge_index"][:, :4], graphs[0].edge_index)
    np.testing.assert_array_equal(b["edge_index"][:, 4:], graphs[2].edge_index + 4)
    # every edge stays inside its own graph
    assert (b["batch"][b["edge_index"][0]] == b["batch"][b["edge_index"][1]]).all()
    for key in ("atom_features", "edge_index", "bond_features", "batch"):
        assert b[key].dtype == np.int64


# ------------------------------------------------------------------ structural encodings (data/molecules/encodings.py)
from data.molecules.encodings import LAPLACIAN_K, POSITIONAL_SIZE, RANDOM_WALK_K, random_sign_flip  # noqa: E402


def _laplacian(g):
    return g.positional[:, :LAPLACIAN_K]


def _random_walk(g):
    return g.positional[:, LAPLACIAN_K:]


def test_ethanol_encodings_by_hand():
    g = featurize_smiles("CCO")
    assert g.positional.shape == (3, POSITIONAL_SIZE) and g.positional.dtype == np.float32
    middle = int(np.argmax(g.atom_features[:, DEGREE]))  # the CH2
    ends = [i for i in range(3) if i != middle]
    # path graph of 3 atoms: normalised-Laplacian eigenvalues 0, 1, 2; eigenvalue 1 lives on the two ends only
    lap = _laplacian(g)
    assert lap[middle, 0] == pytest.approx(0.0, abs=1e-6)
    assert sorted(lap[ends, 0].tolist()) == pytest.approx([-2 ** -0.5, 2 ** -0.5], abs=1e-6)
    assert (lap[:, 2:] == 0).all()  # only N - 1 = 2 non-trivial eigenvectors: the rest is padding
    # return probabilities: none after 1 step; after 2: 1 from the middle, 1/2 from an end
    rw = _random_walk(g)
    assert (rw[:, 0] == 0).all()
    assert rw[middle, 1] == pytest.approx(1.0) and rw[ends, 1] == pytest.approx([0.5, 0.5])


def test_benzene_encodings_by_hand():
    g = featurize_smiles("c1ccccc1")
    lap = _laplacian(g)
    # eigenvalues 0, 0.5, 0.5, 1.5, 1.5, 2: the two double ones give zero columns, eigenvalue 2 the alternating
    # vector (+-1/sqrt 6, bonded atoms of opposite sign, the first atom positive); the 6th column onwards pads
    assert (lap[:, :4] == 0).all() and (lap[:, 5:] == 0).all()
    np.testing.assert_allclose(np.abs(lap[:, 4]), 6 ** -0.5, atol=1e-6)
    assert lap[0, 4] > 0 and (lap[g.edge_index[0], 4] * lap[g.edge_index[1], 4] < 0).all()
    # closed walks on a 6-cycle: odd lengths none; t = 2, 4, 6: 2/4, 6/16, 22/64 of all walks
    rw = _random_walk(g)
    np.testing.assert_allclose(rw[:, [0, 2, 4]], 0, atol=1e-7)
    np.testing.assert_allclose(rw[:, [1, 3, 5]], np.tile([0.5, 0.375, 22 / 64], (6, 1)), atol=1e-6)


@pytest.mark.parametrize("smiles", ["c1ccccc1", "C[N+](C)(C)C", "Cc1ccccc1", "C1CC2CCC1CC2"])
def test_laplacian_encodings_follow_the_atoms_when_they_are_reordered(smiles):
    """Inside a repeated eigenvalue eigh may return any rotation (it differs between orderings and LAPACK builds):
    under a permutation of the atoms every column follows its atoms, up to the sign training randomises anyway."""
    from data.molecules.encodings import laplacian_eigenvectors

    g = featurize_smiles(smiles)
    n = len(g.atom_features)
    lap = laplacian_eigenvectors(g.edge_index, n)
    for seed in range(5):
        order = np.random.default_rng(seed).permutation(n)  # new atom i is old atom order[i]
        relabel = np.argsort(order)
        permuted = laplacian_eigenvectors(relabel[g.edge_index], n)
        np.testing.assert_allclose(np.abs(permuted), np.abs(lap[order]), atol=1e-5)


def test_charged_star_encodings():
    g = featurize_smiles("C[N+](C)(C)C")
    n = [ELEMENTS[i] for i in g.atom_features[:, ELEMENT]].index("N")
    rw = _random_walk(g)
    assert rw[n, 1] == pytest.approx(1.0)  # the centre: out to a methyl and surely back
    assert np.delete(rw[:, 1], n) == pytest.approx([0.25] * 4)  # a methyl: back to itself 1 time in 4


def test_single_atom_encodings_are_zero():
    g = featurize_smiles("C")
    assert g.positional.shape == (1, POSITIONAL_SIZE) and (g.positional == 0).all()


def test_encodings_do_not_depend_on_the_input_smiles():
    a, b = featurize_smiles("Oc1ccccc1CCN"), featurize_smiles("NCCc1ccccc1O")
    np.testing.assert_array_equal(a.positional, b.positional)
    assert a.smiles == b.smiles == canonical_smiles("NCCc1ccccc1O")


def test_sign_flip_touches_only_laplacian_columns_one_sign_per_molecule():
    graphs = [featurize_smiles(s) for s in ("c1ccccc1O", "CCCCN")]
    b = batch_graphs(graphs)
    flipped = random_sign_flip(b["positional"], b["batch"], 2, np.random.default_rng(3))
    np.testing.assert_array_equal(flipped[:, LAPLACIAN_K:], b["positional"][:, LAPLACIAN_K:])
    for g in range(2):
        rows = b["batch"] == g
        original, new = b["positional"][rows, :LAPLACIAN_K], flipped[rows, :LAPLACIAN_K]
        assert np.allclose(np.abs(new), np.abs(original))
        for col in range(LAPLACIAN_K):
            assert np.allclose(new[:, col], original[:, col]) or np.allclose(new[:, col], -original[:, col])
    assert RANDOM_WALK_K + LAPLACIAN_K == POSITIONAL_SIZE


from data.molecules.descriptors import DESCRIPTOR_SETS, DESCRIPTOR_SIZE, DESCRIPTORS, PHYSICAL_DESCRIPTORS  # noqa: E402


def _descriptor(g, name):
    return float(g.descriptors[DESCRIPTORS.index(name)])


def test_descriptors_of_ethanol_and_benzene_by_hand():
    ethanol, benzene = featurize_smiles("CCO"), featurize_smiles("c1ccccc1")
    for g in (ethanol, benzene):
        assert g.descriptors.shape == (DESCRIPTOR_SIZE,) and g.descriptors.dtype == np.float32
    # C2H6O: 2 * 12.011 + 6 * 1.008 + 15.999; one OH donor and acceptor, both carbons sp3, no rings
    assert _descriptor(ethanol, "MolWt") == pytest.approx(46.069, abs=1e-3)
    assert [_descriptor(ethanol, n) for n in ("HeavyAtomCount", "NumHDonors", "NumHAcceptors", "RingCount")] == [3, 1, 1, 0]
    assert _descriptor(ethanol, "FractionCSP3") == 1.0
    assert _descriptor(ethanol, "TPSA") == pytest.approx(20.23)  # Ertl's hydroxyl contribution
    # C6H6: one aromatic ring, no polar surface, no sp3 carbon; more lipophilic than ethanol
    assert [_descriptor(benzene, n) for n in ("RingCount", "NumAromaticRings", "TPSA", "FractionCSP3")] == [1, 1, 0, 0]
    assert _descriptor(benzene, "MolLogP") > _descriptor(ethanol, "MolLogP") + 1


def test_descriptors_do_not_depend_on_the_input_smiles_and_batch_per_molecule():
    a, b = featurize_smiles("OCC"), featurize_smiles("C(O)C")
    assert np.array_equal(a.descriptors, b.descriptors)
    batch = batch_graphs([featurize_smiles("CCO"), featurize_smiles("[Na+]"), featurize_smiles("c1ccccc1")])
    assert batch["descriptors"].shape == (3, DESCRIPTOR_SIZE) and batch["descriptors"].dtype == np.float32
    assert np.array_equal(batch["descriptors"][0], a.descriptors)
    assert np.isfinite(batch["descriptors"]).all()


def test_each_descriptor_set_is_a_leading_block_of_the_pinned_list():
    assert DESCRIPTORS[:len(PHYSICAL_DESCRIPTORS)] == PHYSICAL_DESCRIPTORS and len(set(DESCRIPTORS)) == DESCRIPTOR_SIZE
    assert DESCRIPTOR_SETS == {"rdkit": DESCRIPTOR_SIZE, "physical": len(PHYSICAL_DESCRIPTORS), "none": 0}
    assert not {"Ipc", "AvgIpc", "BertzCT", "BalabanJ", "BCUT2D_MWHI"} & set(DESCRIPTORS)  # slow on large molecules
    # a large, branched molecule: every value finite and within float32 (cyclosporin-like peptide macrocycle)
    big = featurize_smiles("CC[C@H](C)[C@@H]1NC(=O)[C@H](Cc2ccccc2)N(C)C(=O)[C@H](CC(C)C)NC(=O)[C@@H](C(C)C)"
                           "N(C)C(=O)[C@H](CCCNC(N)=N)NC(=O)[C@H](CO)NC(=O)[C@H](Cc2ccc(O)cc2)N(C)C1=O")
    assert np.isfinite(big.descriptors).all() and _descriptor(big, "fr_guanido") == 1


def test_descriptors_equal_rdkits_own_functions():  # the E-state ones are computed once, not four times
    functions = dict(Descriptors.descList)
    for smiles in ("CCO", "C[N+](C)(C)C", "OC(=O)c1ccccc1OC(C)=O", "C1CC2CCC1C2"):
        g = featurize_smiles(smiles)
        mol = parse_smiles(smiles)
        expected = np.array([functions[name](mol) for name in DESCRIPTORS], dtype=np.float32)
        assert np.allclose(g.descriptors, expected, rtol=1e-6, atol=1e-6), smiles
