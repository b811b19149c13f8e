"""The model card: what a model predicts and how to feed it, stored as `card.json` beside `model.onnx`.

The card is written by the pipeline's export stage (featurisation state, calibration, alert threshold, test
metrics) and covered by the version's signed manifest. Each family has its card model, registered here by its
`family` value (`register_card`); a card is validated by its family's model when read, and one that does not
parse is refused like a bad signature. Its task identity says what the model predicts; the promotion gate
compares a challenger only with a champion of the same identity.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

CARD = "card.json"
MAX_PROBLEMS_SHOWN = 3


class CardError(RuntimeError):
    """A model card that is missing or cannot be read."""


class GraphSize(BaseModel):
    bytes: int = Field(ge=0)
    nodes: int = Field(ge=0, description="operator nodes, local functions' included")
    parameters: int = Field(ge=0)


class ServingCost(BaseModel):
    """What one prediction costs to serve, measured when it is registered (models/serving_cost.py): milliseconds per
    item of featurisation, of the model call and their total, keyed `batch_1` and `batch_64`."""

    model_config = ConfigDict(extra="allow")

    featurize_ms_per_item: dict[str, float]
    model_ms_per_item: dict[str, float]
    total_ms_per_item: dict[str, float]
    graph: GraphSize
    threads: int = Field(ge=1, description="ONNX Runtime intra-op threads while measuring")
    machine: str


class ModelCard(BaseModel):
    """What every family's card holds; a family's card adds its own fields (further fields are kept as written)."""

    model_config = ConfigDict(extra="allow")

    family: str
    task: Literal["classification", "regression"]
    target: str = Field(description="what the model predicts")
    calibration: dict[str, Any] = Field(default_factory=dict)
    test_metrics: dict[str, float | None] = Field(default_factory=dict)
    val_metrics: dict[str, float | None] = Field(default_factory=dict)
    calibration_error: float | None = None
    serving_cost: ServingCost | None = Field(None, description="none in cards exported before it was measured")

    def identity_inputs(self) -> Any:
        """What the model reads, for its task identity."""
        return "inputs"


class SensorCard(ModelCard):
    family: Literal["sensor"]
    channels: list[str] = Field(min_length=1)
    window: int = Field(ge=1, description="time steps per window")
    threshold: float = Field(ge=0, le=1, description="the alert threshold on the failure probability")
    featurizer: dict[str, Any]

    def identity_inputs(self) -> dict:
        return {"channels": list(self.channels), "window": int(self.window)}


class MoleculeCard(ModelCard):
    family: Literal["molecule"]
    featurizer_version: int
    tokenizer: dict[str, Any]

    def identity_inputs(self) -> str:
        return "SMILES"


CARDS: dict[str, type[ModelCard]] = {}


def register_card(cls: type[ModelCard]) -> type[ModelCard]:
    """Validate the cards whose `family` is the one `cls` declares with `cls`."""
    CARDS[cls.model_fields["family"].annotation.__args__[0]] = cls
    return cls


for _card in (SensorCard, MoleculeCard):
    register_card(_card)


def parse_card(card: dict) -> ModelCard:
    """`card` validated by its family's model (CardError naming what is wrong)."""
    if not isinstance(card, dict) or not isinstance(card.get("family"), str):
        raise CardError("its model card has no `family`")
    model = CARDS.get(card["family"])
    if model is None:
        raise CardError(f"its model card is of family {card['family']!r}, which this code does not know "
                        f"({', '.join(sorted(CARDS))})")
    try:
        return model.model_validate(card)
    except ValidationError as error:
        problems = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors()[:MAX_PROBLEMS_SHOWN]]
        raise CardError(f"its model card does not parse: {'; '.join(problems)}") from None


def write_card(directory: Path, card: dict) -> Path:
    """Write `card` once it parses (CardError otherwise)."""
    parse_card(card)
    path = directory / CARD
    path.write_text(json.dumps(card, indent=2, sort_keys=True, default=str))
    return path


def read_card(directory: Path) -> dict:
    """The card of a version folder, as written, once it parses by its family's model."""
    path = directory / CARD
    try:
        card = json.loads(path.read_text())
    except FileNotFoundError:
        raise CardError(f"it has no model card ({CARD})") from None
    except ValueError as error:
        raise CardError(f"its model card is not valid JSON ({error})") from None
    parse_card(card)
    return card


def task_identity(card: dict) -> dict:
    """What the model predicts from what: family, task, target and inputs (e.g. sensor: channels and window;
    molecule: SMILES)."""
    parsed = parse_card(card)
    return {"family": parsed.family, "task": parsed.task, "target": parsed.target, "inputs": parsed.identity_inputs()}


def describe_identity(identity: dict) -> str:
    """One line, e.g. "sensor classification of 'failure within 48 steps' from 3 channels (a, b, c), window 32"."""
    text = f"{identity['family']} {identity['task']} of '{identity['target']}'"
    inputs = identity["inputs"]
    if isinstance(inputs, dict) and {"channels", "window"} <= inputs.keys():
        channels = inputs["channels"]
        shown = ", ".join(channels[:4]) + (", ..." if len(channels) > 4 else "")
        text += f" from {len(channels)} channels ({shown}), window {inputs['window']}"
    return text
