"""The recipe search's score: relative validation error reduction against `baseline`, datasets of a group averaged
first, no score until a recipe and the baseline ran every dataset."""

from __future__ import annotations

import pytest

from bench.recipe_search import SENSOR, merged, summarise


def _runs(recipe: str, pr_auc: dict[str, float]) -> list[dict]:
    return [{"dataset": d, "recipe": recipe, "seed": 0, "val": {"pr_auc": v}, "test": {"pr_auc": v}, "seconds": 1.0}
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


def test_no_score_until_every_dataset_ran():
    partial = {k: v for k, v in BASE.items() if k != "skab_split2"}
    summary = summarise(SENSOR, _runs("baseline", BASE) + _runs("robust", partial))
    assert summary["robust"]["score"] is None
    assert summarise(SENSOR, _runs("robust", BASE))["robust"]["score"] is None  # no baseline yet


def test_loss_terms_are_replaced_not_merged():
    base = {"finetune": {"loss": {"terms": {"bce": 1.0}, "gce_q": 0.7}, "epochs": 6}}
    out = merged(base, {"finetune": {"loss": {"terms": {"gce": 1.0}}}})
    assert out == {"finetune": {"loss": {"terms": {"gce": 1.0}, "gce_q": 0.7}, "epochs": 6}}
