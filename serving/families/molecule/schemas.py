"""The molecule family's /v1 bodies: SMILES in, a value or probability with its uncertainty out."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from serving.schemas import ModelRef


class MoleculeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    smiles: list[str] = Field(min_length=1, description="at most SERVING_MAX_ITEMS, each at most SERVING_MAX_SMILES_LENGTH characters")


class MoleculePrediction(BaseModel):
    prediction_id: str | None = Field(None, description="this answer's id in the prediction log: send outcomes for it "
                                      "to /v1/feedback (absent for an `error`, and when SERVING_PREDICTION_LOG=false)")
    smiles: str
    canonical_smiles: str | None = Field(None, description="the standardised canonical SMILES the model saw")
    value: float | None = Field(None, description="regression models: the predicted value")
    probability: float | None = Field(None, description="classification models: the predicted probability")
    uncertainty: float | None = Field(None, description="regression: scaled ensemble std; classification: ensemble std")
    modality: Literal["fused", "graph_only", "smiles_only"] | None = Field(
        None, description="the views the model answered from: `fused` (the graph and the SMILES tokens), "
                          "`graph_only` (the canonical SMILES is longer than the model's tokenizer takes) or "
                          "`smiles_only` (the graph cannot be built: more heavy atoms than SERVING_MAX_HEAVY_ATOMS, or "
                          "RDKit cannot sanitise or standardise the molecule; no applicability domain then)")
    nearest_similarity: float | None = Field(None, description="applicability domain: Tanimoto similarity (Morgan "
                                             "radius 2, 2048 bits) to the nearest training molecule (absent when the "
                                             "version has no training reference: see /v1/monitoring)")
    in_domain: bool | None = Field(None, description="nearest_similarity >= SERVING_MONITOR_MIN_SIMILARITY: the "
                                   "training set holds a similar molecule")
    descriptors_out_of_range: float | None = Field(None, description="share of the model's RDKit descriptors "
                                                   "outside their training range")
    error: str | None = Field(None, description="why this SMILES could not be answered")


class MoleculeResponse(BaseModel):
    model: ModelRef
    predictions: list[MoleculePrediction]
