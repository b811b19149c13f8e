"""Deterministic JSON files for stage outputs (sorted keys, fixed float formatting by json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: Path, obj: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    return path


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())
