"""What the service needs of a model family, in the spirit of KServe's `Model`: turn a request's items into the
graph's inputs (`preprocess`), run the graph on a batch (`predict`), and make the answers (`postprocess`); plus
how the family's items arrive (its /v1 body, its Open Inference Protocol tensor), how they are logged and watched.

The routes (/v1 and /v2), rollout, batching, monitoring and the prediction log are generic and call a family's
`ServedFamily`. A family registers its class with `@register_family`; `serving.families` imports the built-in ones,
so a new family is one module and one line there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from fastapi import APIRouter
from pydantic import BaseModel

from serving.inputs import check_count
from serving.log_rows import Answered
from serving.metrics import ServiceMetrics
from serving.settings import ServingSettings

if TYPE_CHECKING:
    from contract.card import ModelCard
    from serving.loading import LoadedModel

FAMILIES: dict[str, type["ServedFamily"]] = {}


def register_family(cls: type["ServedFamily"]) -> type["ServedFamily"]:
    """Class decorator: serve `cls` as the family `cls.name`."""
    if cls.name in FAMILIES and FAMILIES[cls.name] is not cls:
        raise ValueError(f"a family named {cls.name!r} is registered already ({FAMILIES[cls.name].__qualname__})")
    FAMILIES[cls.name] = cls
    return cls


def family_class(name: str) -> type["ServedFamily"]:
    """The registered class of family `name`."""
    import serving.families  # noqa: F401  (registers the built-in families)

    if name not in FAMILIES:
        raise ValueError(f"no family named {name!r} is registered; the service knows {', '.join(sorted(FAMILIES))}")
    return FAMILIES[name]


@dataclass(frozen=True)
class Prepared:
    """A request's items made ready for the graph: `batch` goes through the micro-batcher (one entry per item the
    graph sees, sliced with the others' items); `state` is what `postprocess` needs of the request."""

    batch: Sequence
    state: Any = None


class ServedFamily(ABC):
    """One family's part of the service; one instance per app (it may own workers: `start`, `close`, `stop`)."""

    name: ClassVar[str]
    predictor: ClassVar[type]  # models.predictors class, built as predictor(onnx_path, card, prefer_cuda=...)
    request: ClassVar[type[BaseModel]]  # the /v1 predict body
    response: ClassVar[type[BaseModel]]  # the /v1 predict answer (for the OpenAPI document)
    items_name: ClassVar[str]  # what the items are called in messages ("windows", "SMILES")
    tensor_name: ClassVar[str]  # the Open Inference Protocol input
    inline_max_items: int = 0  # batches up to this size run on the event loop instead of the model thread

    def __init__(self, settings: ServingSettings, metrics: ServiceMetrics):
        self.settings, self.metrics = settings, metrics

    # ---- items in
    @abstractmethod
    def items(self, body: BaseModel, model: LoadedModel) -> Any:
        """The /v1 body's items, checked against `model` (BadInput names what does not fit)."""

    @abstractmethod
    def tensor_items(self, values: np.ndarray | list[str], model: LoadedModel) -> Any:
        """The Open Inference Protocol input, decoded to the shape of `tensor_spec` (FP32: float32 (n, ...), NaN
        where null; BYTES: n strings), as items (BadInput names what does not fit)."""

    @abstractmethod
    def tensor_spec(self, model: LoadedModel) -> tuple[str, list[int], str]:
        """The input tensor's datatype (`FP32` or `BYTES`), its shape after the items' axis, and what it holds."""

    @abstractmethod
    def output_types(self, model: LoadedModel) -> dict[str, str]:
        """Output tensor name -> datatype (`FP32`, `BOOL`, `BYTES`), each of shape [n]."""

    def output_arrays(self, rows: list[dict], model: LoadedModel) -> dict[str, np.ndarray]:
        """The answers as output tensors: a missing field is NaN (numbers), False or ''."""
        empty = {"FP32": np.nan, "BOOL": False, "BYTES": ""}
        kinds = {"FP32": np.float32, "BOOL": bool, "BYTES": object}
        return {name: np.array([row.get(name, empty[kind]) for row in rows], kinds[kind])
                for name, kind in self.output_types(model).items()}

    # ---- KServe's preprocess, predict, postprocess
    @abstractmethod
    async def preprocess(self, items: Any, model: LoadedModel) -> Prepared:
        """The items made ready for the graph (may wait for workers or the store)."""

    @abstractmethod
    def predict(self, model: LoadedModel, parts: list[Sequence]) -> list:
        """One call of the graph on the batched parts of several requests' `Prepared.batch`: one output per entry,
        in order. Runs on the model's thread (or inline); raises serving.errors.NotReady when `model` cannot take
        a part any more (it changed while the part waited)."""

    @abstractmethod
    def postprocess(self, items: Any, prepared: Prepared, outputs: list, model: LoadedModel) -> list[dict]:
        """One answer per item (a failed item: its `error`)."""

    def size_of(self, entry: Any) -> int:
        """Bytes of one batch entry, for the batcher's byte limit."""
        return 1

    def joined(self, items: Sequence[Any]) -> Any:
        """Several requests' items as one (shadow runs)."""
        return [item for part in items for item in part]

    def failed_answers(self, items: Any) -> list[dict]:
        """What the log records for each item when the model call failed."""
        return [{} for _ in range(len(items))]

    # ---- log and monitoring
    @abstractmethod
    def log_record(self, items: Any, answers: list[dict], model: LoadedModel, answered: Answered) -> Any:
        """The prediction log's record (serving.log_rows) of the items' answers, each carrying its `prediction_id`
        (the items whose answer has an `error` are left out of both)."""

    def input_report(self, model: LoadedModel, rows: Sequence[dict]) -> tuple[str, dict | None, str | None]:
        """Monitoring of recent inputs, from `rows`: the served version's last SERVING_MONITOR_DRIFT_WINDOW
        predictions in the store (any worker's), oldest first, each with its `input_summary` and `output`.
        (key in the family's report, figures or None, a note or None)."""
        return "inputs", None, None

    # ---- service parts
    @staticmethod
    def details(card: ModelCard) -> dict:
        """More /v1/models fields of a version, from its card (serving.schemas.ModelInfo)."""
        return {}

    def routers(self, model_of) -> list[APIRouter]:
        """The family's own routes under /v1; `model_of(role="champion")` gives the served model."""
        return []

    async def start(self) -> None:
        """Start the family's workers (part of the app's start-up)."""

    def close(self) -> None:
        """Refuse new work: the service is stopping."""

    async def stop(self) -> None:
        """End the family's workers."""

    def check_count(self, count: int) -> None:
        check_count(count, self.settings.max_items, self.items_name)

