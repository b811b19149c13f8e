"""The model card is validated by its family's model when written and read: a card that does not parse is refused
with what is wrong; a family registers its own card model; the task identity comes from the family's card."""

from __future__ import annotations

import json
from typing import Literal

import pytest

from contract.card import (CARDS, CardError, ModelCard, describe_identity, read_card, register_card, task_identity,
                           write_card)

SENSOR = {"family": "sensor", "task": "classification", "target": "failure within 8 steps", "channels": ["a", "b"],
          "window": 16, "threshold": 0.4, "featurizer": {}, "test_metrics": {"pr_auc": 0.9}, "extra": [1, 2]}


def test_a_card_is_written_and_read_back_as_it_was(tmp_path):
    write_card(tmp_path, SENSOR)
    assert read_card(tmp_path) == SENSOR


@pytest.mark.parametrize(("change", "message"), [
    ({"window": 0}, "window: Input should be greater than or equal to 1"),
    ({"channels": None}, "channels: Input should be a valid list"),
    ({"task": "ranking"}, "task: Input should be 'classification' or 'regression'"),
    ({"family": "plants"}, "family 'plants', which this code does not know"),
    ({"family": None}, "has no `family`"),
])
def test_a_card_that_does_not_parse_is_refused_saying_why(tmp_path, change, message):
    (tmp_path / "card.json").write_text(json.dumps({**SENSOR, **change}))
    with pytest.raises(CardError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_card(tmp_path)
    with pytest.raises(CardError):
        write_card(tmp_path, {**SENSOR, **change})


def test_a_family_registers_its_own_card_and_identity(tmp_path):
    class PlantCard(ModelCard):
        family: Literal["plants"]
        columns: list[str]

        def identity_inputs(self):
            return {"columns": self.columns}

    register_card(PlantCard)
    try:
        card = {"family": "plants", "task": "regression", "target": "yield", "columns": ["rain", "sun"]}
        write_card(tmp_path, card)
        assert task_identity(read_card(tmp_path))["inputs"] == {"columns": ["rain", "sun"]}
        with pytest.raises(CardError, match="columns: Field required"):
            write_card(tmp_path, {k: v for k, v in card.items() if k != "columns"})
    finally:
        CARDS.pop("plants")


def test_the_sensor_identity_names_channels_and_window():
    identity = task_identity(SENSOR)
    assert identity == {"family": "sensor", "task": "classification", "target": "failure within 8 steps",
                        "inputs": {"channels": ["a", "b"], "window": 16}}
    assert describe_identity(identity).endswith("from 2 channels (a, b), window 16")
