"""Where the benchmarks write: each result as `bench/results/<name>.json` and the Markdown table made from it."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> str:
    """This machine in one line (architecture, CPUs, Python), for a result's header."""
    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def write_results(name: str, report: dict, markdown: Callable[[dict], str]) -> None:
    """Write `report` as results/<name>.json and its table as results/<name>.md, and print the table."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=2, default=float) + "\n")
    table = markdown(report)
    (RESULTS / f"{name}.md").write_text(table)
    print(table)
