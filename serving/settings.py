"""Service settings, read from environment variables with the SERVING_ prefix (see docs/serving.md)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ServingSettings(BaseSettings):
    """Where to listen, which registry to read, and the limits put on requests and micro-batches."""

    model_config = SettingsConfigDict(env_prefix="SERVING_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    params_file: str = Field("params.yaml", description="pipeline params: only `tracking` (MLflow store, signing key) "
                             "and each family's `registry.model_name` are read")
    verify_key: str | None = Field(None, description="the public key that registered versions must be signed with; "
                                   "default: the params file's tracking.signing_key with the suffix .pub")
    api_key: str | None = Field(None, description="when set, /v1/* needs `Authorization: Bearer <key>`")
    alias: str = Field("champion", description="registry alias served for both families")
    prefer_cuda: bool = True
    max_items: int = Field(256, ge=1, description="windows or SMILES per request")
    max_smiles_length: int = Field(500, ge=1)
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    batch_max_items: int = Field(512, ge=1, description="a micro-batch is run once it holds this many items")
    batch_wait_ms: float = Field(5.0, ge=0, description="how long a micro-batch waits for more requests")
    poll_seconds: float = Field(30.0, gt=0, description="how often the registry alias is checked for a new version")
