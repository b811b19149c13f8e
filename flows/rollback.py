"""`python -m flows.rollback <family>`: move `champion` back to the version it replaced.

A promoted version carries a `previous_champion` tag (see flows.registry.apply_decision); rolling back
verifies that version's signed manifest, points the alias at it (recorded in the registry's audit trail) and
tags the demoted one `promotion=rolled_back`. Rolling back again follows the restored version's own tag further
back. A running service picks the change up at its next registry poll, or at once on POST /v1/admin/reload.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import typer
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from contract.card import CardError
from contract.manifest import ManifestError, load_verify_key, public_key_path
from contract.registry import CHAMPION, actor, download_verified, move_alias
from flows.family import FAMILIES, pipeline_family
from flows.params import ParamsError, load_params
from flows.tracking import signing_key, use_tracking


class RollbackError(RuntimeError):
    """There is no champion, or it records no previous champion to go back to."""


def rollback(name: str, verify_key: Path) -> tuple[str, str]:
    """Point `champion` of registered model `name` at its `previous_champion`, once that version's manifest checks
    out against `verify_key`; returns (from, to) versions."""
    client = MlflowClient()
    try:
        current = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        raise RollbackError(f"{name} has no '{CHAMPION}' version: nothing to roll back") from None
    previous = current.tags.get("previous_champion")
    if not previous:
        raise RollbackError(f"{name} version {current.version} is champion but records no previous champion "
                            f"(it was the first one promoted): nothing to roll back to")
    try:
        client.get_model_version(name, previous)
    except MlflowException:
        raise RollbackError(f"{name} version {previous}, the previous champion, no longer exists") from None
    with tempfile.TemporaryDirectory(prefix="rollback-") as scratch:
        try:
            download_verified(client, name, previous, Path(scratch), load_verify_key(verify_key))
        except (ManifestError, CardError) as error:
            raise RollbackError(f"refusing to roll back to it: {error}") from None
    move_alias(client, name, CHAMPION, previous, actor("make rollback"), f"rollback from version {current.version}")
    client.set_model_version_tag(name, current.version, "promotion", "rolled_back")
    return str(current.version), str(previous)


def main(
    family: str = typer.Argument(..., help=f"which model family to roll back: {', '.join(FAMILIES)}"),
    params: str = typer.Option("params.yaml", help="parameters file: registry model names and MLflow store"),
) -> None:
    try:
        config = load_params(params)
        use_tracking(config.tracking)
        if family not in FAMILIES:
            raise RollbackError(f"no model family '{family}' (registered: {', '.join(FAMILIES)})")
        name = pipeline_family(family).settings(config).registry.model_name
        before, after = rollback(name, public_key_path(signing_key(config.tracking)))
    except (ParamsError, RollbackError) as error:
        typer.secho(f"error: {error}", fg="red", err=True)
        sys.exit(2)
    print(f"{name}: '{CHAMPION}' moved from version {before} back to version {after}")


if __name__ == "__main__":
    typer.run(main)
