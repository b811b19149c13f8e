"""Stop a stage promptly on SIGTERM or SIGINT, even while a C extension holds the GIL.

Python runs signal handlers (Prefect's flow engine installs one for SIGTERM) only in the main thread and only
between bytecodes. RDKit holds the GIL for a whole call (a Bemis-Murcko scaffold of a 2,000-atom chain runs
12-28 s in one call), so a handler, Prefect's or ours, waits until that call returns. The stage therefore runs
in a forked child in its own process group, while this process only waits: it gets each signal at once, passes
it on, and kills the group if it is still there after STOP_GRACE_S. A watcher process kills the group when the
waiting process ends by SIGKILL, and the waiting process stops the stage when whatever started it ends: a pipeline
killed outright leaves no stage running.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

from contract.lifetime import die_with_parent

STOP_GRACE_S = 3.0
"""Seconds the stage gets to stop on its own (Prefect marks the run crashed) before the group is killed."""


def end_child(code: int) -> None:
    """End the forked child with `code` once Python-level work is flushed (logging, Prefect's log shipping, stdio),
    skipping the C-level exit handlers: libraries loaded before the fork (ONNX Runtime) wait there for threads that
    exist only in the parent, and the child would hang at exit."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_stoppable() -> None:
    """Fork; the child returns and runs the stage (ending with `end_child`), this process waits and exits with the
    child's status.

    On SIGTERM or SIGINT this process exits within STOP_GRACE_S with status 128 + signal number and one line on
    stderr; the child's process group (Prefect's and Dask's helper processes too) is gone by then. When the child
    ends on its own, what is left of its group is sent SIGTERM.
    """
    child = None

    def stop(signum: int, _frame) -> None:
        _signal_group(child, signum)
        deadline = time.monotonic() + STOP_GRACE_S
        while _running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        _signal_group(child, signal.SIGKILL)
        print(f"error: stopped by {signal.Signals(signum).name}", file=sys.stderr, flush=True)
        os._exit(128 + signum)

    defaults = {signum: signal.signal(signum, stop) for signum in (signal.SIGTERM, signal.SIGINT)}
    die_with_parent()  # what started this process (dvc, the pipeline) ends: SIGTERM, which stops the stage
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        os.setpgid(0, 0)
        for signum, handler in defaults.items():
            signal.signal(signum, handler)
        return
    try:
        os.setpgid(child, child)  # both sides set it, so a signal right after the fork finds the group
    except (PermissionError, ProcessLookupError):
        pass
    _guard(child)
    _, status = os.waitpid(child, 0)
    # what the stage left in its group ends with it: Prefect's temporary API server (its exit handler never runs,
    # end_child skips them) went on running after every stage run outside a pipeline run, e.g. by `dvc repro`
    _signal_group(child, signal.SIGTERM)
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


def _guard(group: int) -> None:
    """Fork a watcher that kills process group `group` (the stage and its helpers) when this process ends in any
    way, SIGKILL included: it sleeps until its parent-death signal, then kills the group and exits. The watcher is
    in a process group of its own: a kill of this process's group (a pipeline killed whole) must not take it along
    before it has done its work."""
    waiting = os.getpid()
    if os.fork() != 0:
        return
    os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the waiting process, which stops the stage
    devnull = os.open(os.devnull, os.O_RDWR)
    for stream in (0, 1, 2):  # what reads the stage's output sees its end when the stage ends, not the watcher's
        os.dup2(devnull, stream)

    def parent_ended(*_) -> None:
        _signal_group(group, signal.SIGKILL)
        os._exit(0)

    signal.signal(signal.SIGTERM, parent_ended)
    die_with_parent(parent=waiting)
    while True:
        signal.pause()


def _running(pid: int) -> bool:
    """Whether the child `pid` has not exited yet (reaps it when it has)."""
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False


def _signal_group(pgid: int | None, signum: int) -> None:
    """Send `signum` to process group `pgid` (None: before the fork, no child yet) if it still exists."""
    if pgid is None:
        return
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass
