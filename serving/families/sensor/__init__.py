"""The sensor failure detector as the service serves it: windows (n, T, C) of readings in, per window the failure
probability, alert flag and uncertainty (and, with a novelty score, the novelty and combined alert probability)
out. Each window may name its unit, whose kept healthy windows (serving/families/sensor/units.py) give its normal."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from contract.card import SensorCard
from contract.prediction_store import engine_for, resolve_url, summary_means
from models.predictors import SensorPredictor, UnitReference
from serving.errors import NotReady
from serving.families.sensor.inputs import sensor_windows
from serving.families.sensor.monitoring import sensor_drift_report
from serving.families.sensor.schemas import SensorRequest, SensorResponse
from serving.families.sensor.units import FLEET, UnitReferences, units_router
from serving.family import Prepared, ServedFamily, register_family
from serving.inputs import BadInput
from serving.loading import LoadedModel
from serving.log_rows import Answered, WindowsRecord

NO_REFERENCE = "no input drift: this version has no training reference (registered before references)"


@dataclass(frozen=True)
class SensorItems:
    """One request's windows (n, T, C) float32 (NaN: missing reading) and, when given, each one's unit and time."""

    windows: np.ndarray
    units: Sequence[str | None] | None = None
    times: Sequence[float] | None = None

    def __len__(self) -> int:
        return len(self.windows)


@dataclass(frozen=True)
class ReferencedWindows:
    """Windows (n, T, C), each one's unit reference (None: the fleet's) and the model version the references were
    fitted for; sliced by the batcher like the windows alone."""

    windows: np.ndarray
    references: Sequence[UnitReference | None]
    version: str

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return ReferencedWindows(self.windows[index], self.references[index], self.version)
        return self.windows[index]


@register_family
class SensorFamily(ServedFamily):
    """Failure probability, alert flag and uncertainty per window (body: SensorRequest); with a model that has a
    novelty score also the novelty score against each window's unit reference, the combined alert probability and
    the part that raised the alert."""

    name = "sensor"
    predictor = SensorPredictor
    request, response = SensorRequest, SensorResponse
    items_name, tensor_name = "windows", "windows"

    @staticmethod
    def details(card: SensorCard) -> dict:
        return {"channels": card.channels, "window": card.window, "threshold": card.threshold}

    def __init__(self, settings, metrics):
        super().__init__(settings, metrics)
        self.inline_max_items = settings.inline_max_items  # cheaper than a thread hop for small batches
        store = engine_for(resolve_url(Path(settings.params_file).resolve().parent, settings.prediction_store))
        self.units = UnitReferences(store, settings.max_units, settings.units_refresh_s)

    def items(self, body: SensorRequest, model: LoadedModel) -> SensorItems:
        self.check_count(len(body.windows))
        return SensorItems(sensor_windows(body.windows, model.card.channels, model.card.window), body.units,
                           body.times)

    def tensor_spec(self, model: LoadedModel) -> tuple[str, list[int], str]:
        steps, channels = model.card.window, model.card.channels
        return "FP32", [steps, len(channels)], f"n windows of {steps} time steps of {', '.join(channels)}"

    def tensor_items(self, values: np.ndarray, model: LoadedModel) -> SensorItems:
        infinite = np.argwhere(np.isinf(values))
        if len(infinite):
            i, t, c = infinite[0]
            raise BadInput(f"{self.tensor_name}[{i}][{t}][{c}] ({model.card.channels[c]}) is not a finite float32 "
                           f"reading; send NaN (binary) or null (JSON) for a missing one")
        return SensorItems(values)

    def output_types(self, model: LoadedModel) -> dict[str, str]:
        return {"failure_probability": "FP32", "alert": "BOOL", "uncertainty": "FP32"}

    def size_of(self, window: np.ndarray) -> int:
        return window.nbytes

    def joined(self, items: Sequence[SensorItems]) -> SensorItems:
        units = [u for part in items for u in (part.units or [None] * len(part))]
        return SensorItems(np.concatenate([part.windows for part in items]), units)

    async def preprocess(self, items: SensorItems, model: LoadedModel) -> Prepared:
        """Each window's unit reference for `model` (read from the store in a thread); the state is which normal
        each window is seen against (None: the model takes no references)."""
        references = kinds = None
        if model.predictor.takes_references and items.units is not None and any(u is not None for u in items.units):
            references, kinds = await asyncio.to_thread(self.units.references, items.units, model)
        elif model.predictor.takes_references:  # no unit named: none of its own for any window
            kinds = [FLEET] * len(items)
        return Prepared(ReferencedWindows(items.windows, references or [None] * len(items), model.version), kinds)

    def predict(self, model: LoadedModel, parts: list[ReferencedWindows]) -> list[tuple]:
        if any(part.version != model.version for part in parts):  # references fitted for another version
            raise NotReady("the sensor model changed while the request waited; retry")
        try:
            out = model.predictor.predict(np.concatenate([part.windows for part in parts]).transpose(0, 2, 1),
                                          [r for part in parts for r in part.references])
        except ValueError as error:  # the model was swapped for one with another input layout
            raise NotReady(f"the sensor model changed while the request waited; retry ({error})") from None
        columns = [out["probability"].tolist(), out["alert"].tolist(), out["uncertainty"].tolist()]
        if "novelty" in out:
            columns += [out["novelty"].tolist(), out["combined"].tolist(), out["source"].tolist()]
        return list(zip(*columns))

    def postprocess(self, items: SensorItems, prepared: Prepared, outputs: list, model: LoadedModel) -> list[dict]:
        rows = [{"failure_probability": p, "alert": a, "uncertainty": u} for p, a, u, *_ in outputs]
        if model.predictor.has_novelty:
            for row, (*_, n, c, source) in zip(rows, outputs):
                row.update(novelty_score=n, alert_probability=c, alert_source=source)
        if prepared.state is not None:
            for row, kind in zip(rows, prepared.state):
                row["reference"] = kind
        return rows

    def log_record(self, items: SensorItems, answers: list[dict], model: LoadedModel,
                   answered: Answered) -> WindowsRecord:
        return WindowsRecord(answered, items.windows, model.card.channels, answers, items.units, items.times)

    def input_report(self, model: LoadedModel, rows: Sequence[dict]) -> tuple[str, dict | None, str | None]:
        if model.reference is None:
            return "input_drift", None, NO_REFERENCE
        channels = model.card.channels
        means = summary_means([row["input_summary"] for row in rows], channels)
        return "input_drift", sensor_drift_report(model, channels, means, self.settings), None

    def routers(self, model_of) -> list:
        return [units_router(self.units, model_of, self.settings.max_items)]
