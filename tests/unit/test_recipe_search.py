"""The recipe search's score: relative validation error reduction against `baseline`, datasets of a group averaged
first, no score until a recipe and the baseline ran every dataset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.recipe_search import CPU_BUDGET_SECONDS, FAMILIES, SENSOR, choose, incumbent, seed_scores, summarise
from flows.params import load_params, with_overrides

PROJECT = Path(__file__).resolve().parents[2]


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
    assert choose(summary, per_seed)["leader"] == "robust"  # but only the two-seed recipes compete
    assert choose(summarise(SENSOR, _runs("robust", BASE)), {})["chosen"] is None


def _with_seconds(runs: list[dict], recipe: str, seconds: float) -> list[dict]:
    return [{**r, "seconds": seconds} if r["recipe"] == recipe else r for r in runs]


def test_the_choice_is_the_cheapest_recipe_within_one_standard_error_of_the_leader():
    def runs(gains: dict[str, list[float]]) -> list[dict]:
        out = []
        for seed in range(3):
            out += _runs("baseline", BASE, seed)
            out += [r for name, g in gains.items() for r in _runs(name, {k: v + g[seed] for k, v in BASE.items()}, seed)]
        return out

    # robust leads; bce_long is behind it by about its own spread; focal_long is steadily behind
    case = runs({"robust": [0.05, 0.01, 0.03], "bce_long": [0.06, -0.01, 0.02], "focal_long": [0.03, -0.01, 0.01]})
    for cheap, expected in (("bce_long", "bce_long"), ("focal_long", "robust"), ("robust", "robust")):
        timed = _with_seconds(case, cheap, 0.5)  # the others take 1 s per run
        verdict = choose(summarise(SENSOR, timed), seed_scores(SENSOR, timed))
        assert verdict["leader"] == "robust" and verdict["chosen"] == expected, cheap
        assert verdict["within_one_se"] == ["bce_long", "robust"]
    behind = verdict["behind_leader"]["focal_long"]
    assert behind["mean"] > behind["standard_error"] > 0
    # a recipe a tenth cheaper is as cheap (seconds measured under varying load): the higher score, the leader's, wins
    timed = _with_seconds(case, "bce_long", 0.9)
    assert choose(summarise(SENSOR, timed), seed_scores(SENSOR, timed))["chosen"] == "robust"


def test_a_recipe_over_the_cpu_budget_is_reported_but_not_chosen():
    runs = []
    for seed in range(3):
        runs += _runs("baseline", BASE, seed) + _runs("robust", {k: v + 0.01 for k, v in BASE.items()}, seed)
        runs += _runs("focal_long", {k: v + 0.05 + 0.01 * seed for k, v in BASE.items()}, seed)
    slow = _with_seconds(_with_seconds(runs, "focal_long", CPU_BUDGET_SECONDS + 1), "robust", 2.0)
    verdict = choose(summarise(SENSOR, slow), seed_scores(SENSOR, slow))
    assert verdict["leader_any_cost"] == "focal_long" and verdict["leader"] == "robust"
    assert verdict["chosen"] == "robust" and "focal_long" not in verdict["behind_leader"]
    unlimited = choose(summarise(SENSOR, slow), seed_scores(SENSOR, slow), budget=None)
    assert unlimited["leader"] == unlimited["chosen"] == unlimited["leader_any_cost"] == "focal_long"


def test_params_yaml_holds_the_rule_s_choice_of_the_committed_search():
    params = load_params()
    for family in FAMILIES:
        report = json.loads((PROJECT / "bench" / "results" / f"recipe_{family}.json").read_text())
        assert incumbent(family, params) == report["chosen"], family
        overrides = FAMILIES[family].recipes[report["chosen"]]["overrides"]
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


DROPPED_OPTIONS = {"model.descriptor_bins", "finetune.weight_average"}  # options removed after their recipe lost (docs/reference/params.md)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_recipe_files_hold_the_recipes_the_committed_search_ran(family):
    recorded = json.loads((PROJECT / "bench" / "results" / f"recipe_{family}.json").read_text())["recipes"]
    for name, recipe in FAMILIES[family].recipes.items():
        overrides = {k: v for k, v in recorded[name]["overrides"].items() if k not in DROPPED_OPTIONS}
        assert recipe == {**recorded[name], "overrides": overrides}, name
