"""Molecular graphs of categorical atom/bond indices (numpy + RDKit), shared by training and serving.

Every feature column is an index into a small vocabulary; the last index of an open vocabulary is the
unknown bucket (booleans have exactly two values). Atoms are put in RDKit's canonical order and edges
sorted, so any SMILES of the same standardised molecule gives identical arrays. Per-atom structural encodings
(Laplacian eigenvectors, random-walk landing probabilities) come from data/molecules/encodings.py, whole-molecule
descriptors from data/molecules/descriptors.py; the SMILES
view is the canonical SMILES of the standardised molecule (`MolGraph.smiles`), tokenised by
data/molecules/tokenizer.py. A molecule whose graph cannot be built (more heavy atoms than the structural encodings
take, or RDKit cannot sanitise or standardise it) but whose text is SMILES syntax still has its SMILES view
(`smiles_view_only`): a MolGraph without the graph, which the model answers from its tokens alone. Bump
FEATURIZER_VERSION whenever a vocabulary, an encoding or the standardisation changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from rdkit import Chem, rdBase
from threadpoolctl import threadpool_limits

from data.molecules.descriptors import DESCRIPTOR_SIZE, molecule_descriptors
from data.molecules.encodings import POSITIONAL_SIZE, positional_encodings
from data.molecules.standardize import MAX_HEAVY_ATOMS, InvalidSmilesError, parse_smiles, standardize_mol
from data.molecules.tokenizer import SmilesTokenError, SmilesTokenizer, pad_tokens

FEATURIZER_VERSION = "5"  # 2: structural encodings (Laplacian k=8, random walk k=8), atom_mask, SMILES tokens;
                          # 3: whole-molecule RDKit descriptors; 4: no Laplacian eigenvectors of repeated eigenvalues;
                          # 5: all of RDKit's 2D descriptors (data/molecules/descriptors.py)

ELEMENTS = ["C", "N", "O", "S", "F", "Cl", "Br", "I", "P", "B", "Si", "Se"]
DEGREES = [0, 1, 2, 3, 4, 5]
FORMAL_CHARGES = [-2, -1, 0, 1, 2]
HYBRIDIZATIONS = [
    Chem.HybridizationType.SP,
    Chem.HybridizationType.SP2,
    Chem.HybridizationType.SP3,
    Chem.HybridizationType.SP3D,
    Chem.HybridizationType.SP3D2,
]
TOTAL_HS = [0, 1, 2, 3, 4]
BOND_TYPES = [Chem.BondType.SINGLE, Chem.BondType.DOUBLE, Chem.BondType.TRIPLE, Chem.BondType.AROMATIC]
BOND_STEREOS = [
    Chem.BondStereo.STEREONONE,
    Chem.BondStereo.STEREOANY,
    Chem.BondStereo.STEREOZ,
    Chem.BondStereo.STEREOE,
    Chem.BondStereo.STEREOCIS,
    Chem.BondStereo.STEREOTRANS,
]

ATOM_FEATURES = ["element", "degree", "formal_charge", "aromatic", "hybridization", "total_hs", "in_ring"]
ATOM_FEATURE_SIZES = [len(ELEMENTS) + 1, len(DEGREES) + 1, len(FORMAL_CHARGES) + 1, 2, len(HYBRIDIZATIONS) + 1, len(TOTAL_HS) + 1, 2]
BOND_FEATURES = ["bond_type", "conjugated", "in_ring", "stereo"]
BOND_FEATURE_SIZES = [len(BOND_TYPES) + 1, 2, 2, len(BOND_STEREOS) + 1]


@dataclass
class MolGraph:
    """One molecule: atom_features int64 (N, A), edge_index int64 (2, E) both directions of each bond, bond_features
    int64 (E, B), positional float32 (N, POSITIONAL_SIZE) structural encodings, descriptors float32
    (DESCRIPTOR_SIZE,) whole-molecule descriptors, smiles: its canonical SMILES. `graph_error` says why a molecule
    has no graph view (`smiles_view_only`); it is None where the graph is there."""

    atom_features: np.ndarray
    edge_index: np.ndarray
    bond_features: np.ndarray
    positional: np.ndarray
    descriptors: np.ndarray
    smiles: str = ""
    graph_error: str | None = None

    @property
    def has_graph(self) -> bool:
        return self.graph_error is None

    @property
    def num_atoms(self) -> int:
        return int(self.atom_features.shape[0])

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])


def _index(vocab: list, value) -> int:
    """Position of `value` in `vocab`, or len(vocab) (the unknown bucket)."""
    return vocab.index(value) if value in vocab else len(vocab)


def _atom_row(atom: Chem.Atom) -> list[int]:
    """The ATOM_FEATURES indices (A,) of one atom."""
    return [
        _index(ELEMENTS, atom.GetSymbol()),
        _index(DEGREES, atom.GetDegree()),
        _index(FORMAL_CHARGES, atom.GetFormalCharge()),
        int(atom.GetIsAromatic()),
        _index(HYBRIDIZATIONS, atom.GetHybridization()),
        _index(TOTAL_HS, atom.GetTotalNumHs()),
        int(atom.IsInRing()),
    ]


def _bond_row(bond: Chem.Bond) -> list[int]:
    """The BOND_FEATURES indices (B,) of one bond."""
    return [
        _index(BOND_TYPES, bond.GetBondType()),
        int(bond.GetIsConjugated()),
        int(bond.IsInRing()),
        _index(BOND_STEREOS, bond.GetStereo()),
    ]


def featurize_mol(mol: Chem.Mol) -> MolGraph:
    """Graph of `mol` as given (no standardisation); atoms in canonical rank order, edges sorted by (source, target)."""
    ranks = list(Chem.CanonicalRankAtoms(mol))
    mol = Chem.RenumberAtoms(mol, [int(i) for i in np.argsort(ranks)])
    atoms = np.array([_atom_row(a) for a in mol.GetAtoms()], dtype=np.int64).reshape(-1, len(ATOM_FEATURES))
    edges, feats = [], []
    for bond in mol.GetBonds():
        u, v, row = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx(), _bond_row(bond)
        edges += [(u, v), (v, u)]
        feats += [row, row]
    order = sorted(range(len(edges)), key=edges.__getitem__)
    edge_index = np.array([edges[i] for i in order], dtype=np.int64).reshape(-1, 2).T
    bond_features = np.array([feats[i] for i in order], dtype=np.int64).reshape(-1, len(BOND_FEATURES))
    edge_index = np.ascontiguousarray(edge_index)
    return MolGraph(atom_features=atoms, edge_index=edge_index, bond_features=bond_features,
                    positional=positional_encodings(edge_index, len(atoms)), descriptors=molecule_descriptors(mol),
                    smiles=Chem.MolToSmiles(mol))


def one_blas_thread() -> threadpool_limits:
    """A context in which BLAS and LAPACK run on one thread: the structural encodings' eigendecomposition and walk
    powers are on matrices of tens of atoms, where more threads only add their start-up and, when the cores are busy,
    wait for them (docs/decisions/0010-one-blas-thread.md). Featurise many molecules inside one such context: entering
    it reads which BLAS libraries are loaded, which costs a millisecond or two."""
    return threadpool_limits(1, user_api="blas")


def featurize_smiles(smiles: str, max_heavy_atoms: int | None = MAX_HEAVY_ATOMS) -> MolGraph:
    """Parse, standardise (as in training) and featurise one SMILES; raises InvalidSmilesError (MoleculeTooLargeError
    above `max_heavy_atoms`, before any expensive step)."""
    return featurize_mol(standardize_mol(parse_smiles(smiles, max_heavy_atoms)))


def graph_less(smiles: str, graph_error: str) -> MolGraph:
    """A molecule's SMILES view alone (`smiles`: the SMILES its tokens come from; `graph_error`: why it has no graph
    view): one placeholder atom of unknown features and no bonds (the model sees `graph_mask` 0 and ignores it), and
    descriptors NaN (unknown: the model puts its training mean in their place)."""
    return MolGraph(atom_features=np.array([[size - 1 for size in ATOM_FEATURE_SIZES]], dtype=np.int64),
                    edge_index=np.zeros((2, 0), dtype=np.int64),
                    bond_features=np.zeros((0, len(BOND_FEATURES)), dtype=np.int64),
                    positional=np.zeros((1, POSITIONAL_SIZE), dtype=np.float32),
                    descriptors=np.full(DESCRIPTOR_SIZE, np.nan, dtype=np.float32), smiles=smiles,
                    graph_error=graph_error)


def smiles_view_only(smiles: str, graph_error: str) -> MolGraph:
    """`graph_less` of a SMILES whose graph could not be built (`graph_error` says why), with RDKit's canonical SMILES
    of its largest fragment, and its descriptors where RDKit can sanitise that fragment (else sanitised but for the
    valence check, descriptors unknown). Raises InvalidSmilesError (with `graph_error`)
    where the text is not SMILES syntax."""
    text = smiles.strip() if isinstance(smiles, str) else ""
    with rdBase.BlockLogs():
        mol = Chem.MolFromSmiles(text, sanitize=False) if text else None
        if mol is None or mol.GetNumAtoms() == 0:
            raise InvalidSmilesError(graph_error)
        fragments = Chem.GetMolFrags(mol, asMols=True, sanitizeFrags=False)
        mol = max(fragments, key=lambda f: sum(a.GetAtomicNum() > 1 for a in f.GetAtoms()))
        sanitised = Chem.Mol(mol)
        if Chem.SanitizeMol(sanitised, catchErrors=True) == Chem.SanitizeFlags.SANITIZE_NONE:
            view = graph_less(Chem.MolToSmiles(sanitised), graph_error)
            view.descriptors = molecule_descriptors(sanitised)
            return view
        Chem.SanitizeMol(mol, Chem.SanitizeFlags.SANITIZE_ALL ^ Chem.SanitizeFlags.SANITIZE_PROPERTIES,
                         catchErrors=True)
        return graph_less(Chem.MolToSmiles(mol), graph_error)


def featurize_or_smiles_view(smiles: str, max_heavy_atoms: int | None = MAX_HEAVY_ATOMS) -> MolGraph:
    """`featurize_smiles`, or where the graph cannot be built, `smiles_view_only`; raises InvalidSmilesError where
    neither can be had (empty text, not SMILES syntax)."""
    try:
        return featurize_smiles(smiles, max_heavy_atoms)
    except InvalidSmilesError as error:
        return smiles_view_only(smiles, str(error))


def batch_graphs(graphs: list[MolGraph]) -> dict[str, np.ndarray]:
    """Disjoint union of G >= 1 graphs: atom_features (N, A), edge_index (2, E) offset per graph, bond_features (E, B),
    positional (N, P) float32, batch (N,) int64 graph index of each atom (non-decreasing), atom_mask (G, L) float32
    (1 for the first n_g slots of molecule g, L the largest molecule), graph_mask (G,) float32 (1 where the graph
    view is there, 0 for `smiles_view_only`), descriptors (G, DESCRIPTOR_SIZE) float32 (NaN: unknown)."""
    if not graphs:
        raise ValueError("batch_graphs needs at least one graph")
    sizes = [g.num_atoms for g in graphs]
    offsets = np.cumsum([0, *sizes[:-1]], dtype=np.int64)
    return {
        "atom_features": np.concatenate([g.atom_features for g in graphs]),
        "edge_index": np.concatenate([g.edge_index + o for g, o in zip(graphs, offsets)], axis=1),
        "bond_features": np.concatenate([g.bond_features for g in graphs]),
        "positional": np.concatenate([g.positional for g in graphs]).astype(np.float32).reshape(-1, POSITIONAL_SIZE),
        "batch": np.repeat(np.arange(len(graphs), dtype=np.int64), sizes),
        "atom_mask": (np.arange(max(sizes))[None, :] < np.array(sizes)[:, None]).astype(np.float32),
        "graph_mask": np.array([g.has_graph for g in graphs], dtype=np.float32),
        "descriptors": np.stack([g.descriptors for g in graphs]).astype(np.float32).reshape(-1, DESCRIPTOR_SIZE),
    }


# The model's inputs, in order (data/molecules/featurize.batch_inputs builds them; the ONNX file takes them by name).
MODEL_INPUTS = ["atom_features", "edge_index", "bond_features", "positional", "batch", "atom_mask", "graph_mask", "tokens",
                "descriptors"]
# The sizes of each input that vary between batches, by axis (the ONNX export's dynamic axes).
MODEL_INPUT_AXES = {"atom_features": {0: "atoms"}, "edge_index": {1: "bonds"}, "bond_features": {0: "bonds"},
                    "positional": {0: "atoms"}, "batch": {0: "atoms"}, "atom_mask": {0: "molecules", 1: "slots"},
                    "graph_mask": {0: "molecules"}, "tokens": {0: "molecules", 1: "tokens"},
                    "descriptors": {0: "molecules"}}


def encode_tokens(graphs: list[MolGraph], tokenizer: SmilesTokenizer) -> list[np.ndarray | None]:
    """Token ids of each graph's canonical SMILES; None where it is longer than the tokenizer takes (that molecule
    is then answered from its graph alone)."""
    out = []
    for g in graphs:
        try:
            out.append(tokenizer.encode(g.smiles))
        except SmilesTokenError:
            out.append(None)
    return out


def batch_inputs(graphs: list[MolGraph], tokens: list[np.ndarray | None]) -> dict[str, np.ndarray]:
    """All MODEL_INPUTS of G molecules: `batch_graphs` plus tokens (G, T) int64 padded with [PAD] (0); a molecule
    without tokens has an all-[PAD] row (graph only). graph_mask (G,) 1 marks that the graph view is present."""
    arrays = batch_graphs(graphs)
    arrays["tokens"] = pad_tokens(tokens)
    return arrays
