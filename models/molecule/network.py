"""Fused graph + SMILES model of molecules and its pretraining objectives.

Inputs follow data/molecules/featurize.batch_inputs (MODEL_INPUTS):
atom_features (N, A) and bond_features (E, B) categorical indices, edge_index (2, E), positional (N, P) float
structural encodings, batch (N,) molecule index per atom (non-decreasing), atom_mask (G, L) 1 for the atom slots
of each molecule (L: the largest molecule), graph_mask (G,) 1 where the graph view is present, tokens (G, T)
SMILES token ids padded with 0 ([PAD]); an all-[PAD] row means that molecule has no SMILES view; descriptors
(G, DESCRIPTOR_SIZE) raw whole-molecule RDKit descriptors (data/molecules/descriptors.py).

graph:  GINE message passing with bond features (PyG) over atom embeddings + encodings -> atom states (N, H)
SMILES: token + position embeddings -> transformer layers -> token states (G, T, H)
cross:  atoms are scattered to a dense (G, L, H) per-molecule layout (positions computed from `batch` and
        `atom_mask`, so every size stays dynamic in ONNX); atoms attend to their molecule's tokens and tokens to
        their molecule's atoms (key-padding masks), both directions per layer
pool:   per view and molecule, [mean, sum / SIZE_NORM] -> linear (the sum keeps the molecule's size, which
        extensive properties such as solubility need; chemprop's default aggregation is sum / 100) -> gated fusion g * graph + (1 - g) * smiles; where one view is
        absent the other is used alone (neither: zeros)
descriptors: the leading D columns of the set `descriptors` names (all of RDKit's, or the short physical list;
        `none`: not used), standardised with training-set statistics stored in the model (buffers, so they travel
        into ONNX), an unknown one (NaN: a molecule without its graph view) set to the training mean, clipped to
        +-DESCRIPTOR_CLIP, MLP -> (G, H) concatenated to the fused embedding
head:   MLP, one output per molecule (G,)
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch_geometric.nn import GINEConv

from data.molecules.descriptors import DESCRIPTOR_SETS
from data.molecules.encodings import POSITIONAL_SIZE
from data.molecules.tokenizer import MASK_ID, PAD_ID
from models.molecule.config import MoleculeModelConfig

NEG = -1e9  # additive mask for absent keys (finite: an all-absent row gives zeros, never NaN)
SIZE_NORM = 10.0  # sum pooling / SIZE_NORM: order one for typical drug-like molecules
DESCRIPTOR_CLIP = 6.0  # standardised descriptors are clipped to +-this: a molecule far outside training cannot blow up


class CategoricalEmbedding(nn.Module):
    """Sum of one embedding per categorical column: (n, K) int64 -> (n, H).

    Every column gets one extra row at index `size`, used as the [MASK] value in pretraining.
    """

    def __init__(self, sizes: list[int], hidden: int):
        super().__init__()
        self.sizes = list(sizes)
        self.tables = nn.ModuleList(nn.Embedding(size + 1, hidden) for size in sizes)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return sum(table(features[:, i]) for i, table in enumerate(self.tables))


def segment_mean(values: torch.Tensor, index: torch.Tensor, n_groups: int) -> torch.Tensor:
    """(n, H) rows averaged per group index (n,) -> (n_groups, H); empty groups give zeros."""
    sums = values.new_zeros(n_groups, values.shape[1]).index_add(0, index, values)
    counts = values.new_zeros(n_groups).index_add(0, index, torch.ones_like(index, dtype=values.dtype))
    return sums / counts.clamp(min=1).unsqueeze(-1)


def segment_pool(values: torch.Tensor, index: torch.Tensor, n_groups: int) -> torch.Tensor:
    """(n, H) rows per group -> (n_groups, 2H): [mean, sum / SIZE_NORM]; empty groups give zeros."""
    sums = values.new_zeros(n_groups, values.shape[1]).index_add(0, index, values)
    counts = values.new_zeros(n_groups).index_add(0, index, torch.ones_like(index, dtype=values.dtype))
    return torch.cat([sums / counts.clamp(min=1).unsqueeze(-1), sums / SIZE_NORM], dim=-1)


def masked_pool(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(G, L, H) over the positions where mask (G, L) is 1 -> (G, 2H): [mean, sum / SIZE_NORM]."""
    sums = (values * mask.unsqueeze(-1)).sum(dim=1)
    return torch.cat([sums / mask.sum(dim=1, keepdim=True).clamp(min=1), sums / SIZE_NORM], dim=-1)


def dense_slots(batch: torch.Tensor, atom_mask: torch.Tensor) -> torch.Tensor:
    """Flat slot (N,) of each atom in a (G * L) layout: batch * L + position within its molecule."""
    counts = atom_mask.sum(dim=1).to(batch.dtype)
    offsets = torch.cumsum(counts, dim=0) - counts
    position = torch.arange(batch.shape[0], dtype=batch.dtype, device=batch.device) - offsets[batch]
    return batch * atom_mask.shape[1] + position


class Attention(nn.Module):
    """Multi-head attention of queries (G, Lq, H) over keys/values (G, Lk, H) with a key mask (G, Lk) of 1/0."""

    def __init__(self, hidden: int, heads: int, dropout: float):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
        self.heads, self.size = heads, hidden // heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.out = nn.Linear(hidden, hidden)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], x.shape[1], self.heads, self.size).transpose(1, 2)

    def forward(self, query: torch.Tensor, keys: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(self.query(query)), self._split(self.key(keys)), self._split(self.value(keys))
        mask = key_mask[:, None, None, :]
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.size) + (1.0 - mask) * NEG
        weights = torch.softmax(scores, dim=-1) * mask  # no dropout on the weights: costly on CPU, little gain
        out = (weights @ v).transpose(1, 2).reshape(query.shape[0], query.shape[1], -1)
        return self.out(out)


class FeedForward(nn.Sequential):
    def __init__(self, hidden: int, dropout: float):
        super().__init__(nn.Linear(hidden, 2 * hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(2 * hidden, hidden))


class TransformerLayer(nn.Module):
    """Pre-norm self-attention + feed-forward over (G, T, H) with a mask (G, T)."""

    def __init__(self, hidden: int, heads: int, dropout: float):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.attention = Attention(hidden, heads, dropout)
        self.feed = FeedForward(hidden, dropout)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.drop(self.attention(h, h, mask))
        return x + self.drop(self.feed(self.norm2(x)))


class CrossLayer(nn.Module):
    """Bidirectional cross-attention: atoms (G, L, H) <- tokens (G, T, H) and tokens <- atoms, then feed-forwards."""

    def __init__(self, hidden: int, heads: int, dropout: float):
        super().__init__()
        self.norm_a, self.norm_t = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.atoms_from_tokens = Attention(hidden, heads, dropout)
        self.tokens_from_atoms = Attention(hidden, heads, dropout)
        self.norm_a2, self.norm_t2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.feed_a, self.feed_t = FeedForward(hidden, dropout), FeedForward(hidden, dropout)
        self.drop = nn.Dropout(dropout)

    def forward(self, atoms, atom_keys, tokens, token_keys):
        a, t = self.norm_a(atoms), self.norm_t(tokens)
        atoms = atoms + self.drop(self.atoms_from_tokens(a, t, token_keys))
        tokens = tokens + self.drop(self.tokens_from_atoms(t, a, atom_keys))
        atoms = atoms + self.drop(self.feed_a(self.norm_a2(atoms)))
        return atoms, tokens + self.drop(self.feed_t(self.norm_t2(tokens)))


class MoleculeEncoder(nn.Module):
    """Graph view. Atoms (N, A), encodings (N, P), bonds (E, B) -> atom states (N, H) via `atoms`."""

    def __init__(self, atom_sizes: list[int], bond_sizes: list[int], cfg: MoleculeModelConfig):
        super().__init__()
        self.atom_embedding = CategoricalEmbedding(atom_sizes, cfg.hidden)
        self.positional = nn.Linear(POSITIONAL_SIZE, cfg.hidden)
        self.bond_embedding = CategoricalEmbedding(bond_sizes, cfg.hidden)
        self.convs = nn.ModuleList(
            GINEConv(nn.Sequential(nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, cfg.hidden)))
            for _ in range(cfg.layers)
        )
        self.norms = nn.ModuleList(nn.LayerNorm(cfg.hidden) for _ in range(cfg.layers))
        self.drop = nn.Dropout(cfg.dropout)

    def atoms(self, atom_features, positional, edge_index, bond_features) -> torch.Tensor:
        h = self.atom_embedding(atom_features) + self.positional(positional)
        e = self.bond_embedding(bond_features)
        for conv, norm in zip(self.convs, self.norms):
            h = h + self.drop(torch.relu(norm(conv(h, edge_index, e))))
        return h

    def forward(self, atom_features, positional, edge_index, bond_features, batch, n_graphs: int) -> torch.Tensor:
        """Molecule embeddings (G, H): mean of atom states."""
        return segment_mean(self.atoms(atom_features, positional, edge_index, bond_features), batch, n_graphs)


class SmilesEncoder(nn.Module):
    """SMILES view. Tokens (G, T) -> token states (G, T, H) and their mask (G, T) (1 where not [PAD])."""

    def __init__(self, vocab_size: int, max_length: int, cfg: MoleculeModelConfig):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, cfg.hidden, padding_idx=PAD_ID)
        self.position_embedding = nn.Embedding(max_length, cfg.hidden)
        self.layers = nn.ModuleList(TransformerLayer(cfg.hidden, cfg.heads, cfg.dropout) for _ in range(cfg.smiles_layers))
        self.norm = nn.LayerNorm(cfg.hidden)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = (tokens != PAD_ID).to(torch.float32)
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions).unsqueeze(0)
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x), mask


class MoleculeNet(nn.Module):
    """Graph encoder + SMILES encoder + cross-attention + gated fusion (+ descriptors) + head: one output per
    molecule (G,). Call `fit_descriptor_scaling` with the training molecules' descriptors before training."""

    def __init__(self, atom_sizes: list[int], bond_sizes: list[int], vocab_size: int, max_length: int,
                 cfg: MoleculeModelConfig):
        super().__init__()
        self.modalities, self.hidden = cfg.modalities, cfg.hidden
        self.descriptor_count = DESCRIPTOR_SETS[cfg.descriptors]  # leading columns used (0: none)
        self.use_graph, self.use_smiles = cfg.modalities in ("fused", "graph"), cfg.modalities in ("fused", "smiles")
        self.encoder = MoleculeEncoder(atom_sizes, bond_sizes, cfg)
        self.smiles_encoder = SmilesEncoder(vocab_size, max_length, cfg)
        self.cross = nn.ModuleList(CrossLayer(cfg.hidden, cfg.heads, cfg.dropout) for _ in range(cfg.cross_layers))
        self.graph_pool = nn.Linear(2 * cfg.hidden, cfg.hidden)
        self.smiles_pool = nn.Linear(2 * cfg.hidden, cfg.hidden)
        self.gate = nn.Sequential(nn.Linear(2 * cfg.hidden, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, cfg.hidden))
        if self.descriptor_count:
            self.register_buffer("descriptor_mean", torch.zeros(self.descriptor_count))
            self.register_buffer("descriptor_scale", torch.ones(self.descriptor_count))
            self.descriptor_mlp = nn.Sequential(nn.Linear(self.descriptor_count, cfg.hidden), nn.ReLU(),
                                                nn.Linear(cfg.hidden, cfg.hidden))
        head_in = cfg.hidden * (2 if self.descriptor_count else 1)
        self.head = nn.Sequential(
            nn.Linear(head_in, cfg.hidden), nn.ReLU(), nn.Dropout(cfg.dropout), nn.Linear(cfg.hidden, 1)
        )

    def fit_descriptor_scaling(self, descriptors) -> None:
        """Store the mean and standard deviation (a constant column: 1) of the used columns of training descriptors
        (n, DESCRIPTOR_SIZE); no-op without descriptors."""
        if not self.descriptor_count:
            return
        values = torch.as_tensor(descriptors, dtype=torch.float64)[:, :self.descriptor_count]
        std = values.std(dim=0, unbiased=False)
        self.descriptor_mean.copy_(values.mean(dim=0))
        self.descriptor_scale.copy_(torch.where(std > 1e-8, std, torch.ones_like(std)))

    def scaled_descriptors(self, descriptors: torch.Tensor) -> torch.Tensor:
        """Raw descriptors (G, DESCRIPTOR_SIZE) -> the used columns standardised, NaN -> 0, clipped (G, D)."""
        scaled = (descriptors[:, :self.descriptor_count] - self.descriptor_mean) / self.descriptor_scale
        return torch.where(torch.isnan(scaled), 0.0, scaled).clamp(-DESCRIPTOR_CLIP, DESCRIPTOR_CLIP)

    def embed(self, atom_features, edge_index, bond_features, positional, batch, atom_mask, graph_mask, tokens):
        """Fused molecule embeddings (G, H)."""
        n_graphs, hidden = atom_mask.shape[0], self.hidden
        has_graph = graph_mask * float(self.use_graph)                                           # (G,)
        has_smiles = (tokens[:, 0] != PAD_ID).to(torch.float32) * float(self.use_smiles)        # (G,)
        if self.use_graph:
            atoms = self.encoder.atoms(atom_features, positional, edge_index, bond_features)     # (N, H)
        if self.use_smiles:
            token_states, token_mask = self.smiles_encoder(tokens)                              # (G, T, H), (G, T)
        if self.use_graph and self.use_smiles and len(self.cross):
            slots = dense_slots(batch, atom_mask)
            dense = atoms.new_zeros(n_graphs * atom_mask.shape[1], hidden).index_copy(0, slots, atoms)
            dense = dense.reshape(n_graphs, atom_mask.shape[1], hidden)
            atom_keys = atom_mask * has_graph.unsqueeze(-1)
            token_keys = token_mask * has_smiles.unsqueeze(-1)
            for layer in self.cross:
                dense, token_states = layer(dense, atom_keys, token_states, token_keys)
            atoms = dense.reshape(-1, hidden).index_select(0, slots)
        zeros = atom_mask.new_zeros(n_graphs, hidden)
        graph = self.graph_pool(segment_pool(atoms, batch, n_graphs)) if self.use_graph else zeros
        smiles = self.smiles_pool(masked_pool(token_states, token_mask)) if self.use_smiles else zeros
        gate = torch.sigmoid(self.gate(torch.cat([graph, smiles], dim=-1)))
        g, s = has_graph.unsqueeze(-1), has_smiles.unsqueeze(-1)
        both = gate * graph + (1.0 - gate) * smiles
        return g * s * both + g * (1.0 - s) * graph + (1.0 - g) * s * smiles

    def forward(self, atom_features, edge_index, bond_features, positional, batch, atom_mask, graph_mask, tokens,
                descriptors):
        embedding = self.embed(atom_features, edge_index, bond_features, positional, batch, atom_mask, graph_mask, tokens)
        if self.descriptor_count:
            embedding = torch.cat([embedding, self.descriptor_mlp(self.scaled_descriptors(descriptors))], dim=-1)
        return self.head(embedding).squeeze(-1)


class MaskedAtomPrediction(nn.Module):
    """Hide some atoms and predict their element from the graph view. A hidden atom shows none of its own
    features (each column gets its table's spare mask index, `feature_sizes[i]`): aromaticity, hybridisation and
    hydrogen count would give the element away. Its bonds and structural encodings stay.

    forward(atom_features (N, A), positional, edge_index, bond_features, hidden (N,) bool) -> cross entropy on hidden atoms.
    """

    def __init__(self, encoder: MoleculeEncoder, feature_sizes: list[int], hidden: int):
        super().__init__()
        self.encoder = encoder
        self.register_buffer("mask_ids", torch.tensor(feature_sizes, dtype=torch.long), persistent=False)
        self.classifier = nn.Linear(hidden, feature_sizes[0])

    def states(self, atom_features, positional, edge_index, bond_features, hidden):
        masked = torch.where(hidden.unsqueeze(-1), self.mask_ids, atom_features)
        return self.encoder.atoms(masked, positional, edge_index, bond_features)

    def loss(self, states, atom_features, hidden) -> torch.Tensor:
        return nn.functional.cross_entropy(self.classifier(states[hidden]), atom_features[hidden, 0])

    def forward(self, atom_features, positional, edge_index, bond_features, hidden: torch.Tensor) -> torch.Tensor:
        return self.loss(self.states(atom_features, positional, edge_index, bond_features, hidden), atom_features, hidden)


def info_nce(a: torch.Tensor, b: torch.Tensor, temperature: float) -> torch.Tensor:
    """Symmetric InfoNCE of paired rows (G, D): row i of `a` and row i of `b` are the positive pair."""
    a, b = nn.functional.normalize(a, dim=-1), nn.functional.normalize(b, dim=-1)
    logits = a @ b.T / temperature
    labels = torch.arange(a.shape[0], device=a.device)
    return 0.5 * (nn.functional.cross_entropy(logits, labels) + nn.functional.cross_entropy(logits.T, labels))


class MoleculePretrainer(nn.Module):
    """Masked atom prediction (graph view) + masked token prediction (SMILES view) + InfoNCE alignment of the
    pooled graph and SMILES embeddings of the same molecules (both views see their masked inputs).

    forward(atom_features, edge_index, bond_features, positional, batch, atom_mask, graph_mask, tokens, descriptors,
            hidden_atoms (N,) bool, hidden_tokens (G, T) bool)
    -> (total loss, {name: loss}); descriptors are not used
    """

    def __init__(self, model: MoleculeNet, atom_feature_sizes: list[int], vocab_size: int, hidden: int,
                 contrastive_weight: float, temperature: float):
        super().__init__()
        self.model = model
        self.atoms = MaskedAtomPrediction(model.encoder, atom_feature_sizes, hidden)
        self.token_classifier = nn.Linear(hidden, vocab_size)
        self.graph_projection = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
        self.smiles_projection = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
        self.contrastive_weight = contrastive_weight
        self.temperature = temperature

    def forward(self, atom_features, edge_index, bond_features, positional, batch, atom_mask, graph_mask, tokens,
                descriptors, hidden_atoms, hidden_tokens):
        parts = {}
        n_graphs = atom_mask.shape[0]
        states = self.atoms.states(atom_features, positional, edge_index, bond_features, hidden_atoms)
        parts["masked_atom"] = self.atoms.loss(states, atom_features, hidden_atoms)
        token_states, token_mask = self.model.smiles_encoder(torch.where(hidden_tokens, MASK_ID, tokens))
        parts["masked_token"] = nn.functional.cross_entropy(self.token_classifier(token_states[hidden_tokens]),
                                                            tokens[hidden_tokens])
        total = parts["masked_atom"] + parts["masked_token"]
        if self.contrastive_weight > 0 and n_graphs > 1:
            graph = self.graph_projection(self.model.graph_pool(segment_pool(states, batch, n_graphs)))
            smiles = self.smiles_projection(self.model.smiles_pool(masked_pool(token_states, token_mask)))
            parts["contrastive"] = info_nce(graph, smiles, self.temperature)
            total = total + self.contrastive_weight * parts["contrastive"]
        return total, parts
