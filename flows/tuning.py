"""The opt-in `<family>_tune` stage's flow (flows/stages/tune.py runs it): Optuna over a family's fine-tuning
settings, each trial one member trained by the family (flows/family.py) as the finetune stage trains its members.

`<family>.tune` in params.yaml declares the search space (dotted keys under the family -> a range or choices),
the sampler (TPE, or a grid over the choices), the median pruner on per-epoch validation scores, the number
of trials, a wall-clock budget and how many trials run at once. Each trial trains one member on the training
split, as the finetune stage trains each of its members, and is scored by its best validation score. Trials are
Prefect tasks on the `orchestration` task runner (threads or Dask); each runs one Optuna trial against the study's
journal file (artifacts/<family>/tune/study.jsonl), Optuna's storage for several processes. MLflow: a parent run
`<family>.tune` with a nested run per trial; Prefect: a table artifact ranking the trials; plots of the
optimisation history and the parameter importances. The best settings go to tuned/<family>.yaml, which the
finetune stage reads on top of params.yaml (flows/params.py: `with_tuned`); with `trials: 0` that file is empty.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import time
import warnings
from pathlib import Path
from typing import Any, Literal

import mlflow
import optuna
from prefect.artifacts import create_table_artifact
from pydantic import BaseModel
from tabulate import tabulate

from prefect import flow

from flows.config import SearchDimension, TuneConfig
from flows.family import FinetuneData, PipelineFamily, pipeline_family
from flows.json_io import write_json
from flows.params import Params, load_params, tuned_file, with_overrides
from flows.stages.tune import TRIALS_FILE, write_tuned, write_untuned
from flows.tasks import compute_task
from flows.tracking import stage_run

STUDY_FILE = "study.jsonl"
STARTUP_TRIALS = 5  # finished trials before the median rule prunes, and TPE's random trials at most


class TrialRecord(BaseModel):
    """One trial as trials.json lists it: Optuna's trial number, its state, the settings it tried (dotted keys under
    the family), the metric (None unless complete), the best and the number of epochs trained, the worker
    (host:pid) that ran it and, for a failed trial, why."""

    trial: int
    state: Literal["running", "complete", "pruned", "failed"] = "running"
    params: dict[str, Any]
    value: float | None = None
    best_epoch: int | None = None
    epochs: int = 0
    worker: str
    error: str | None = None

    @property
    def logged_params(self) -> dict[str, Any]:
        """The settings as MLflow params and table cells take them (mappings as JSON texts)."""
        return {k: json.dumps(v) if isinstance(v, dict) else v for k, v in self.params.items()}


def searched(cfg: TuneConfig, inert: set[str]) -> tuple[TuneConfig, list[str]]:
    """`cfg` without the inert keys of its space, and those keys (sorted); ValueError when nothing is left."""
    skipped = sorted(set(cfg.space) & inert)
    if skipped and len(skipped) == len(cfg.space):
        raise ValueError(f"no setting of the search space can change a trial here: {skipped}")
    return cfg.model_copy(update={"space": {k: d for k, d in cfg.space.items() if k not in inert}}), skipped


def _choices(dimension: SearchDimension) -> list:
    """The choices as Optuna takes them: plain scalars as they are, a list holding anything else as JSON texts."""
    if all(value is None or isinstance(value, (bool, int, float, str)) for value in dimension.choices):
        return list(dimension.choices)
    return [json.dumps(value, sort_keys=True) for value in dimension.choices]


def suggest(trial: optuna.Trial, key: str, dimension: SearchDimension) -> Any:
    """The trial's value of one setting (choices given as JSON texts decoded back)."""
    if dimension.choices is not None:
        choices = _choices(dimension)
        value = trial.suggest_categorical(key, choices)
        return json.loads(value) if choices != list(dimension.choices) else value
    if dimension.integer:
        return trial.suggest_int(key, int(dimension.low), int(dimension.high), log=dimension.log)
    return trial.suggest_float(key, dimension.low, dimension.high, log=dimension.log)


def make_sampler(cfg: TuneConfig, seed: int) -> optuna.samplers.BaseSampler:
    """TPE (its first trials random), or a grid over the choices."""
    if cfg.sampler == "grid":
        return optuna.samplers.GridSampler({key: _choices(d) for key, d in cfg.space.items()}, seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(STARTUP_TRIALS, max(cfg.trials // 2, 1)))


def make_pruner(cfg: TuneConfig, epochs: int) -> optuna.pruners.BasePruner:
    """The median rule once 5 trials have finished, judging a trial from a third of its `epochs` on (earlier
    epochs say little about where a trial ends), or none."""
    if cfg.pruner == "none":
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=STARTUP_TRIALS, n_warmup_steps=max(1, epochs // 3))


def journal(path: Path) -> optuna.storages.JournalStorage:
    """The study's storage: a journal file several processes append to (Optuna's file lock)."""
    from optuna.storages.journal import JournalFileBackend

    return optuna.storages.JournalStorage(JournalFileBackend(str(path)))


@compute_task(name="tune-trial", task_run_name="trial-{index}")
def run_trial(parts: PipelineFamily, index: int, params: Params, inputs: FinetuneData, study_path: str,
              sign: float) -> TrialRecord:
    """One Optuna trial: ask the study for settings, train one member with them (pruned by the median rule), tell
    the study. Returns its record."""
    cfg = parts.settings(params).tune
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    epochs = parts.settings(params).finetune.epochs
    study = optuna.load_study(study_name=parts.name, storage=journal(Path(study_path)),
                              sampler=make_sampler(cfg, cfg.seed + index), pruner=make_pruner(cfg, epochs))
    trial = study.ask()
    values = {key: suggest(trial, key, dimension) for key, dimension in cfg.space.items()}
    record = TrialRecord(trial=trial.number, params=values, worker=f"{socket.gethostname()}:{os.getpid()}")

    def on_epoch(epoch: int, score: float) -> None:
        trial.report(score, epoch)
        record.epochs = epoch + 1
        if trial.should_prune():
            raise optuna.TrialPruned()

    try:
        trial_cfg = parts.settings(with_overrides(params, {f"{parts.name}.{k}": v for k, v in values.items()}))
        _, result = parts.train_member(trial_cfg, inputs, trial_cfg.finetune.seed, on_epoch=on_epoch)
    except optuna.TrialPruned:
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return record.model_copy(update={"state": "pruned"})
    except Exception as error:  # a setting that cannot train (weights that do not fit the pretrained encoder)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return record.model_copy(update={"state": "failed", "error": f"{type(error).__name__}: {error}"})
    study.tell(trial, result.best_score)
    return record.model_copy(update={"state": "complete", "value": sign * result.best_score,
                                     "best_epoch": result.best_epoch})


def _plots(study: optuna.Study, out: Path) -> list[Path]:
    """The optimisation history and, with two finished trials or more, the parameter importances (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as optuna_plots

    written = []
    finished = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    figures = {"optimization_history.png": optuna_plots.plot_optimization_history}
    if len(finished) >= 2 and len(study.best_trial.params) >= 1:
        figures["param_importances.png"] = optuna_plots.plot_param_importances
    for name, plot in figures.items():
        with warnings.catch_warnings(), plt.rc_context():  # optuna's plots set a style for the whole process
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # optuna's matplotlib plots
            try:
                axes = plot(study)
            except (ValueError, RuntimeError) as error:  # importances of settings that never varied
                print(f"no {name}: {error}")
                continue
            axes.figure.savefig(out / name, dpi=110, bbox_inches="tight")
        plt.close(axes.figure)
        written.append(out / name)
    return written


def _check_space(params: Params, family: str, cfg: TuneConfig) -> None:
    """Every key and range end of the space is a valid setting (ValueError naming it), before anything trains."""
    for key, dimension in cfg.space.items():
        for value in [dimension.low, dimension.high] if dimension.choices is None else dimension.choices:
            with_overrides(params, {f"{family}.{key}": int(value) if dimension.integer else value})


def _new_study(family: str, cfg: TuneConfig, study_path: Path) -> None:
    """A fresh study in the journal at `study_path`; on a grid, every grid point queued once, in grid order, so that
    parallel trials never repeat one."""
    study_path.unlink(missing_ok=True)
    study = optuna.create_study(study_name=family, storage=journal(study_path), direction="maximize")
    if cfg.sampler == "grid":
        for values in itertools.product(*(_choices(d) for d in cfg.space.values())):
            study.enqueue_trial(dict(zip(cfg.space, values)))


def _run_trials(parts: PipelineFamily, params: Params, inputs: FinetuneData, study_path: Path, trials: int,
                metric: tuple[str, float]) -> list[TrialRecord]:
    """Waves of `parallel` trial tasks until `trials` have run or the budget is spent; their records in order."""
    cfg: TuneConfig = parts.settings(params).tune
    (name, sign), started, records = metric, time.monotonic(), []
    while len(records) < trials and time.monotonic() - started < cfg.budget_minutes * 60:
        wave = range(len(records), min(trials, len(records) + cfg.parallel))
        futures = [run_trial.submit(parts, index, params, inputs, str(study_path), sign) for index in wave]
        for future in futures:
            record = future.result()
            records.append(record)
            shown = "" if record.value is None else f" {name} {record.value:.4f}"
            print(f"{parts.name} tune: trial {record.trial + 1}/{trials} {record.state}{shown} {record.params}"
                  + (f" ({record.error})" if record.error else ""), flush=True)
    return records


def _ranked(family: str, records: list[TrialRecord], sign: float) -> list[TrialRecord]:
    """The complete trials best first, then the others in order; ValueError (with their errors) when none completed."""
    complete = [r for r in records if r.state == "complete"]
    if not complete:
        errors = sorted({r.error for r in records if r.error})
        raise ValueError(f"no {family} tuning trial completed ({len(records)} run)"
                         + ("".join(f"\n  {e}" for e in errors) if errors else ""))
    return sorted(complete, key=lambda r: -sign * r.value) + [r for r in records if r.state != "complete"]


def _log(parts: PipelineFamily, params: Params, records: list[TrialRecord], ranked: list[TrialRecord], metric: str,
         minutes: float, out: Path) -> list[dict]:
    """MLflow: a parent run with a nested run per trial (in the order they ran) and the plots; Prefect: the ranking
    as a table artifact. Returns the table's rows, best first."""
    family = parts.name
    cfg: TuneConfig = parts.settings(params).tune
    study = optuna.load_study(study_name=family, storage=journal(out / STUDY_FILE))  # with every trial's outcome
    rows = [{"trial": r.trial, "state": r.state, metric: r.value, "epochs": r.epochs, **r.logged_params}
            for r in ranked]
    with stage_run(params.tracking, family, "tune", {"tune": cfg.model_dump(mode="json")},
                   {family: parts.paths.prepared}) as parent:
        for record in records:
            with mlflow.start_run(run_name=f"{family}.tune.trial-{record.trial}", nested=True,
                                  experiment_id=parent.info.experiment_id):
                mlflow.log_params(record.logged_params)
                mlflow.log_metrics({k: v for k, v in ((metric, record.value), ("epochs", record.epochs),
                                                      ("best_epoch", record.best_epoch)) if v is not None})
                mlflow.set_tags({"state": record.state, "worker": record.worker})
        mlflow.log_metrics({f"best_{metric}": ranked[0].value, "trials": len(records), "minutes": minutes})
        for path in _plots(study, out):
            mlflow.log_artifact(str(path))
        create_table_artifact(rows, key=f"{family}-tune", description=f"{family} tuning trials, best {metric} first")
    return rows


def tune(parts: PipelineFamily, params_file: str) -> list[TrialRecord]:
    """Run the family's study within its trial count and budget; write tuned/<family>.yaml and the trial records
    (trials.json). Returns the records, best first."""
    params = load_params(params_file)
    family, paths = parts.name, parts.paths
    cfg: TuneConfig = parts.settings(params).tune
    if cfg.trials == 0:
        write_untuned(paths)
        return []
    target = tuned_file(family, paths.root)
    out = paths.artifacts / "tune"
    out.mkdir(parents=True, exist_ok=True)
    _check_space(params, family, cfg)
    cfg, skipped = searched(cfg, parts.inert_tune_settings(params))
    if skipped:
        print(f"{family} tune: {skipped} cannot change a trial with these settings; left out of the search")
        params = with_overrides(params, {f"{family}.tune.space": cfg.model_dump(mode="json")["space"]})
    trials = min(cfg.trials, cfg.grid_size()) if cfg.sampler == "grid" else cfg.trials
    study_path = (out / STUDY_FILE).resolve()
    _new_study(family, cfg, study_path)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    inputs = parts.finetune_data(parts.settings(params))
    metric, sign = parts.tune_metric(inputs)
    started = time.monotonic()
    records = _run_trials(parts, params, inputs, study_path, trials, (metric, sign))
    elapsed = time.monotonic() - started
    ranked = _ranked(family, records, sign)
    best, complete = ranked[0], sum(r.state == "complete" for r in records)
    rows = _log(parts, params, records, ranked, metric, elapsed / 60, out)
    write_json(out / TRIALS_FILE, [r.model_dump() for r in ranked])
    write_tuned(target, best.params,
                f"written by the {family}_tune stage: best of {len(records)} trials ({complete} complete) in "
                f"{elapsed:.0f} s, {metric} {best.value:.4f} (trial {best.trial});\n"
                f"{family}_finetune reads these keys on top of params.yaml")
    print(tabulate(rows, headers="keys", tablefmt="github", floatfmt=".4f"))
    print(f"{family} tune: best {metric} {best.value:.4f} with {best.params} -> "
          f"{target.relative_to(paths.root)}")
    return ranked


@flow(name="tune", flow_run_name="{family}-tune")
def tune_flow(family: str, params_file: str = "params.yaml") -> list[TrialRecord]:
    """Tune within `<family>.tune`'s trials and budget; returns the trials, best first."""
    return tune(pipeline_family(family), params_file)
