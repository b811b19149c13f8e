"""The flows people run from the Prefect UI: each family's pipeline, the data refresh and the retrain.

They drive the same `dvc repro` as `make run`, so a run from the UI leaves the DVC outputs, dvc.lock and
the MLflow runs exactly as the command line would: one code path. Parameters given in the UI are
written into params.yaml first (validated, comments kept), as `dvc exp run --set-param` would, so that
`dvc status` afterwards describes what was run.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from tabulate import tabulate

from flows.dvc import repro as dvc_repro
from flows.dvc import run_dvc
from flows.lineage import dvc_md5
from flows.family import FAMILIES, pipeline_family
from flows.locking import pipeline_lock
from flows.params import DEFAULT_PARAMS, Params, ParamsError, load_params, with_overrides, write_overrides
from flows.pipeline import SUMMARY_HEADERS, summary_rows
from flows.tasks import compute_task, io_task


def family_overrides(family: str, data_source: str | None, data_path: str | None, epochs: int | None,
                     seed: int | None, overrides: dict[str, Any] | None) -> dict[str, Any]:
    """The UI's parameters as dotted params.yaml keys of `family` (explicit `overrides` win)."""
    out: dict[str, Any] = {}
    if data_path is not None:
        out[f"{family}.data.path"] = data_path
    if data_source is not None:
        out[f"{family}.data.source"] = data_source
    if epochs is not None:
        out[f"{family}.finetune.epochs"] = epochs
    if seed is not None:
        out.update({f"{family}.{section}.seed": seed for section in ("data", "pretrain", "finetune")})
    return {**out, **(overrides or {})}


def check_sources(params: Params) -> None:
    """A data path needs a source that reads files (the families' built-in data, e.g. the simulator, read none)."""
    for family in map(pipeline_family, FAMILIES):
        data = family.settings(params).data
        if data.path is not None and data.source in family.sources_without_files:
            raise ParamsError(f"{family.name}.data.path is set but {family.name}.data.source is '{data.source}', which "
                              "reads no file; give data_source too")


@io_task(name="apply-parameters")
def apply_parameters(overrides: dict[str, Any]) -> None:
    """Write the run's parameters into params.yaml; bad ones fail the run, leaving the file and everything else
    as it was."""
    logger = get_run_logger()
    if not overrides:
        logger.info("no parameters given: running params.yaml as it is")
        return
    check_sources(with_overrides(load_params(DEFAULT_PARAMS), overrides))
    write_overrides(DEFAULT_PARAMS, overrides)
    logger.info("params.yaml updated: %s", ", ".join(f"{k}={v!r}" for k, v in overrides.items()))


@compute_task(name="dvc-repro", task_run_name="dvc repro {arguments}")
def repro(arguments: str) -> None:
    """`dvc repro` under the pipeline lock, its output in the task's log; a failed stage's previous outputs are
    restored. Not retried: a stage that failed fails the same way again
    (bad input, a bug), and DVC already resumes after the stages that completed."""
    with pipeline_lock():
        dvc_repro(*arguments.split(), log=get_run_logger().info)


@io_task(name="dvc-push")
def push() -> None:
    """`dvc push` to the default remote (retried: remotes are networks)."""
    run_dvc("push", "--quiet", log=get_run_logger().info)


def _publish_summary(key: str, title: str, families: list[str]) -> None:
    rows = [row for row in summary_rows() if row[0] in families]
    table = tabulate(rows, headers=SUMMARY_HEADERS, tablefmt="github")
    create_markdown_artifact(f"### {title}\n\n{table}\n\nEach stage's flow run links its MLflow run.", key=key,
                             description=title)


def _pipeline(family: str, overrides: dict[str, Any], force: bool) -> None:
    apply_parameters(overrides)
    repro(f"{'--force ' if force else ''}{family}_register")
    push()
    _publish_summary(f"{family}-pipeline", f"{family} pipeline", [family])


@flow(name="pipeline", flow_run_name="{family}-pipeline", log_prints=True)
def pipeline(family: str, data_source: str | None = None, data_path: str | None = None, epochs: int | None = None,
             seed: int | None = None, overrides: dict[str, Any] | None = None, force: bool = False) -> None:
    """A family's pipeline, prepare to register (`dvc repro <family>_register`).

    data_source: a `data.source` of the family (sensor: simulator | cmapss | skab | file; molecule: solubility |
    file), `file` where only data_path is given; data_path: the file it reads; epochs: fine-tuning epochs; seed:
    every seed of the family; overrides: any params.yaml keys, dotted ({"sensor.model.hidden": 64}); force: re-run
    stages that are up to date.
    """
    source = data_source or ("file" if data_path is not None else None)
    _pipeline(family, family_overrides(family, source, data_path, epochs, seed, overrides), force)


@flow(name="data-refresh", log_prints=True)
def data_refresh() -> dict[str, dict[str, str]]:
    """Re-read every source and re-run both prepare stages even when DVC sees no change (a source file may
    have changed in place), then push the prepared data to the DVC remote. Returns per family the DVC md5
    before and after; an unchanged md5 leaves every later stage up to date."""
    load_params(DEFAULT_PARAMS)
    families = {name: pipeline_family(name).paths for name in FAMILIES}
    before = {f: dvc_md5(p.prepared) if p.prepared.exists() else "(none)" for f, p in families.items()}
    repro("--force --single-item " + " ".join(f"{name}_prepare" for name in families))
    push()
    versions = {f: {"before": before[f], "after": dvc_md5(p.prepared)} for f, p in families.items()}
    rows = [[f, v["before"], v["after"], "new version" if v["before"] != v["after"] else "unchanged"]
            for f, v in versions.items()]
    table = tabulate(rows, headers=["family", "DVC md5 before", "after", ""], tablefmt="github")
    create_markdown_artifact(f"### Prepared data versions\n\n{table}", key="data-refresh",
                             description="DVC versions of the prepared data")
    print(table)
    return versions


@flow(name="retrain", log_prints=True)
def retrain(force: bool = False) -> None:
    """The data refresh, then the whole pipeline (`dvc repro`): stages re-run where data, code or params
    changed, all of them with force. New versions meet the promotion gate as usual."""
    data_refresh()
    repro("--force" if force else "")
    push()
    _publish_summary("retrain", "retrain", list(FAMILIES))
