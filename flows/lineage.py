"""Data lineage recorded on every MLflow run: the git commit and the DVC hash of each dataset used."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from dvc_data.hashfile.build import build
from dvc_data.hashfile.db import HashFileDB
from dvc_objects.fs.local import LocalFileSystem

from flows._environment import workspace


def git_commit() -> str:
    """HEAD's commit id, with '+dirty' when tracked files changed; 'unknown' outside git."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=workspace(), capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=workspace(), capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def dvc_md5(path: Path) -> str:
    """The md5 DVC gives `path` (a file's md5, or a directory's '<md5>.dir'), as in dvc.lock."""
    fs = LocalFileSystem()
    with tempfile.TemporaryDirectory() as scratch:
        _, _, obj = build(HashFileDB(fs, scratch), str(Path(path).resolve()), fs, "md5", dry_run=True)
    return obj.hash_info.value


def dataset_tags(name: str, path: Path) -> dict[str, str]:
    """MLflow tags naming a dataset's location and DVC md5."""
    resolved = Path(path).resolve()
    root = workspace().resolve()
    shown = resolved.relative_to(root) if resolved.is_relative_to(root) else resolved
    return {f"data.{name}.path": str(shown), f"data.{name}.dvc_md5": dvc_md5(resolved)}
