"""The model card: what a model predicts and how to feed it, stored as `card.json` beside `model.onnx`.

The card is written by the pipeline's export stage (featurisation state, calibration, alert threshold, test
metrics) and covered by the version's signed manifest. Its task identity says what the model predicts; the
promotion gate compares a challenger only with a champion of the same identity.
"""

from __future__ import annotations

import json
from pathlib import Path

CARD = "card.json"


class CardError(RuntimeError):
    """A model card that is missing or cannot be read."""


def write_card(directory: Path, card: dict) -> Path:
    path = directory / CARD
    path.write_text(json.dumps(card, indent=2, sort_keys=True, default=str))
    return path


def read_card(directory: Path) -> dict:
    path = directory / CARD
    try:
        card = json.loads(path.read_text())
    except FileNotFoundError:
        raise CardError(f"it has no model card ({CARD})") from None
    except ValueError as error:
        raise CardError(f"its model card is not valid JSON ({error})") from None
    if not isinstance(card, dict) or "family" not in card:
        raise CardError("its model card has no `family`")
    return card


def task_identity(card: dict) -> dict | None:
    """What the model predicts from what: family, task, target and inputs (sensor: channels and window;
    molecule: SMILES). None for a card written before cards recorded their target."""
    if "target" not in card:
        return None
    identity = {"family": card["family"], "task": card["task"], "target": card["target"]}
    if card["family"] == "sensor":
        identity["inputs"] = {"channels": list(card["channels"]), "window": int(card["window"])}
    else:
        identity["inputs"] = "SMILES"
    return identity


def describe_identity(identity: dict | None) -> str:
    """One line, e.g. "sensor classification of 'failure within 48 steps' from 3 channels (a, b, c), window 32"."""
    if identity is None:
        return "an unrecorded task (a card from before task identities)"
    text = f"{identity['family']} {identity['task']} of '{identity['target']}'"
    inputs = identity["inputs"]
    if isinstance(inputs, dict):
        channels = inputs["channels"]
        shown = ", ".join(channels[:4]) + (", ..." if len(channels) > 4 else "")
        text += f" from {len(channels)} channels ({shown}), window {inputs['window']}"
    return text
