"""Predict with an exported ONNX model and its model card (torch-free: used by flows and serving).

The model card is the JSON that travels with each ONNX file: featurisation state, calibration
parameters, alert threshold and test metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data.errors import DataValidationError
from data.molecules.featurize import (FEATURIZER_VERSION, MolGraph, batch_inputs, encode_tokens, featurize_or_smiles_view,
                                      one_blas_thread)
from data.molecules.tokenizer import SmilesTokenizer
from data.sensors.featurize import WindowFeaturizer, channel_levels
from models.onnx_runtime import load_session, run
from models.sensor.departure import Reference, fit_reference, reference_from_dict


class IncompatibleModelError(ValueError):
    """The model was built for a featurisation this code no longer produces."""


@dataclass(frozen=True)
class UnitReference:
    """A unit's normal for one served model: its channel levels (C,) for the relative channels (None: the model has
    none) and its novelty reference (None: the model has no novelty score)."""

    levels: np.ndarray | None
    departure: Reference | None


class SensorPredictor:
    """Raw windows (n, C, T) with NaN gaps -> failure probability, uncertainty and alert flag, each (n,).

    A model with relative channels (its featurizer's `relative`) sees each window against its unit's level; a model
    exported with the novelty score (its card has `novelty`) also answers `novelty` (P(abnormal) against each
    window's unit reference), `combined` (the two combined by the rule chosen on validation) and `source` (which part
    reached its own threshold); its `alert` is then the combined probability at the combined threshold. A window
    without a unit reference has its relative channels masked (no level known) and is scored for novelty against the
    training fleet's normal. `reference(windows)` fits a unit's reference from its healthy windows.
    """

    def __init__(self, onnx_path: str | Path, card: dict, prefer_cuda: bool = True, threads: int | None = None):
        self.card = card
        self.session, self.provider = load_session(onnx_path, prefer_cuda, threads)
        self.featurizer = WindowFeaturizer.from_dict(card["featurizer"])
        self.threshold = float(card["threshold"])
        novelty = card.get("novelty")
        self.fleet = None if novelty is None else reference_from_dict(novelty["fleet_reference"])
        self.thresholds = None if novelty is None else novelty["thresholds"]

    @property
    def has_novelty(self) -> bool:
        return self.fleet is not None

    @property
    def takes_references(self) -> bool:
        """Whether a unit's reference changes its windows' answers (relative channels or a novelty score)."""
        return self.featurizer.relative or self.has_novelty

    def graph_inputs(self, windows: np.ndarray, references: Sequence[UnitReference | None] | None = None
                     ) -> dict[str, np.ndarray]:
        """The graph's inputs for windows (n, C, T): features, and with novelty each window's novelty reference;
        references: one per window (None: none known)."""
        references = [None] * len(windows) if references is None else list(references)
        if len(references) != len(windows):
            raise ValueError(f"{len(references)} references for {len(windows)} windows: give one per window")
        levels = None
        if self.featurizer.relative:
            unknown = np.full(len(self.featurizer.channels), np.nan)
            levels = np.stack([unknown if r is None or r.levels is None else r.levels for r in references]
                              ).reshape(len(windows), -1)
        features = self.featurizer.transform(windows, levels)
        if not self.has_novelty:
            return {"features": features}
        chosen = [self.fleet if r is None or r.departure is None else r.departure for r in references]
        return {"features": features,
                "reference_mean": np.stack([r.mean for r in chosen]).reshape(len(chosen), -1).astype(np.float32),
                "reference_scale": np.stack([r.scale for r in chosen]).reshape(len(chosen), -1).astype(np.float32),
                "reference_log_error": np.array([r.log_error for r in chosen], dtype=np.float32)}

    def _run(self, windows: np.ndarray, references: Sequence[UnitReference | None] | None) -> dict[str, np.ndarray]:
        return self.run_features(self.graph_inputs(windows, references))

    def featurize(self, windows: np.ndarray) -> dict[str, np.ndarray]:
        """Raw windows (n, C, T) -> the graph's inputs against the fleet's reference (models/serving_cost.py)."""
        return self.graph_inputs(windows)

    def run_features(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The graph's outputs by name for its inputs."""
        return run(self.session, inputs)

    def predict(self, windows: np.ndarray, references: Sequence[UnitReference | None] | None = None
                ) -> dict[str, np.ndarray]:
        """windows (n, C, T); references: one per window (None: none known)."""
        outputs = self._run(windows, references)
        answer = {"probability": outputs["probability"], "uncertainty": outputs["uncertainty"]}
        if not self.has_novelty:
            return {**answer, "alert": outputs["probability"] >= self.threshold}
        failure = outputs["probability"] >= self.threshold
        novel = outputs["novelty"] >= self.thresholds["novelty"]
        source = np.where(failure & novel, "both", np.where(failure, "failure", np.where(novel, "novelty", "combined")))
        alert = outputs["combined"] >= self.thresholds["combined"]
        return {**answer, "novelty": outputs["novelty"], "combined": outputs["combined"], "alert": alert,
                "source": np.where(alert, source, None)}

    def reference(self, windows: np.ndarray) -> UnitReference:
        """A unit's reference from its healthy windows (n, C, T), n >= 1: their channel levels, and the novelty
        reference of their descriptions (shrunk to the fleet's normal)."""
        if not self.takes_references:
            raise ValueError("this model has neither relative channels nor a novelty score: it takes no unit "
                             "references")
        levels = channel_levels(windows) if self.featurizer.relative else None
        if not self.has_novelty:
            return UnitReference(levels, None)
        outputs = self._run(windows, [UnitReference(levels, None)] * len(windows))
        return UnitReference(levels, fit_reference(outputs["description"], outputs["reconstruction_error"], self.fleet))

    def own_references(self, windows: np.ndarray, units: np.ndarray, marked: np.ndarray
                       ) -> list[UnitReference | None]:
        """Per window of windows (n, C, T): its unit's reference fitted on the unit's windows marked (n,) bool as
        healthy (None for every window when the model takes no references, or for a unit with none marked)."""
        if not self.takes_references:
            return [None] * len(windows)
        own = {unit: self.reference(windows[marked & (units == unit)]) for unit in np.unique(units[marked])}
        return [own.get(unit) for unit in units]


class MoleculePredictor:
    """SMILES -> value (regression) or probability (classification) and uncertainty per molecule, and the views it
    was answered from (`modality`).

    The SMILES view is the canonical SMILES of the standardised molecule, tokenised with the model card's tokenizer;
    one longer than the tokenizer takes is answered from its graph alone (`graph_only`). A molecule whose graph
    cannot be built (more heavy atoms than the structural encodings take, or RDKit cannot sanitise or standardise it)
    is answered from its SMILES alone (`smiles_only`) where the model card says the model can (`smiles_only`: a
    model with a SMILES view, exported since it takes unknown descriptors). SMILES answered from neither view get an
    error message instead; the others are still answered.
    """

    def __init__(self, onnx_path: str | Path, card: dict, prefer_cuda: bool = True, threads: int | None = None):
        if card.get("featurizer_version") != FEATURIZER_VERSION:
            raise IncompatibleModelError(
                f"model needs featurizer version {card.get('featurizer_version')}, this code has {FEATURIZER_VERSION}"
            )
        self.card = card
        self.task = card["task"]
        self.smiles_only = bool(card.get("smiles_only", False))
        self.tokenizer = SmilesTokenizer.from_dict(card["tokenizer"])
        self.session, self.provider = load_session(onnx_path, prefer_cuda, threads)

    def featurize(self, smiles: Sequence[str]) -> list[MolGraph | str]:
        """Each SMILES's featurised molecule, or the message saying why it has none (`featurize_smiles`)."""
        return featurize_smiles(smiles)

    def run_features(self, featurized: list[MolGraph | str]) -> dict[str, np.ndarray | list]:
        """`predict_graphs` of the molecules `featurize` could make (models/serving_cost.py)."""
        graphs = [g for g in featurized if not isinstance(g, str)]
        return self.predict_graphs(graphs) if graphs else {}

    def predict(self, smiles: list[str]) -> dict[str, np.ndarray | list]:
        """Returns `prediction` and `uncertainty` (n,) float (NaN where not answered), `error` (n,) str or None and
        `modality` (n,) `fused`, `graph_only`, `smiles_only` or None (not answered)."""
        return self.answer(self.featurize(smiles))

    def answer(self, featurized: list[MolGraph | str]) -> dict[str, np.ndarray | list]:
        """`predict`'s answers for what `featurize` made of the SMILES (made in another process, if need be)."""
        graphs = [None if isinstance(g, str) else g for g in featurized]
        errors = [g if isinstance(g, str) else None for g in featurized]
        prediction = np.full(len(featurized), np.nan, dtype=np.float32)
        uncertainty = np.full(len(featurized), np.nan, dtype=np.float32)
        modality = np.full(len(featurized), None, dtype=object)
        ok = [i for i, g in enumerate(graphs) if g is not None]
        if ok:
            outputs = self.predict_graphs([graphs[i] for i in ok])
            prediction[ok], uncertainty[ok], modality[ok] = (outputs[k] for k in ("prediction", "uncertainty",
                                                                                  "modality"))
            for i, error in zip(ok, outputs["error"]):
                errors[i] = error
        return {"prediction": prediction, "uncertainty": uncertainty, "error": errors, "modality": modality}

    def predict_graphs(self, graphs: list[MolGraph]) -> dict[str, np.ndarray | list]:
        """Featurised molecules (G >= 1, with or without their graph view) -> `prediction`, `uncertainty` (G,)
        float32 (NaN where not answered), `modality` (G,) object (None where not answered) and `error` (G,) str or
        None."""
        tokens = encode_tokens(graphs, self.tokenizer)
        modality = np.array([_modality(g.has_graph, t is not None, self.smiles_only) for g, t in zip(graphs, tokens)],
                            dtype=object)
        errors = [None if m is not None else _unanswered(g, t is not None) for g, t, m in zip(graphs, tokens, modality)]
        prediction = np.full(len(graphs), np.nan, dtype=np.float32)
        uncertainty = np.full(len(graphs), np.nan, dtype=np.float32)
        ok = [i for i, m in enumerate(modality) if m is not None]
        if ok:
            outputs = run(self.session, batch_inputs([graphs[i] for i in ok], [tokens[i] for i in ok]))
            prediction[ok] = outputs["value" if self.task == "regression" else "probability"]
            uncertainty[ok] = outputs["uncertainty"]
        return {"prediction": prediction, "uncertainty": uncertainty, "modality": modality, "error": errors}


def featurize_smiles(smiles: Sequence[str]) -> list[MolGraph | str]:
    """Each SMILES's featurised molecule (its graph and SMILES views, or the SMILES view alone), or the message
    saying why it has none; on one BLAS thread (a module-level function: it runs in worker processes too)."""
    featurized = []
    with one_blas_thread():
        for item in smiles:
            try:
                featurized.append(featurize_or_smiles_view(item))
            except DataValidationError as error:
                featurized.append(str(error))
    return featurized


FUSED, GRAPH_ONLY, SMILES_ONLY = "fused", "graph_only", "smiles_only"  # the views a molecule was answered from


def _modality(has_graph: bool, has_tokens: bool, smiles_only: bool) -> str | None:
    if has_graph:
        return FUSED if has_tokens else GRAPH_ONLY
    return SMILES_ONLY if has_tokens and smiles_only else None


def _unanswered(graph: MolGraph, has_tokens: bool) -> str:
    """Why a molecule without its graph view was not answered from its SMILES either."""
    if not has_tokens:
        return f"{graph.graph_error}; its SMILES view is longer than the model's tokenizer takes"
    return f"{graph.graph_error} (this model version cannot answer from the SMILES alone)"
