"""`make run`: the whole pipeline with `dvc repro` against one Prefect server, the data pushed to the
DVC remote, then a summary of what was trained, measured and registered.

    python -m flows.pipeline run       # dvc repro + dvc push + summary
    python -m flows.pipeline summary   # the summary of the last run
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import typer
from tabulate import tabulate

from flows.dvc import DvcError, repro, run_dvc
from flows.locking import PipelineBusyError, pipeline_lock
from flows.family import FAMILIES, pipeline_family
from flows.server import prefect_server

app = typer.Typer(add_completion=False, help=__doc__)

SUMMARY_HEADERS = ["family", "registered model", "version", "test metrics (ours)", "serving ms/item (alone, in 64s)",
                   "baseline", "promotion"]


def _dvc(command: Callable[..., None], *args: str, env: dict[str, str]) -> None:
    try:
        command(*args, env=env)
    except DvcError as error:
        typer.secho(str(error), fg="red", err=True)
        raise typer.Exit(1) from None


def temporary_server_env(env: dict[str, str], api_url: str) -> dict[str, str]:
    """The stages' environment against the run's own Prefect server (`api_url`): it has no UI and is gone when the
    run ends, so PREFECT_UI_URL is emptied and Prefect logs no "View at <url>" links to it. Against a server the
    user runs (PREFECT_API_URL set, e.g. `make ui`) the stages keep their links."""
    return {**env, "PREFECT_API_URL": api_url, "PREFECT_UI_URL": ""}


def summary_rows() -> list[list[str]]:
    rows = []
    for family in map(pipeline_family, FAMILIES):
        paths = family.paths
        if not paths.metrics.exists():
            rows.append([family.name, "(not run yet)", "", "", "", "", ""])
            continue
        result = json.loads(paths.metrics.read_text())
        keys = [k for k in family.summary_metrics or result["model"] if k in result["model"]]
        # the first metric on validation too: far from the test figure, validation is too small to choose by
        validation = result.get("model_val", {})
        ours = [f"{k} {result['model'][k]:.3f}" for k in keys]
        if keys and keys[0] in validation:
            ours[0] += f" (validation {validation[keys[0]]:.3f})"
        base = ", ".join(f"{k} {result['baseline'][k]:.3f}" for k in keys if k in result["baseline"])
        verdict = "champion" if result["promoted"] else "challenger (gate refused)"
        spent = result.get("serving_cost", {}).get("total_ms_per_item", {})
        cost = f"{spent['batch_1']:.2f}, {spent['batch_64']:.2f}" if spent else "not measured"
        rows.append([paths.family, result["model_name"], f"v{result['registered_version']} {verdict}", ", ".join(ours),
                     cost, f"{result['baseline']['name']}: {base}", "; ".join(result["reasons"])])
    return rows


@app.command()
def summary() -> None:
    """Print test metrics next to the baselines (and our first metric on validation), registered versions and promotion
    decisions."""
    typer.echo(tabulate(summary_rows(), headers=SUMMARY_HEADERS, tablefmt="github", maxcolwidths=[8, 24, 16, 40, 16, 40, 40]))
    typer.echo(
        "\nWhere to look next:\n"
        "  metrics/*.json, metrics/*_predictions.csv   promotion decisions and per-item predictions\n"
        "  metrics/plots/                              PR curve, reliability, parity, training curves\n"
        "  make ui                                     Prefect UI (:4200) and MLflow UI (:5000)\n"
        "  make serve                                  the champions over HTTP\n"
        "  make metrics                                test metrics per family and model (dvc metrics show)\n"
        "  .venv/bin/dvc plots show"
    )


@app.command()
def run() -> None:
    """`dvc repro` (every stage a Prefect flow run), `dvc push` to the default remote, then the summary.

    One run at a time per workspace (flows/locking.py); a failed stage's previous outputs are restored.
    """
    env = dict(os.environ)
    try:
        with pipeline_lock():
            if env.get("PREFECT_API_URL"):
                _dvc(repro, env=env)
            else:
                with prefect_server() as url:
                    _dvc(repro, env=temporary_server_env(env, url))
            _dvc(run_dvc, "push", "--quiet", env=env)
    except PipelineBusyError as error:
        typer.secho(f"error: {error}", fg="red", err=True)
        raise typer.Exit(3) from None
    summary()


if __name__ == "__main__":
    app()
