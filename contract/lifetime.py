"""Processes that end with the process that started them: Linux's parent-death signal (prctl PR_SET_PDEATHSIG), so
that no worker, writer or trainer outlives the service or pipeline that started it, even one killed with SIGKILL.
Shared by the service and the pipeline; elsewhere than Linux it does nothing."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def child_dies_with_parent() -> None:
    """`preexec_fn` of a subprocess.Popen (called from the parent's main thread): the program started ends with
    the parent, SIGTERM when the parent ends in any way. Only the C call runs between fork and exec."""
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def die_with_parent(sig: signal.Signals = signal.SIGTERM, parent: int | None = None) -> None:
    """Have this process get `sig` when the thread that started it ends (for a process started from a program's
    main thread: when that program ends), and get it at once if the parent is already gone: `parent`, the pid the
    child read before it was forked (else its parent now, which the child may read only once it was reparented).
    Nothing where the platform cannot (not Linux)."""
    if _LIBC is None:
        return
    parent = os.getppid() if parent is None else parent
    if _LIBC.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the parent ended before the signal was set
        os.kill(os.getpid(), sig)
