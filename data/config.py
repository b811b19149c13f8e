"""Base class for the validated sections of params.yaml."""

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A params section: unknown keys and wrong types are errors that name the key."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())
