"""Stage `<family>_tune`: `python -m flows.stages.tune <family> [--params FILE]` (dvc.yaml).

Tuning is opt-in. With `<family>.tune.trials` 0, the default, this writes the empty tuned file and trial list
itself, without torch and without a Prefect flow run (a stage process that loads the family's training code takes
seconds longer). Otherwise, and where the params do not load, it runs the tune flow of flows/tuning.py, which
reports bad params as every stage does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from flows.family import FAMILIES
from flows.json_io import write_json
from flows.locking import hold_for_stage
from flows.params import load_params, tuned_file
from flows.paths import StagePaths

TRIALS_FILE = "trials.json"  # the trial records, best first


def write_tuned(path: Path, settings: dict[str, Any], header: str) -> None:
    """tuned/<family>.yaml: a comment saying where it came from, then the dotted keys ({} where none)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = yaml.safe_dump(settings, sort_keys=True) if settings else "{}\n"
    path.write_text("".join(f"# {line}\n" for line in header.splitlines()) + body)


def write_untuned(paths: StagePaths) -> None:
    """The outputs of a tune stage with `trials: 0`: an empty trial list and an empty tuned file."""
    family, target = paths.family, tuned_file(paths.family, paths.root)
    out = paths.artifacts / "tune"
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / TRIALS_FILE, [])
    write_tuned(target, {}, f"not tuned ({family}.tune.trials is 0): fine-tuning uses params.yaml as it is")
    print(f"{family} tune: off ({family}.tune.trials is 0); {target.relative_to(paths.root)} is empty")


def _trials(params_file: str, family: str) -> int | None:
    """`<family>.tune.trials` of `params_file`; None where it does not load (the flow's command line reports it)."""
    try:
        return getattr(load_params(params_file), family).tune.trials
    except Exception:
        return None


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in FAMILIES:
        sys.exit(f"usage: python -m flows.stages.tune {{{'|'.join(FAMILIES)}}} [--params FILE]")
    family, options = argv[0], argv[1:]
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)  # the flow's option that matters here
    parser.add_argument("--params", default="params.yaml")
    known, others = parser.parse_known_args(options)
    if not others and _trials(known.params, family) == 0:  # any other option (e.g. --help): the flow's command line
        hold_for_stage()
        write_untuned(StagePaths(family))
        return
    run_flow(family, options)


def run_flow(family: str, options: list[str]) -> None:
    """The tune flow (flows/tuning.py) from the command line, as every stage runs its flow."""
    from flows.tasks import stage_cli
    from flows.tuning import tune_flow

    sys.argv = [sys.argv[0], family, *options]
    stage_cli(tune_flow)


if __name__ == "__main__":
    main(sys.argv[1:])
