"""Predict with an exported ONNX model and its model card (torch-free: used by flows and serving).

The model card is the JSON that travels with each ONNX file: featurisation state, calibration
parameters, alert threshold and test metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from data.errors import DataValidationError
from data.molecules.featurize import FEATURIZER_VERSION, MolGraph, batch_inputs, encode_tokens, featurize_smiles
from data.molecules.tokenizer import SmilesTokenizer
from data.sensors.featurize import WindowFeaturizer
from models.onnx_runtime import load_session, run
from models.sensor.departure import Reference, fit_reference, reference_from_dict


class IncompatibleModelError(ValueError):
    """The model was built for a featurisation this code no longer produces."""


class SensorPredictor:
    """Raw windows (n, C, T) with NaN gaps -> failure probability, uncertainty and alert flag, each (n,).

    A model exported with the novelty score (its card has `novelty`) also answers `novelty` (P(abnormal) against
    each window's unit reference, the fleet's normal where a window has none), `combined` (the two combined by the
    rule chosen on validation) and `source` (which part reached its own threshold); its `alert` is then the combined
    probability at the combined threshold. `reference(windows)` fits a unit's reference from its healthy windows.
    """

    def __init__(self, onnx_path: str | Path, card: dict, prefer_cuda: bool = True):
        self.card = card
        self.session, self.provider = load_session(onnx_path, prefer_cuda)
        self.featurizer = WindowFeaturizer.from_dict(card["featurizer"])
        self.threshold = float(card["threshold"])
        novelty = card.get("novelty")
        self.fleet = None if novelty is None else reference_from_dict(novelty["fleet_reference"])
        self.thresholds = None if novelty is None else novelty["thresholds"]

    @property
    def has_novelty(self) -> bool:
        return self.fleet is not None

    def graph_inputs(self, windows: np.ndarray, references: Sequence[Reference | None] | None = None
                     ) -> dict[str, np.ndarray]:
        """The graph's inputs for windows (n, C, T): features, and with novelty each window's reference (None: the
        fleet's)."""
        features = self.featurizer.transform(windows)
        if not self.has_novelty:
            return {"features": features}
        chosen = [self.fleet if r is None else r for r in (references or [None] * len(features))]
        if len(chosen) != len(features):
            raise ValueError(f"{len(chosen)} references for {len(features)} windows: give one per window")
        return {"features": features,
                "reference_mean": np.stack([r.mean for r in chosen]).reshape(len(chosen), -1).astype(np.float32),
                "reference_scale": np.stack([r.scale for r in chosen]).reshape(len(chosen), -1).astype(np.float32),
                "reference_log_error": np.array([r.log_error for r in chosen], dtype=np.float32)}

    def _run(self, windows: np.ndarray, references: Sequence[Reference | None] | None) -> dict[str, np.ndarray]:
        return run(self.session, self.graph_inputs(windows, references))

    def predict(self, windows: np.ndarray, references: Sequence[Reference | None] | None = None) -> dict[str, np.ndarray]:
        """windows (n, C, T); references: one per window (None: the fleet's normal), ignored without novelty."""
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

    def reference(self, windows: np.ndarray) -> Reference:
        """A unit's reference from its healthy windows (n, C, T), n >= 1, shrunk to the fleet's normal."""
        if not self.has_novelty:
            raise ValueError("this model has no novelty score: it takes no unit references")
        outputs = self._run(windows, None)
        return fit_reference(outputs["embedding"], outputs["reconstruction_error"], self.fleet)


class MoleculePredictor:
    """SMILES -> value (regression) or probability (classification) and uncertainty per molecule.

    SMILES that do not parse get an error message instead; the others are still answered. The SMILES view is the
    canonical SMILES of the standardised molecule, tokenised with the model card's tokenizer; one longer than the
    tokenizer takes is answered from its graph alone (`graph_only` lists them).
    """

    def __init__(self, onnx_path: str | Path, card: dict, prefer_cuda: bool = True):
        if card.get("featurizer_version") != FEATURIZER_VERSION:
            raise IncompatibleModelError(
                f"model needs featurizer version {card.get('featurizer_version')}, this code has {FEATURIZER_VERSION}"
            )
        self.card = card
        self.task = card["task"]
        self.tokenizer = SmilesTokenizer.from_dict(card["tokenizer"])
        self.session, self.provider = load_session(onnx_path, prefer_cuda)

    def predict(self, smiles: list[str]) -> dict[str, np.ndarray | list]:
        """Returns `prediction` and `uncertainty` (n,) float (NaN where failed), `error` (n,) str or None and
        `graph_only` (n,) bool (SMILES too long for the tokenizer: answered from the graph alone)."""
        graphs, errors = [], []
        for item in smiles:
            try:
                graphs.append(featurize_smiles(item))
                errors.append(None)
            except DataValidationError as error:
                graphs.append(None)
                errors.append(str(error))
        prediction = np.full(len(smiles), np.nan, dtype=np.float32)
        uncertainty = np.full(len(smiles), np.nan, dtype=np.float32)
        graph_only = np.zeros(len(smiles), dtype=bool)
        ok = [i for i, g in enumerate(graphs) if g is not None]
        if ok:
            outputs = self.predict_graphs([graphs[i] for i in ok])
            prediction[ok], uncertainty[ok], graph_only[ok] = (outputs[k] for k in ("prediction", "uncertainty",
                                                                                    "graph_only"))
        return {"prediction": prediction, "uncertainty": uncertainty, "error": errors, "graph_only": graph_only}

    def predict_graphs(self, graphs: list[MolGraph]) -> dict[str, np.ndarray]:
        """Already featurised molecules (G >= 1) -> `prediction`, `uncertainty` (G,) float32, `graph_only` (G,)."""
        tokens = encode_tokens(graphs, self.tokenizer)
        outputs = run(self.session, batch_inputs(graphs, tokens))
        first = "value" if self.task == "regression" else "probability"
        return {"prediction": outputs[first], "uncertainty": outputs["uncertainty"],
                "graph_only": np.array([t is None for t in tokens])}
