"""The registry both sides use: model names, aliases, where the MLflow store and the signing key are, opening the
store without ever creating it, and alias moves that leave an audit trail in the registry and in the alias audit
log (contract/audit.py).

Settings come from params.yaml, but only from the parts the service shares with the pipeline (`tracking` and
each family's `registry.model_name`), so a training-only setting can never stop serving.
"""

from __future__ import annotations

import datetime
import getpass
import json
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import mlflow.artifacts
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from contract.audit import append_move, audit_log_path
from contract.card import CardError, read_card
from contract.manifest import ManifestError, public_key_path, verify_directory

CHAMPION, CHALLENGER = "champion", "challenger"
FAMILIES = ("sensor", "molecule")
DEFAULT_MODEL_NAMES = {"sensor": "sensor-failure-detector", "molecule": "molecular-property"}
DEFAULT_TRACKING_URI = "sqlite:///mlflow/mlflow.db"
DEFAULT_SIGNING_KEY = ".keys/model-signing.key"
SQLITE = "sqlite:///"
TRACKING_URI_VARIABLE = "MLFLOW_TRACKING_URI"


class RegistryStoreError(RuntimeError):
    """The MLflow store is missing or unreadable."""


def resolve_tracking_uri(uri: str, root: Path) -> str:
    """MLFLOW_TRACKING_URI if set, else `uri`; a relative SQLite path is made absolute under `root`."""
    uri = os.environ.get(TRACKING_URI_VARIABLE) or uri
    if uri.startswith(SQLITE) and not uri[len(SQLITE):].startswith("/"):
        uri = SQLITE + str((root / uri[len(SQLITE):]).resolve())
    return uri


def sqlite_file(uri: str) -> Path | None:
    """The database file of a SQLite store URI; None for other stores."""
    return Path(uri[len(SQLITE):]) if uri.startswith(SQLITE) else None


@dataclass(frozen=True)
class RegistrySettings:
    """The store, the registered model name of each family, and the signing key pair's paths."""

    tracking_uri: str
    model_names: dict[str, str]
    signing_key: Path

    @property
    def verify_key(self) -> Path:
        return public_key_path(self.signing_key)

    @classmethod
    def from_params(cls, params_file: str | Path, families: Sequence[str] = FAMILIES) -> "RegistrySettings":
        """Read `tracking` and each family's `<family>.registry.model_name` of a params file (default: the
        family's name in DEFAULT_MODEL_NAMES, else the family's own name); relative paths are relative to its
        folder. Nothing else in the file is read."""
        path = Path(params_file)
        try:
            params = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as error:
            raise RegistryStoreError(f"cannot read {path}: {error}") from None
        root = path.resolve().parent
        tracking = params.get("tracking") or {}
        names = {family: ((params.get(family) or {}).get("registry") or {}).get(
            "model_name", DEFAULT_MODEL_NAMES.get(family, family)) for family in families}
        return cls(tracking_uri=resolve_tracking_uri(tracking.get("uri", DEFAULT_TRACKING_URI), root),
                   model_names=names, signing_key=root / tracking.get("signing_key", DEFAULT_SIGNING_KEY))


def open_registry(uri: str) -> MlflowClient:
    """A client of an existing store. A SQLite file that is missing is not created (MLflow would create an empty
    one); a store that cannot be read is one line, not a traceback."""
    database = sqlite_file(uri)
    if database is not None and not database.is_file():
        raise RegistryStoreError(f"the MLflow store {database} does not exist: run the pipeline first (make run), "
                                 f"or point MLFLOW_TRACKING_URI at the store")
    try:
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        client.search_registered_models(max_results=1)
    except Exception as error:  # sqlite3.DatabaseError, SQLAlchemy, MLflow and network errors alike
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RegistryStoreError(f"the MLflow store {database or uri} cannot be read: {first[:300]}") from None
    return client


def alias_version(client: MlflowClient, name: str, alias: str) -> str | None:
    """The version `alias` points to, or None."""
    try:
        return str(client.get_model_version_by_alias(name, alias).version)
    except MlflowException:
        return None


def actor(role: str) -> str:
    """Who moves an alias: the role (a stage, a command) with the user and host."""
    return f"{role} ({getpass.getuser()}@{socket.gethostname()})"


def move_alias(client: MlflowClient, name: str, alias: str, version: str, by: str, why: str) -> str | None:
    """Point `alias` at `version` and record who, when, from which version and why: tags `<alias>.set_by`,
    `.set_at`, `.reason`, `.previous` on the version, a record in the registry's alias audit log (when it has one,
    contract/audit.py) and an `audit.<time>` tag on the registered model (with that record's sha256).
    Returns the version the alias pointed to before (None if none)."""
    previous = alias_version(client, name, alias)
    now = datetime.datetime.now(datetime.timezone.utc)
    when = now.isoformat(timespec="microseconds")
    client.set_registered_model_alias(name, alias, version)
    for key, value in {"set_by": by, "set_at": when, "reason": why, "previous": previous or "none"}.items():
        client.set_model_version_tag(name, version, f"{alias}.{key}", value[:5000])
    record = {"at": when, "alias": alias, "from": previous, "to": str(version), "by": by, "why": why}
    log = audit_log_path(client._registry_uri)
    if log is not None:
        record["sha256"] = append_move(log, {**record, "model": name})
    client.set_registered_model_tag(name, f"audit.{now:%Y%m%dT%H%M%S.%fZ}", json.dumps(record)[:5000])
    return previous


def audit_trail(client: MlflowClient, name: str) -> list[dict]:
    """Every recorded alias move of `name`, oldest first: {at, alias, from, to, by, why, and sha256: the audit log
    record's, when the registry has a log}."""
    tags = client.get_registered_model(name).tags
    return [json.loads(value) for key, value in sorted(tags.items()) if key.startswith("audit.")]


@dataclass(frozen=True)
class VerifiedVersion:
    """A downloaded model version whose signed manifest checked out: its folder, model card and manifest."""

    name: str
    version: str
    directory: Path
    card: dict
    manifest: dict

    @property
    def onnx(self) -> Path:
        return self.directory / "model.onnx"


def download_verified(client: MlflowClient, name: str, version: str, destination: Path,
                      public_key: Ed25519PublicKey) -> VerifiedVersion:
    """Download version `version` of `name` into `destination` and verify it against `public_key`.
    ManifestError or CardError, whose message names the version, when it must not be used."""
    source = client.get_model_version_download_uri(name, version)
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=str(destination)))
    try:
        manifest = verify_directory(local, public_key)
        card = read_card(local)
    except (ManifestError, CardError) as error:
        raise type(error)(f"{name} version {version}: {error}") from None
    return VerifiedVersion(name, str(version), local, card, manifest)
