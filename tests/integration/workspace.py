"""A scratch pipeline workspace: the project's pipeline files and code copied into a temporary
git repository, with its own params, Prefect home, MLflow store and DVC cache and remote; and clones of the finished
tiny workspace, built once per test run, so that the tests do not each prepare the data, pretrain or run the pipeline
again."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

PROJECT = Path(__file__).resolve().parents[2]
COPIED = ["dvc.yaml", ".dvcignore", ".dvc/config", "contract", "data", "models", "flows"]
BIN = Path(sys.executable).parent

TINY = {
    "sensor": {
        "data": {"window": 16, "stride": 8, "horizon": 24,
                 "simulator": {"n_units": 24, "n_steps": 600, "failure_fraction": 0.6}},
        "model": {"hidden": 8, "layers": 2},
        "pretrain": {"epochs": 1},
        "finetune": {"epochs": 2, "patience": 1, "ensemble_size": 2},
        "calibrate": {"mask_passes": 2},  # MC-dropout with fixed masks: calibrated and exported with the members
        # tiny models lose to their baselines and tiny test splits hold few positives: the gate judges them anyway
        "registry": {"must_beat_baseline": False, "min_positives": 1},
    },
    "molecule": {
        "model": {"hidden": 16, "layers": 2},
        "pretrain": {"epochs": 1},
        "finetune": {"epochs": 2, "patience": 1, "ensemble_size": 2},
        "calibrate": {"mask_passes": 2},  # MC-dropout with fixed masks: calibrated and exported with the members
        "baseline": {"n_trees": 50},
        "registry": {"must_beat_baseline": False},
    },
}
"""Settings small enough for a test: the stages run in seconds."""

NOT_CLONED = {".prefect", "mlflow", ".dvc-storage", ".dvc/tmp", ".dvc/site-cache"}
"""Kept out of a clone: its run history, Prefect home, DVC remote and DVC's inode state belong to the original."""


def merged(base: dict, overrides: dict) -> dict:
    """`base` with `overrides` applied recursively."""
    out = dict(base)
    for key, value in overrides.items():
        out[key] = merged(base.get(key, {}), value) if isinstance(value, dict) else value
    return out


FINISHED = merged(TINY, {"sensor": {"export": {"quantize": True}}})
"""The finished workspace's settings: TINY with the sensor model quantised to int8 (its export stage writes the float
graph first, then quantises it; the float export as the file served is the default, which the unit tests export)."""


def make_workspace(root: Path, overrides: dict) -> Path:
    """Copy the pipeline into `root` with the project's params.yaml updated by `overrides`, commit it."""
    root.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        source, target = PROJECT / name, root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "prepared"))
        else:
            shutil.copy2(source, target)
    (root / ".dvc" / ".gitignore").write_text("/config.local\n/tmp\n/cache\n/site-cache\n")
    (root / ".gitignore").write_text(".prefect/\nmlflow/\n.dvc-storage/\n")
    _write_params(root, overrides)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    _commit(root, "workspace")
    return root


def build_finished(root: Path) -> None:
    """A FINISHED workspace through which `python -m flows.pipeline run` (what `make run` calls) has run, from
    nothing; its output is in finished_output(root). Not committed after the run: the runs' lineage names the commit
    they ran on."""
    make_workspace(root, FINISHED)
    result = run(root, sys.executable, "-m", "flows.pipeline", "run")
    _output_file(root).write_text(result.stdout)


def finished_output(root: Path) -> str:
    """The standard output of build_finished's pipeline run."""
    return _output_file(root).read_text()


def _output_file(root: Path) -> Path:
    return root.with_name(f"{root.name}.stdout")  # beside the workspace: clones do not copy it


def clone_workspace(template: Path, root: Path, overrides: dict) -> Path:
    """A copy of `template` (its git history, DVC cache, outputs and dvc.lock; not NOT_CLONED) whose params.yaml is
    the project's updated by `overrides`, committed. The stages whose params and inputs the overrides leave alone
    stay up to date."""
    def ignored(folder: str, names: list[str]) -> set[str]:
        return {name for name in names if (Path(folder) / name).relative_to(template).as_posix() in NOT_CLONED}

    shutil.copytree(template, root, ignore=ignored)
    _write_params(root, overrides)
    _commit(root, "clone")
    return root


def _write_params(root: Path, overrides: dict) -> None:
    params = merged(yaml.safe_load((PROJECT / "params.yaml").read_text()), overrides)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def _commit(root: Path, message: str) -> None:
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message, "--allow-empty"],
                   cwd=root, check=True)


def workspace_env(root: Path) -> dict[str, str]:
    """Environment for commands in the workspace: its own Prefect home and the test session's Prefect
    server (PREFECT_API_URL), the venv's tools first."""
    env = {k: v for k, v in os.environ.items()
           if k == "PREFECT_API_URL" or not k.startswith(("PREFECT_", "MLFLOW_TRACKING"))}
    env.update({"PREFECT_HOME": str(root / ".prefect"), "DVC_SITE_CACHE_DIR": str(root / ".dvc" / "site-cache"),
                "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}"})
    return env


def run(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run a command in the workspace; output captured as text."""
    result = subprocess.run(list(args), cwd=root, env=workspace_env(root), capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"{args} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result
