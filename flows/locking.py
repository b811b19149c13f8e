"""One pipeline run at a time in a workspace.

DVC 3 releases its own repository lock while a stage's command runs (so that the command may call dvc),
so two `dvc repro` of different stages run side by side and race on the MLflow and Prefect SQLite stores.
The pipeline lock, `.dvc/tmp/pipeline.lock`, is taken by `python -m flows.pipeline run`, by the UI's
`dvc repro` task and by every stage's entry; a stage started by the run that holds it (a descendant
process) goes ahead. It is an flock: the kernel releases it when the holding process ends, however it ends.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import psutil
import typer
import zc.lockfile

from flows._environment import workspace

_held: list[zc.lockfile.LockFile] = []


class PipelineBusyError(RuntimeError):
    """Another process, not an ancestor of this one, holds the pipeline lock."""


def lock_path() -> Path:
    """The workspace's pipeline lock, next to DVC's own (.dvc/tmp is never committed)."""
    return workspace() / ".dvc" / "tmp" / "pipeline.lock"


def _holder(path: Path) -> tuple[int | None, str]:
    """The pid written by the lock's holder and when it took the lock (the file's modification time)."""
    try:
        text, mtime = path.read_text().strip(), path.stat().st_mtime
    except OSError:
        return None, "?"
    since = datetime.fromtimestamp(mtime, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (int(text) if text.isdigit() else None), since


def acquire() -> zc.lockfile.LockFile | None:
    """Take the pipeline lock; None when this process or one of its ancestors holds it already.

    Raises PipelineBusyError, naming the holder, when another run holds it.
    """
    path = lock_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return zc.lockfile.LockFile(str(path))
    except zc.lockfile.LockError:
        pid, since = _holder(path)
        if pid is not None and pid in {os.getpid(), *(p.pid for p in psutil.Process().parents())}:
            return None
        raise PipelineBusyError(f"another pipeline run holds {path} (pid {pid or '?'} since {since}); "
                                "wait for it or remove the lock if that process is gone") from None


@contextlib.contextmanager
def pipeline_lock() -> Iterator[None]:
    """Hold the pipeline lock for the block (see `acquire`)."""
    lock = acquire()
    try:
        yield
    finally:
        if lock is not None:
            lock.close()


def hold_for_stage() -> None:
    """A stage's entry: hold the pipeline lock until the process exits, or exit with status 3 and one line
    when another run holds it."""
    try:
        lock = acquire()
    except PipelineBusyError as error:
        typer.secho(f"error: {error}", fg="red", err=True)
        sys.exit(3)
    if lock is not None:
        _held.append(lock)
