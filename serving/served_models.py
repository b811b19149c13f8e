"""The models being served: the version each registry alias points to (the champion's, and the challenger's when a
rollout is on), swapped in when the alias moves."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from mlflow.exceptions import MlflowException

from contract.card import CardError
from contract.manifest import ManifestError, load_verify_key
from contract.registry import open_registry, sqlite_file
from serving.loading import LoadedModel, load_version

log = logging.getLogger("serving")


class ServedModels:
    """One LoadedModel per family; `refresh()` follows the alias (a failed load keeps the old model). With
    `challenger_alias`, each family's challenger too, under `challengers`: one that is missing or refused is a
    problem under `problems["<family>.challenger"]` (and none is served), one at the champion's version is none;
    neither ever makes the service not ready.

    The store must exist and be readable (RegistryStoreError otherwise: it is never created here), and the trusted
    public key must load (ManifestError). A SQLite store that disappears later makes the service not ready, with
    the reason under `problems["store"]`, while the loaded models keep answering."""

    def __init__(self, tracking_uri: str, names: dict[str, str], alias: str, verify_key: Path, prefer_cuda: bool,
                 challenger_alias: str | None = None):
        self.public_key = load_verify_key(verify_key)
        self.client = open_registry(tracking_uri)
        self.database = sqlite_file(tracking_uri)
        self.names, self.alias, self.prefer_cuda = names, alias, prefer_cuda
        self.challenger_alias = challenger_alias
        self.models: dict[str, LoadedModel] = {}
        self.challengers: dict[str, LoadedModel] = {}
        self.problems: dict[str, str] = {}
        self._lock = threading.Lock()

    @property
    def ready(self) -> bool:
        return "store" not in self.problems and all(family in self.models for family in self.names)

    def get(self, family: str) -> LoadedModel | None:
        return self.models.get(family)

    def challenger(self, family: str) -> LoadedModel | None:
        return self.challengers.get(family)

    def refresh(self) -> dict[str, str]:
        """Load every family whose alias points to a version other than the one served.

        Returns {family: what happened} for the families that changed or failed."""
        with self._lock:
            if self.database is not None and not self.database.is_file():  # querying would create an empty one
                return {"store": self._problem("store", f"the MLflow store {self.database} has disappeared; "
                                                        f"the loaded models keep answering")}
            self.problems.pop("store", None)
            changes = {family: outcome for family in self.names if (outcome := self._refresh(family))}
            if self.challenger_alias is not None:
                changes.update({f"{family}.challenger": outcome for family in self.names
                                if (outcome := self._refresh_challenger(family))})
            return changes

    def _refresh(self, family: str) -> str | None:
        name = self.names[family]
        try:
            version = self.client.get_model_version_by_alias(name, self.alias).version
        except MlflowException as error:
            return self._problem(family, f"no version of {name} has alias '{self.alias}' ({error.error_code})")
        current = self.models.get(family)
        if current is not None and current.version == str(version):
            self.problems.pop(family, None)
            return None
        try:
            model = load_version(self.client, family, name, str(version), self.alias, self.public_key, self.prefer_cuda)
        except (ManifestError, CardError) as error:  # keep serving the old model
            return self._problem(family, f"refused to serve {error}")
        except Exception as error:  # MLflow, ONNX Runtime, a card this code cannot use: keep serving the old model
            return self._problem(family, f"could not load {name} version {version}: {error}")
        self.models[family] = model
        self.problems.pop(family, None)
        before = f"version {current.version}" if current else "nothing"
        log.info("%s: serving %s version %s (was %s) on %s", family, name, version, before, model.predictor.provider)
        return f"loaded version {version} (was {before})"

    def _refresh_challenger(self, family: str) -> str | None:
        name, key, alias = self.names[family], f"{family}.challenger", self.challenger_alias
        current, champion = self.challengers.get(family), self.models.get(family)
        try:
            version = str(self.client.get_model_version_by_alias(name, alias).version)
        except MlflowException as error:
            self.challengers.pop(family, None)
            return self._problem(key, f"no version of {name} has alias '{alias}' ({error.error_code}): the champion "
                                      f"answers alone")
        if champion is not None and champion.version == version:  # promoted, or rolled back onto the champion
            self.problems.pop(key, None)
            return f"no challenger (was version {current.version})" if self.challengers.pop(family, None) else None
        if current is not None and current.version == version:
            self.problems.pop(key, None)
            return None
        self.challengers.pop(family, None)  # the alias moved on: the old challenger is not what is asked for
        try:
            model = load_version(self.client, family, name, version, alias, self.public_key, self.prefer_cuda)
        except (ManifestError, CardError) as error:
            return self._problem(key, f"refused to run the challenger: {error}")
        except Exception as error:
            return self._problem(key, f"could not load challenger {name} version {version}: {error}")
        self.challengers[family] = model
        self.problems.pop(key, None)
        log.info("%s: challenger %s version %s on %s", family, name, version, model.predictor.provider)
        return f"challenger version {version}"

    def _problem(self, family: str, message: str) -> str:
        if self.problems.get(family) != message:
            log.warning("%s: %s", family, message)
        self.problems[family] = message
        return message
