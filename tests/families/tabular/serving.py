"""The tabular family in the service: its card model (contract.card), its predictor on the exported graph and its
`ServedFamily` (rows of the card's columns in, value and uncertainty out), registered as any family is."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from contract.card import ModelCard, register_card
from models.onnx_runtime import load_session, run
from serving.family import Prepared, ServedFamily, register_family
from serving.inputs import BadInput
from serving.log_rows import WindowsRecord
from serving.schemas import ModelRef, Reading


@register_card
class TabularCard(ModelCard):
    family: Literal["tabular"]
    columns: list[str] = Field(min_length=1)

    def identity_inputs(self) -> dict:
        return {"columns": list(self.columns)}


class TabularPredictor:
    """Rows (n, k) float32 of the card's columns -> value and uncertainty (n,)."""

    def __init__(self, onnx_path: str | Path, card: dict, prefer_cuda: bool = True, threads: int | None = None):
        self.card = card
        self.session, self.provider = load_session(onnx_path, prefer_cuda, threads)

    def predict(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        return self.run_features(self.featurize(rows))

    def featurize(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        return {"features": np.asarray(rows, dtype=np.float32)}

    def run_features(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return run(self.session, inputs)


class TabularRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rows: list[list[Reading]] = Field(min_length=1, description="one value per column, in the card's order")


class TabularPrediction(BaseModel):
    prediction_id: str | None = None
    value: float
    uncertainty: float


class TabularResponse(BaseModel):
    model: ModelRef
    predictions: list[TabularPrediction]


@register_family
class TabularFamily(ServedFamily):
    """`value` and `uncertainty` per row of the model's columns."""

    name = "tabular"
    predictor = TabularPredictor
    request, response = TabularRequest, TabularResponse
    items_name, tensor_name = "rows", "features"

    @staticmethod
    def details(card: TabularCard) -> dict:
        return {"channels": card.columns}

    def _rows(self, rows, model) -> np.ndarray:
        columns = model.card.columns
        array = np.asarray(rows, dtype=np.float32)
        if array.ndim != 2 or array.shape[1] != len(columns) or np.isnan(array).any():
            raise BadInput(f"each row needs one number for each of {', '.join(columns)}")
        return array

    def items(self, body: TabularRequest, model) -> np.ndarray:
        self.check_count(len(body.rows))
        return self._rows(body.rows, model)

    def tensor_spec(self, model) -> tuple[str, list[int], str]:
        return "FP32", [len(model.card.columns)], f"n rows of {', '.join(model.card.columns)}"

    def tensor_items(self, values: np.ndarray, model) -> np.ndarray:
        return self._rows(values, model)

    def output_types(self, model) -> dict[str, str]:
        return {"value": "FP32", "uncertainty": "FP32"}

    def joined(self, items) -> np.ndarray:
        return np.concatenate(items)

    async def preprocess(self, items: np.ndarray, model) -> Prepared:
        return Prepared(items)

    def predict(self, model, parts: list[np.ndarray]) -> list[tuple]:
        out = model.predictor.predict(np.concatenate(parts))
        return list(zip(out["value"].tolist(), out["uncertainty"].tolist()))

    def postprocess(self, items, prepared: Prepared, outputs: list, model) -> list[dict]:
        return [{"value": value, "uncertainty": spread} for value, spread in outputs]

    def log_record(self, items: np.ndarray, answers: list[dict], model, answered) -> WindowsRecord:
        """Each row logged as a one-step window of its columns."""
        return WindowsRecord(answered, items[:, None, :], model.card.columns, answers, None, None)
