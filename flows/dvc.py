"""Run the DVC command line of the project's environment in the workspace (`dvc repro`, `dvc push`)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path

from flows._environment import workspace


class DvcError(RuntimeError):
    """A dvc command failed; the message holds its last output lines."""


def run_dvc(*args: str, log: Callable[[str], None] | None = None, env: dict[str, str] | None = None) -> None:
    """`dvc <args>` in the workspace with this venv's tools first on PATH (stage commands run its python).

    log: called with each output line (progress bars off); None: output goes to this terminal.
    Raises DvcError on a non-zero exit.
    """
    venv_bin = Path(sys.executable).parent
    env = {**(env if env is not None else os.environ)}
    env["PATH"] = str(venv_bin) + os.pathsep + env.get("PATH", "")
    command = [str(venv_bin / "dvc"), *args]
    if log is None:
        returncode, tail = subprocess.run(command, cwd=workspace(), env=env).returncode, []
    else:
        env["TQDM_DISABLE"] = "1"
        tail = deque(maxlen=15)
        with subprocess.Popen(command, cwd=workspace(), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, bufsize=1) as process:
            for line in process.stdout:
                line = line.rstrip()
                tail.append(line)
                log(line)
        returncode = process.returncode
    if returncode != 0:
        raise DvcError(f"dvc {' '.join(args)} failed with status {returncode}" + "".join(f"\n  {t}" for t in tail))
