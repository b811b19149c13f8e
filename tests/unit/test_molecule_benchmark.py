"""bench/molecule_benchmark.py: its variants are params.yaml with the keys of bench/recipes/molecule_ablations.yaml set,
and the one that leaves params.yaml as it is is the headline."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import molecule_benchmark as bench
from flows.params import load_params, with_overrides
from tests.unit.test_params import settings

PROJECT = Path(__file__).resolve().parents[2]


def test_the_headline_variant_is_params_yaml_as_it_is():
    params = load_params(PROJECT / "params.yaml")
    assert [n for n in bench.VARIANTS if bench.variant(params, n) == params.molecule] == ["fused_pre"]
    off = with_overrides(params, {"molecule.pretrain.enabled": False})
    assert [n for n in bench.VARIANTS if bench.variant(off, n) == off.molecule] == ["fused"]


@pytest.mark.parametrize("name", sorted(bench.VARIANTS))
def test_a_variant_sets_the_keys_it_names_and_nothing_else(name):
    params = load_params(PROJECT / "params.yaml")
    sets = bench.VARIANTS[name]["sets"]
    changed = {key for key, value in settings(bench.variant(params, name)).items()
               if settings(params.molecule)[key] != value}
    assert changed <= set(sets) and all(settings(bench.variant(params, name))[k] == v for k, v in sets.items())
