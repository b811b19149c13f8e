"""The random forest baseline's predictions are the same to the last bit in every run."""

from __future__ import annotations

import numpy as np

from data.molecules.fingerprints import morgan_counts
from flows.molecule.family import fit_random_forest

SMILES = ["CCO", "CCCO", "CCCCO", "c1ccccc1", "c1ccccc1O", "CC(=O)O", "CCN", "CCCl", "OCCO", "CC(C)O",
          "c1ccncc1", "CCOCC", "CC#N", "C1CCCCC1", "CC(=O)C", "NCCO"]


def test_forest_sums_its_trees_in_order():
    y = np.linspace(-2.0, 1.0, len(SMILES))
    forest = fit_random_forest.fn(SMILES, y, "regression", n_trees=500, seed=0, max_heavy_atoms=200)
    x = morgan_counts(SMILES, max_heavy_atoms=200)
    in_order = np.zeros(len(SMILES))
    for tree in forest.estimators_:
        in_order += tree.predict(x)
    assert np.array_equal(forest.predict(x), in_order / len(forest.estimators_))
