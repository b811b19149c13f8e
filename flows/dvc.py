"""Run the DVC command line of the project's environment in the workspace (`dvc repro`, `dvc push`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path

import yaml

from contract.lifetime import child_dies_with_parent
from flows._environment import workspace


class DvcError(RuntimeError):
    """A dvc command failed; the message holds its last output lines."""


def _command(args: tuple[str, ...], env: dict[str, str] | None) -> tuple[list[str], dict[str, str]]:
    """`dvc <args>` of this venv, and the environment with the venv's tools first on PATH (stage commands run
    its python)."""
    venv_bin = Path(sys.executable).parent
    env = {**(env if env is not None else os.environ)}
    env["PATH"] = str(venv_bin) + os.pathsep + env.get("PATH", "")
    return [str(venv_bin / "dvc"), *args], env


def run_dvc(*args: str, log: Callable[[str], None] | None = None, env: dict[str, str] | None = None) -> None:
    """`dvc <args>` in the workspace.

    log: called with each output line (progress bars off); None: output goes to this terminal.
    Raises DvcError on a non-zero exit.
    """
    command, env = _command(args, env)
    if log is None:
        returncode = subprocess.run(command, cwd=workspace(), env=env, preexec_fn=child_dies_with_parent).returncode
        tail = []
    else:
        env["TQDM_DISABLE"] = "1"
        tail = deque(maxlen=15)
        with subprocess.Popen(command, cwd=workspace(), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, bufsize=1, preexec_fn=child_dies_with_parent) as process:
            for line in process.stdout:
                line = line.rstrip()
                tail.append(line)
                log(line)
        returncode = process.returncode
    if returncode != 0:
        raise DvcError(f"dvc {' '.join(args)} failed with status {returncode}" + "".join(f"\n  {t}" for t in tail))


def stages_missing_outputs(env: dict[str, str] | None = None) -> list[str]:
    """Stages recorded in dvc.lock whose outputs are deleted or changed in the workspace: what a failed stage
    leaves, since DVC deletes a stage's outputs before it runs the stage's command."""
    lockfile = workspace() / "dvc.lock"
    if not lockfile.exists():
        return []
    locked = (yaml.safe_load(lockfile.read_text()) or {}).get("stages", {})
    command, env = _command(("status", "--json"), env)
    result = subprocess.run(command, cwd=workspace(), env=env, capture_output=True, text=True)
    if result.returncode != 0:
        return []
    status = json.loads(result.stdout or "{}")
    lost = {"deleted", "modified"}
    return [stage for stage, changes in status.items() if stage in locked
            and any(isinstance(c, dict) and lost & set(c.get("changed outs", {}).values()) for c in changes)]


def repro(*args: str, log: Callable[[str], None] | None = None, env: dict[str, str] | None = None) -> None:
    """`dvc repro <args>`; when it fails, the outputs a failed stage lost are checked out again from the DVC
    cache (the versions in dvc.lock) and the DvcError says so."""
    try:
        run_dvc("repro", *args, log=log, env=env)
    except DvcError as error:
        notes = []
        for stage in stages_missing_outputs(env):
            try:
                run_dvc("checkout", "--force", "--quiet", stage, log=lambda line: None, env=env)
                notes.append(f"the previous outputs of {stage} are restored (dvc checkout {stage})")
            except DvcError:
                notes.append(f"the previous outputs of {stage} are not in the DVC cache: `dvc pull {stage}` "
                             "fetches them from the remote")
        raise DvcError("\n".join([str(error), *notes])) from None
