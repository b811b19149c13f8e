"""The models being served: the version each registry alias points to, swapped in when the alias moves."""

from __future__ import annotations

import logging
import threading

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from serving.loading import LoadedModel, load_version

log = logging.getLogger("serving")


class ModelStore:
    """One LoadedModel per family; `refresh()` follows the alias (a failed load keeps the old model)."""

    def __init__(self, tracking_uri: str, names: dict[str, str], alias: str, prefer_cuda: bool):
        self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
        self.names, self.alias, self.prefer_cuda = names, alias, prefer_cuda
        self.models: dict[str, LoadedModel] = {}
        self.problems: dict[str, str] = {}
        self._lock = threading.Lock()

    @property
    def ready(self) -> bool:
        return all(family in self.models for family in self.names)

    def get(self, family: str) -> LoadedModel | None:
        return self.models.get(family)

    def refresh(self) -> dict[str, str]:
        """Load every family whose alias points to a version other than the one served.

        Returns {family: what happened} for the families that changed or failed."""
        with self._lock:
            return {family: outcome for family in self.names if (outcome := self._refresh(family))}

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
            model = load_version(self.client, family, name, str(version), self.alias, self.prefer_cuda)
        except Exception as error:  # IntegrityError, MLflow, ONNX Runtime, a malformed card: keep serving the old model
            return self._problem(family, f"could not load {name} version {version}: {error}")
        self.models[family] = model
        self.problems.pop(family, None)
        before = f"version {current.version}" if current else "nothing"
        log.info("%s: serving %s version %s (was %s) on %s", family, name, version, before, model.predictor.provider)
        return f"loaded version {version} (was {before})"

    def _problem(self, family: str, message: str) -> str:
        if self.problems.get(family) != message:
            log.warning("%s: %s", family, message)
        self.problems[family] = message
        return message
