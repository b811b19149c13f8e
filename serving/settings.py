"""Service settings, read from environment variables with the SERVING_ prefix (docs/reference/environment.md)."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from data.molecules.standardize import MAX_HEAVY_ATOMS


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
    admin_key: str | None = Field(None, description="/v1/admin/* needs `Authorization: Bearer <key>`; unset: they "
                                  "answer 403")
    cors_origins: list[str] = Field([], description="origins whose pages may call the API from a browser (JSON list, "
                                    'e.g. ["https://ops.example.com"]); none by default')
    families: list[str] = Field(["sensor", "molecule"], min_length=1, description="the families served (JSON list); "
                                "the service is ready once each has its model")
    alias: str = Field("champion", description="registry alias served for every family")
    rollout: Literal["off", "shadow", "canary"] = Field("off", description="the `challenger` alias of each family: "
                                                        "off (not loaded), shadow (runs beside every answer, logged "
                                                        "only), canary (answers `canary_share` of the requests)")
    canary_share: float = Field(0.1, ge=0, le=1, description="canary: the share of requests the challenger answers "
                                "(chosen by a hash of the request id)")
    shadow_share: float = Field(1.0, ge=0, le=1, description="shadow: the share of requests the challenger runs "
                                "too (chosen by a hash of the request id)")
    shadow_max_pending: int = Field(1024, ge=1, description="shadow: requests waiting or running in shadow at "
                                    "most; more are dropped and counted")
    prefer_cuda: bool = True
    max_items: int = Field(256, ge=1, description="windows or SMILES per request")
    max_smiles_length: int = Field(500, ge=1)
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    max_heavy_atoms: int = Field(MAX_HEAVY_ATOMS, ge=1, description="a larger molecule gets no graph view: it is "
                                 "answered from its SMILES alone where the model can (`modality: smiles_only`), and is "
                                 "not drawn")
    depict_workers: int = Field(1, ge=1, description="processes drawing molecules: at most this many drawings at once")
    request_timeout_s: float = Field(30.0, gt=0, description="a prediction not answered by then gets 504")
    request_read_timeout_s: float = Field(30.0, gt=0, description="a request whose headers and body have not all "
                                          "arrived by then (from its first byte, or from connecting) gets 408 and "
                                          "its connection is closed")
    batch_max_items: int = Field(512, ge=1, description="items per model call at most")
    batch_max_bytes: int = Field(2 * 2**20, ge=1, description="input bytes per model call at most (one item always)")
    batch_share: int = Field(32, ge=1, description="items one request adds to a model call per round-robin turn")
    inline_max_items: int = Field(16, ge=0, description="sensor batches up to this size run on the event loop, "
                                                         "larger ones in the model thread")
    featurize_workers: int | None = Field(None, ge=1, description="processes turning SMILES into graphs, per worker "
                                                                  "(default: the CPU count divided by `workers`)")
    featurize_niceness: int = Field(10, ge=0, le=19, description="how much lower the featurisation processes' CPU "
                                    "priority is than the service's (a long request's molecules yield to the event "
                                    "loops answering the others)")
    featurize_batch_items: int = Field(4, ge=1, description="SMILES per featurisation call at most")
    featurize_batch_chars: int = Field(1000, ge=1, description="SMILES characters per featurisation call at most")
    featurize_turn_chars: int = Field(100, ge=1, description="SMILES characters a request may send to the "
                                      "featurisation workers per round-robin turn: a longer SMILES waits for "
                                      "several turns while other requests' short ones go")
    feature_cache_mb: int = Field(64, ge=0, description="recent SMILES' graphs kept in memory (0: none)")
    workers: int = Field(2, ge=1, description="uvicorn worker processes, each with its own models (bench/serving.py: "
                                              "2 beat 1 on two cores)")
    intra_op_threads: int | None = Field(None, ge=0, description="ONNX Runtime threads per model call (default: the "
                                         "CPU count divided by `workers`; 0: ONNX Runtime's own, one per core)")
    intra_op_spinning: bool = Field(False, description="ONNX Runtime's idle threads spin for the next operator "
                                    "instead of sleeping (off: their spinning took the CPU the event loop needs)")
    shutdown_timeout_s: float = Field(3.0, gt=0, description="on SIGTERM/SIGINT, how long in-flight requests may finish")
    poll_seconds: float = Field(30.0, gt=0, description="how often the registry alias is checked for a new version")
    prediction_log: bool = Field(True, description="give each answer a prediction_id, write it to the prediction "
                                 "store and take feedback at /v1/feedback")
    prediction_store: str | None = Field(None, description="SQLAlchemy URL of the prediction store (SQLite or "
                                         "PostgreSQL); default: the contract's SQLite file beside the params file")
    prediction_journal: str | None = Field(None, description="folder of the prediction log's write-ahead journal "
                                           "(on local disk); default: `<file>.journal/` beside a SQLite store, else "
                                           "`mlflow/journal/` beside the params file")
    prediction_journal_sync: bool = Field(False, description="also sync each group of journal records to the disk "
                                          "(nothing lost to a power cut either; costs throughput)")
    prediction_queue_rows: int = Field(10_000, ge=1, description="prediction rows waiting to be written at most; "
                                       "more wait in the journal for the next start, and are counted")
    prediction_retention_days: float = Field(90.0, gt=0, description="older predictions and their outcomes are deleted")
    prediction_max_rows: int = Field(1_000_000, ge=1, description="the oldest predictions beyond this many are deleted")
    max_units: int = Field(10_000, ge=1, description="sensor units whose healthy windows (their "
                           "reference) the service keeps at most, in the prediction store's database")
    units_refresh_s: float = Field(5.0, gt=0, description="how long a worker trusts the unit references it read "
                                   "(one put through another worker is seen after at most this)")
    # The service's own monitoring (/v1/monitoring, serving/monitoring.py). The defaults are those of the params
    # file's `monitor` section, which the service does not read (tests/unit/test_params.py keeps them equal).
    monitor_seconds: float = Field(30.0, gt=0, description="how often the monitoring figures are recomputed, in the "
                                   "background")
    monitor_drift_window: int = Field(1000, ge=10, description="the served version's last predictions in the store "
                                      "(of every worker) whose inputs are compared with its training reference")
    monitor_outcome_window: int = Field(2000, ge=10, description="the last N labelled outcomes of the served version "
                                        "that are judged")
    monitor_min_items: int = Field(200, ge=1, description="fewer recent inputs or labelled outcomes: figures are shown "
                                   "but raise no alarm")
    monitor_max_psi: float = Field(0.25, gt=0, description="sensor: drift alarm when a channel's PSI is above this")
    monitor_min_similarity: float = Field(0.3, ge=0, le=1, description="molecule: `in_domain` is false when the "
                                          "nearest training molecule's Tanimoto similarity is below this")
    monitor_max_out_of_domain: float = Field(0.3, ge=0, le=1, description="molecule: alarm when a larger share of "
                                             "recent molecules is outside the applicability domain")
    monitor_max_ece: float = Field(0.07, gt=0, le=1, description="classifiers: calibration alarm when the ECE of "
                                   "recent outcomes is above this")
    monitor_max_coverage_error: float = Field(0.1, gt=0, le=1, description="molecule regression: calibration alarm "
                                              "when |interval coverage - nominal| is above this")

    @model_validator(mode="after")
    def _share_the_cores(self) -> ServingSettings:
        share = max(1, (os.cpu_count() or 1) // self.workers)
        if self.featurize_workers is None:
            self.featurize_workers = share
        if self.intra_op_threads is None:
            self.intra_op_threads = share
        return self
