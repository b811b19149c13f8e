"""The molecule family's export (flows/stages/export.py): the calibrated ensemble to ONNX, checked against PyTorch,
evaluated on test; the training reference of the monitor (descriptor ranges and Morgan fingerprints,
contract/reference.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from data.molecules.descriptors import DESCRIPTOR_SIZE, DESCRIPTORS
from data.molecules.encodings import LAPLACIAN_K, RANDOM_WALK_K
from data.molecules.featurize import FEATURIZER_VERSION, MODEL_INPUT_AXES, MODEL_INPUTS, graph_less
from data.molecules.tokenizer import SmilesTokenizer
from flows.family import Exported
from flows.json_io import read_json
from flows.molecule.artifacts import featurize, load_ensemble
from flows.molecule.evaluation import calibration_error, outputs, test_metrics, uncertainty_figures
from flows.molecule.splits import targets
from flows.paths import StagePaths
from flows.tasks import compute_task
from models.export import CalibratedClassifierEnsemble, CalibratedRegressorEnsemble, check_parity, export_onnx
from models.mc_dropout import FixedMaskPasses
from models.molecule.training import Molecules, fixed_mask_members, model_arrays
from models.monitoring import molecule_reference
from models.predictors import MoleculePredictor

INPUT_DOC = {
    "atom_features": "int64 (atoms, 7) categorical atom features",
    "edge_index": "int64 (2, bonds) both directions of each bond, offset per molecule",
    "bond_features": "int64 (bonds, 4) categorical bond features",
    "positional": f"float32 (atoms, {LAPLACIAN_K + RANDOM_WALK_K}) Laplacian eigenvectors then random-walk landing probabilities",
    "batch": "int64 (atoms,) molecule index of each atom, non-decreasing",
    "atom_mask": "float32 (molecules, slots) 1 for the first n_atoms slots of each molecule",
    "graph_mask": "float32 (molecules,) 1 where the graph view is used (0: one placeholder atom, SMILES view alone)",
    "tokens": "int64 (molecules, tokens) SMILES token ids padded with 0; an all-0 row: graph view only",
    "descriptors": f"float32 (molecules, {DESCRIPTOR_SIZE}) raw RDKit descriptors, in the order of {', '.join(DESCRIPTORS)}; "
                   "NaN: unknown (taken as the training mean); the model uses the leading columns of its set "
                   "(model.descriptors: rdkit all, physical the first 16, none)",
}


@compute_task(name="export-onnx")
def export(model, example: dict[str, np.ndarray], task: str, path, opset: int) -> None:
    tensors = {name: torch.from_numpy(example[name]) for name in MODEL_INPUTS}
    export_onnx(model, tensors, MODEL_INPUT_AXES, outputs(task), path, opset)


@compute_task(name="parity-check")
def parity(model, predictor: MoleculePredictor, molecules: Molecules, smiles: list[str]) -> float:
    """Max |ONNX Runtime - PyTorch| over the outputs, from SMILES and, where the model has a SMILES view, for the
    same molecules without their graph view (`smiles_only` answers; those whose SMILES fits the tokenizer); raises
    when above the tolerance."""
    views = [(molecules, lambda: predictor.predict(smiles))]
    with_tokens = [i for i, tokens in enumerate(molecules.tokens) if tokens is not None]  # the others: no answer
    if predictor.smiles_only and with_tokens:
        hidden = [graph_less(molecules.graphs[i].smiles, "hidden for the parity check") for i in with_tokens]
        views.append((Molecules(hidden, [molecules.tokens[i] for i in with_tokens]),
                      lambda: predictor.predict_graphs(hidden)))
    diff = 0.0
    for view, answer in views:
        arrays = model_arrays(view)
        with torch.no_grad():
            expected = model(*(torch.from_numpy(arrays[name]) for name in MODEL_INPUTS))
        got = answer()
        diff = max(diff, check_parity(expected, [got["prediction"], got["uncertainty"]]))
    return diff


def calibrated_graph(members, state: dict, calibration: dict, val_data: Molecules):
    """The network the ONNX file holds: the members (with the fixed-mask passes calibrate fitted on, built on the
    first validation molecules) and the calibration (interval scale or temperature)."""
    passes = calibration.get("mask_passes", 0)
    if passes:
        members = [FixedMaskPasses(m, passes) for m in fixed_mask_members(
            members, passes, calibration["mask_seed"], val_data.subset(range(min(8, len(val_data)))))]
    if state["task"] == "regression":
        return CalibratedRegressorEnsemble(members, state["target_mean"], state["target_std"], calibration["scale"])
    return CalibratedClassifierEnsemble(members, calibration["temperature"])


def export_model(cfg, paths: StagePaths, prepared) -> Exported:
    """Export, verify parity on validation molecules, evaluate on test and validation."""
    members, state = load_ensemble(paths.finetuned)
    task = state["task"]
    calibration = read_json(paths.calibration)
    tokenizer = SmilesTokenizer.from_dict(state["tokenizer"])
    val_smiles = list(prepared.splits["val"]["smiles"][:64])
    val_data = featurize(val_smiles, tokenizer, cfg.data.max_heavy_atoms)
    model = calibrated_graph(members, state, calibration, val_data).eval()
    export(model, model_arrays(val_data.subset(range(min(4, len(val_data))))), task, paths.onnx, cfg.export.opset)
    data = cfg.data
    card = {"family": "molecule", "task": task, "target": data.target_column if data.source == "file" else data.source,
            "featurizer_version": FEATURIZER_VERSION, "tokenizer": tokenizer.to_dict(), "model": state["model"],
            "calibration": calibration, "ensemble_size": len(members), "mask_passes": calibration.get("mask_passes", 0),
            "outputs": outputs(task), "inputs": INPUT_DOC, "smiles_only": state["model"]["modalities"] != "graph"}
    predictor = MoleculePredictor(paths.onnx, card, prefer_cuda=False)
    max_diff = parity(model, predictor, val_data, val_smiles)
    test = prepared.splits["test"]
    out = predictor.predict(list(test["smiles"]))
    y = targets(prepared, "test")
    metrics = test_metrics(task, y, out["prediction"], out["uncertainty"], card)
    # the same figures on validation (which chose the epochs and fitted the calibration)
    val_out = predictor.predict(list(prepared.splits["val"]["smiles"]))
    val_metrics = test_metrics(task, targets(prepared, "val"), val_out["prediction"], val_out["uncertainty"], card)
    card.update({"test_metrics": metrics, "val_metrics": val_metrics,
                 "uncertainty_quality": uncertainty_figures(task, y, out["prediction"], out["uncertainty"]),
                 "calibration_error": calibration_error(task, metrics, card), "parity_max_abs_diff": max_diff})
    predictions = pd.DataFrame({"smiles": test["smiles"], "target": y, "prediction": np.round(out["prediction"], 6),
                                "uncertainty": np.round(out["uncertainty"], 6)})
    return Exported(card, molecule_reference(list(prepared.splits["train"]["smiles"])), predictions, {},
                    f"molecule model exported (parity {max_diff:.1e}); test metrics "
                    f"{ {k: round(v, 4) for k, v in metrics.items()} }")
