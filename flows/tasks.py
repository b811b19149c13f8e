"""Prefect task flavours used by every stage, and the command-line entry for a stage flow."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import logging
import sys
import traceback
import typing
from collections.abc import Callable
from datetime import timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

import typer
from prefect import Flow, task
from prefect.cache_policies import NO_CACHE
from typer.models import OptionInfo

from data.errors import DataValidationError
from flows.family import FAMILIES
from flows.locking import hold_for_stage
from flows.params import ParamsError, load_params
from flows.runners import task_runner
from flows.termination import end_child, run_stoppable

BAD_INPUT = (DataValidationError, ParamsError)


def _retry_unless_bad_input(task, task_run, state) -> bool:
    """Retry I/O failures, never bad input: that fails the same way every time."""
    try:
        state.result()
    except BAD_INPUT:
        return False
    except Exception:
        return True
    return False


_IO_RETRIES = {"retries": 2, "retry_delay_seconds": 1, "retry_condition_fn": _retry_unless_bad_input}

io_task = functools.partial(task, **_IO_RETRIES, cache_policy=NO_CACHE)
"""A task that reads or writes files or the tracking store: retried on I/O errors."""

compute_task = functools.partial(task, cache_policy=NO_CACHE)
"""A task that computes on in-memory arrays (arrays are not hashed for caching)."""


def source_cache_key(code: tuple[str, ...], packages: tuple[str, ...]) -> Callable[..., str]:
    """A cache key for a task whose result is a pure function of its `cfg` argument (a pydantic model), the
    bytes of the file or folder at `cfg.path`, the source of the project modules `code` (e.g. "data.molecules")
    and the `packages` versions. Any change to one of them is a cache miss; the same inputs are a hit, even
    after the file was rewritten."""

    def key(context, parameters: dict) -> str:
        cfg = parameters["cfg"]
        digest = hashlib.sha256(cfg.model_dump_json().encode())
        digest.update(" ".join(f"{name}=={version(name)}" for name in packages).encode())
        roots = [_source_of(module) for module in code] + ([Path(cfg.path)] if cfg.path else [])
        for root in roots:
            for file in sorted(root.rglob("*") if root.is_dir() else [root]):
                if file.is_file() and "__pycache__" not in file.parts:
                    digest.update(file.name.encode() + file.read_bytes())
        return digest.hexdigest()

    return key


def _source_of(module: str) -> Path:
    """The file of a module, or the folder of a package, that is imported."""
    spec = importlib.util.find_spec(module)
    return Path(spec.origin).parent if spec.submodule_search_locations else Path(spec.origin)


def cached_io_task(key: Callable[..., str], **kwargs):
    """An io_task whose result is stored (in PREFECT_HOME/storage) and reused for 30 days under `key`."""
    return task(**_IO_RETRIES, cache_key_fn=key, persist_result=True, cache_expiration=timedelta(days=30), **kwargs)


class _NoTracebackForBadInput(logging.Filter):
    """Prefect logs a failed run's exception with its traceback; for bad input the message says it all."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], BAD_INPUT):
            record.exc_info, record.exc_text = None, None
        return True


def _quiet_bad_input_tracebacks() -> None:
    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
                                      if name.startswith("prefect"))]
    for handler in {h for logger in loggers for h in logger.handlers}:
        handler.addFilter(_NoTracebackForBadInput())


def stage_cli(flow: Flow, stoppable: bool = True, locked: bool = True, **options: OptionInfo) -> None:
    """Run a stage flow from the command line: `python -m flows.stages.<stage> <family> [--params FILE]` (the family
    argument where the flow takes one, flows/family.py).

    `options`: more command-line options, flow parameter name -> `typer.Option(default, "--flag", help=...)` (of
    the flow parameter's type).
    The flow's parallel tasks run on the task runner of `orchestration` (flows/runners.py).
    Bad input or bad params exit with status 2 and a one-paragraph message, no traceback. SIGTERM or SIGINT
    stops the stage within seconds, even inside RDKit (flows/termination.py), with status 128 + signal number;
    `stoppable=False` where the stage must not run in a forked child (a rank of torchrun, whose process group
    exists before the stage starts and does not survive a fork; torchrun passes signals to its ranks itself).
    `locked=False` where the flow does not write the pipeline's workspace and may run beside a pipeline run (batch
    scoring).
    """

    def main(params: str, **values: Any) -> None:
        if "family" in values and values["family"] not in FAMILIES:
            typer.secho(f"error: no model family '{values['family']}' (registered: {', '.join(FAMILIES)})",
                        fg="red", err=True)
            sys.exit(2)
        if locked:
            hold_for_stage()
        if stoppable:
            run_stoppable()
        _quiet_bad_input_tracebacks()
        code = 0
        try:
            runner = task_runner(load_params(params).orchestration)
            flow.with_options(task_runner=runner)(params_file=params, **values)
        except BAD_INPUT as error:
            typer.secho(f"error: {error}", fg="red", err=True)
            code = 2
        except Exception:
            traceback.print_exc()
            code = 1
        if stoppable:
            end_child(code)
        sys.exit(code)

    keyword = inspect.Parameter.KEYWORD_ONLY
    hints = typing.get_type_hints(flow.fn)  # each option's type: the flow parameter's
    family = "family" in inspect.signature(flow.fn).parameters
    main.__signature__ = inspect.Signature([
        *([inspect.Parameter("family", keyword, default=typer.Argument(..., help="the model family"), annotation=str)]
          if family else []),
        inspect.Parameter("params", keyword, default=typer.Option("params.yaml", help="parameters file"), annotation=str),
        *(inspect.Parameter(name, keyword, default=option, annotation=hints[name]) for name, option in options.items()),
    ])
    typer.run(main)
