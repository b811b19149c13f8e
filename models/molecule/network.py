"""Graph encoder over RDKit molecular graphs (PyG GINE layers) and its heads.

Inputs follow data/molecules/featurize.batch_graphs: atom_features (N, A) and bond_features (E, B)
categorical indices, edge_index (2, E), batch (N,) graph index per atom, graph_mask (G,) whose length
is the number of molecules (so exported graphs keep G dynamic).
"""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn import GINEConv

from models.molecule.config import MoleculeModelConfig


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


class MoleculeEncoder(nn.Module):
    """Atoms (N, A), bonds (E, B) -> atom states (N, H) via `atoms`; molecule embeddings (G, H) via `forward`."""

    def __init__(self, atom_sizes: list[int], bond_sizes: list[int], cfg: MoleculeModelConfig):
        super().__init__()
        self.atom_embedding = CategoricalEmbedding(atom_sizes, cfg.hidden)
        self.bond_embedding = CategoricalEmbedding(bond_sizes, cfg.hidden)
        self.convs = nn.ModuleList(
            GINEConv(nn.Sequential(nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, cfg.hidden)))
            for _ in range(cfg.layers)
        )
        self.norms = nn.ModuleList(nn.LayerNorm(cfg.hidden) for _ in range(cfg.layers))
        self.drop = nn.Dropout(cfg.dropout)

    def atoms(self, atom_features: torch.Tensor, edge_index: torch.Tensor, bond_features: torch.Tensor) -> torch.Tensor:
        h = self.atom_embedding(atom_features)
        e = self.bond_embedding(bond_features)
        for conv, norm in zip(self.convs, self.norms):
            h = h + self.drop(torch.relu(norm(conv(h, edge_index, e))))
        return h

    def forward(self, atom_features, edge_index, bond_features, batch, graph_mask) -> torch.Tensor:
        h = self.atoms(atom_features, edge_index, bond_features)
        n_graphs = graph_mask.shape[0]
        sums = torch.zeros(n_graphs, h.shape[1], dtype=h.dtype, device=h.device).index_add(0, batch, h)
        counts = torch.zeros(n_graphs, dtype=h.dtype, device=h.device).index_add(
            0, batch, torch.ones_like(batch, dtype=h.dtype)
        )
        return sums / counts.clamp(min=1).unsqueeze(-1)


class MoleculeNet(nn.Module):
    """Encoder + MLP head: one output per molecule (G,), a standardised value or a logit."""

    def __init__(self, atom_sizes: list[int], bond_sizes: list[int], cfg: MoleculeModelConfig):
        super().__init__()
        self.encoder = MoleculeEncoder(atom_sizes, bond_sizes, cfg)
        self.head = nn.Sequential(
            nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU(), nn.Dropout(cfg.dropout), nn.Linear(cfg.hidden, 1)
        )

    def forward(self, atom_features, edge_index, bond_features, batch, graph_mask) -> torch.Tensor:
        return self.head(self.encoder(atom_features, edge_index, bond_features, batch, graph_mask)).squeeze(-1)


class MaskedAtomPrediction(nn.Module):
    """Pretraining objective: hide the element of some atoms and predict it from the graph.

    forward(atom_features (N, A), edge_index, bond_features, hidden (N,) bool) -> cross entropy on hidden atoms.
    """

    def __init__(self, encoder: MoleculeEncoder, n_elements: int, hidden: int):
        super().__init__()
        self.encoder = encoder
        self.n_elements = n_elements
        self.classifier = nn.Linear(hidden, n_elements)

    def forward(self, atom_features, edge_index, bond_features, hidden: torch.Tensor) -> torch.Tensor:
        elements = atom_features[:, 0]
        masked = atom_features.clone()
        masked[:, 0] = torch.where(hidden, torch.full_like(elements, self.n_elements), elements)
        logits = self.classifier(self.encoder.atoms(masked, edge_index, bond_features))
        return nn.functional.cross_entropy(logits[hidden], elements[hidden])
