"""A scratch pipeline workspace: the project's pipeline files and code copied into a temporary
git repository, with its own params, Prefect home, MLflow store and DVC cache and remote."""

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


def merged(base: dict, overrides: dict) -> dict:
    """`base` with `overrides` applied recursively."""
    out = dict(base)
    for key, value in overrides.items():
        out[key] = merged(base.get(key, {}), value) if isinstance(value, dict) else value
    return out


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
    params = merged(yaml.safe_load((PROJECT / "params.yaml").read_text()), overrides)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for command in (["git", "init", "-q"], ["git", "add", "-A"],
                    ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "workspace"]):
        subprocess.run(command, cwd=root, check=True)
    return root


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
