"""The recipe search's score: relative validation error reduction against `baseline`, datasets of a group averaged
first, no score until a recipe and the baseline ran every dataset."""

from __future__ import annotations

import pytest

from bench.recipe_search import FAMILIES, SENSOR, choose, incumbent, seed_scores, summarise
from flows.params import load_params, with_overrides


def _runs(recipe: str, pr_auc: dict[str, float], seed: int = 0) -> list[dict]:
    return [{"dataset": d, "recipe": recipe, "seed": seed, "val": {"pr_auc": v}, "test": {"pr_auc": v}, "seconds": 1.0}
            for d, v in pr_auc.items()]


BASE = {"fd001": 0.9, "fd001_flip0.2": 0.8, "skab_split0": 0.5, "skab_split1": 0.5, "skab_split2": 0.5}


def test_score_weighs_each_dataset_group_the_same():
    better_skab = {**BASE, "skab_split0": 0.75}  # one of SKAB's three splits halves its error, and SKAB is
    summary = summarise(SENSOR, _runs("baseline", BASE) + _runs("robust", better_skab))  # one of three groups
    assert summary["baseline"]["score"] == pytest.approx(0.0)
    assert summary["robust"]["score"] == pytest.approx(0.5 / 3 / 3)
    worse_fd001 = {**BASE, "fd001": 0.8}  # FD001's error doubles
    assert summarise(SENSOR, _runs("baseline", BASE) + _runs("bce_long", worse_fd001))["bce_long"]["score"] == (
        pytest.approx(-1 / 3))


def test_a_recipe_meets_the_baseline_on_the_seeds_it_ran():
    lucky = {k: v - 0.3 for k, v in BASE.items()}  # the baseline's second seed is much worse everywhere
    runs = _runs("baseline", BASE) + _runs("baseline", lucky, seed=1) + _runs("robust", BASE)
    summary = summarise(SENSOR, runs)
    assert summary["robust"]["score"] == pytest.approx(0.0)  # level with the baseline's seed 0, not its mean
    assert summary["baseline"]["datasets"]["fd001"]["seeds"] == [0, 1]
    summary = summarise(SENSOR, runs + _runs("robust", lucky, seed=1))
    assert summary["robust"]["score"] == pytest.approx(0.0)  # both seeds, each level
    assert summarise(SENSOR, _runs("baseline", BASE) + _runs("robust", BASE, seed=1))["robust"]["score"] is None


def test_the_leader_is_among_the_recipes_run_on_the_most_seeds():
    easy = {k: v + 0.05 for k, v in BASE.items()}  # seed 0 is easy for everyone
    runs = (_runs("baseline", easy) + _runs("baseline", BASE, seed=1) + _runs("robust", easy)
            + _runs("focal_long", {k: v + 0.02 for k, v in easy.items()})
            + _runs("robust", {k: v + 0.01 for k, v in BASE.items()}, seed=1))
    summary = summarise(SENSOR, runs)
    assert summary["focal_long"]["score"] > summary["robust"]["score"] > 0  # one lucky seed scores higher
    per_seed = seed_scores(SENSOR, runs)
    assert per_seed["focal_long"] == {0: pytest.approx(summary["focal_long"]["score"])}
    assert choose(summary, per_seed, None)["chosen"] == "robust"  # but only the two-seed recipes compete
    assert choose(summarise(SENSOR, _runs("robust", BASE)), {}, None)["chosen"] is None


def test_the_held_recipe_stays_unless_the_leader_gains_more_than_its_standard_error():
    def runs(robust_gains: list[float]) -> list[dict]:
        out = []
        for seed, gain in enumerate(robust_gains):
            out += _runs("baseline", BASE, seed) + _runs("bce_long", BASE, seed)
            out += _runs("robust", {k: v + gain for k, v in BASE.items()}, seed)
        return out

    steady, noisy = runs([0.01, 0.012, 0.011]), runs([0.05, -0.03, 0.0])
    for case, expected in ((steady, "robust"), (noisy, "bce_long")):
        summary = summarise(SENSOR, case)
        verdict = choose(summary, seed_scores(SENSOR, case), "bce_long")
        assert verdict["leader"] == "robust" and verdict["chosen"] == expected
        assert verdict["gain_over_held"]["seeds"] == [0, 1, 2]


def test_the_held_recipe_is_the_one_params_yaml_holds():
    params = load_params()
    for family in FAMILIES:
        held = incumbent(family, params)
        assert held is not None
        overrides = FAMILIES[family].recipes[held]["overrides"]
        changed = with_overrides(params, {f"{family}.finetune.epochs": overrides["finetune.epochs"] + 1})
        assert incumbent(family, changed) is None


def test_no_score_until_every_dataset_ran():
    partial = {k: v for k, v in BASE.items() if k != "skab_split2"}
    summary = summarise(SENSOR, _runs("baseline", BASE) + _runs("robust", partial))
    assert summary["robust"]["score"] is None
    assert summarise(SENSOR, _runs("robust", BASE))["robust"]["score"] is None  # no baseline yet


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_recipe_is_valid_and_sets_what_it_names(family):
    params = load_params()
    for name, recipe in FAMILIES[family].recipes.items():
        overrides = recipe["overrides"]
        section = getattr(with_overrides(params, {f"{family}.{k}": v for k, v in overrides.items()}), family)
        for key, value in overrides.items():
            node = section
            for part in key.split("."):
                node = getattr(node, part)
            assert node == value, (name, key)
    # a recipe replaces the loss terms, it does not add to the baseline's
    robust = with_overrides(params, {f"sensor.{k}": v for k, v in SENSOR.recipes["robust"]["overrides"].items()})
    assert robust.sensor.finetune.loss.terms == {"gce": 1.0}
