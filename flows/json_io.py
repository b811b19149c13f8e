"""Deterministic JSON files for stage outputs (sorted keys, fixed float formatting by json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: Path, obj: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    return path


def write_metrics_by_model(folder: Path, metrics: dict[str, dict[str, float]]) -> list[Path]:
    """`folder/<model>.json` with the numeric metrics of each model, and no other JSON file in `folder`: one row
    per model in `dvc metrics show`, one column per metric."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.json"):
        stale.unlink()
    return [write_json(folder / f"{model}.json",
                       {k: v for k, v in values.items() if isinstance(v, int | float) and not isinstance(v, bool)})
            for model, values in metrics.items()]


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())
