"""Stage `molecule_register`: a new registry version, the promotion gate, metrics/molecule.json (the decision)
and metrics/molecule/ (test metrics per model)."""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
from mlflow.models import ModelSignature
from mlflow.types import Schema, TensorSpec
import typer
from prefect import flow

from data.molecules.descriptors import DESCRIPTOR_SIZE
from data.molecules.encodings import POSITIONAL_SIZE
from data.molecules.featurize import ATOM_FEATURE_SIZES, BOND_FEATURE_SIZES
from flows import plots
from flows.json_io import read_json, write_json, write_metrics_by_model
from flows.molecule.evaluation import outputs, test_metrics
from flows.molecule.prepared import load_molecules
from flows.molecule.plots import roc_curves
from flows.params import load_params
from flows.paths import MOLECULE
from contract.reference import REFERENCE
from flows.registry import register_and_gate
from flows.tasks import io_task, stage_cli
from flows.tracking import signing_key, stage_run
from models.predictors import MoleculePredictor


def signature(task: str, n_atom_features: int, n_bond_features: int) -> ModelSignature:
    """Dynamic numbers of atoms, bonds, molecules, atom slots and SMILES tokens."""
    i64, f32 = np.dtype(np.int64), np.dtype(np.float32)
    return ModelSignature(
        inputs=Schema([TensorSpec(i64, (-1, n_atom_features), "atom_features"), TensorSpec(i64, (2, -1), "edge_index"),
                       TensorSpec(i64, (-1, n_bond_features), "bond_features"),
                       TensorSpec(f32, (-1, POSITIONAL_SIZE), "positional"), TensorSpec(i64, (-1,), "batch"),
                       TensorSpec(f32, (-1, -1), "atom_mask"), TensorSpec(f32, (-1,), "graph_mask"),
                       TensorSpec(i64, (-1, -1), "tokens"), TensorSpec(f32, (-1, DESCRIPTOR_SIZE), "descriptors")]),
        outputs=Schema([TensorSpec(f32, (-1,), name) for name in outputs(task)]),
    )


@io_task(name="register-and-gate")
def register(params, card: dict, test: pd.DataFrame, new_task: bool, baseline: dict[str, float]) -> dict:
    y = test["target"].to_numpy(dtype=float)

    def champion_metrics(onnx_path: Path, champion_card: dict) -> dict[str, float]:
        out = MoleculePredictor(onnx_path, champion_card, prefer_cuda=False).predict(list(test["smiles"]))
        return test_metrics(champion_card["task"], y, out["prediction"], out["uncertainty"], champion_card)

    sig = signature(card["task"], len(ATOM_FEATURE_SIZES), len(BOND_FEATURE_SIZES))
    return register_and_gate(params.molecule.registry, card, MOLECULE.onnx, sig, champion_metrics,
                             signing_key(params.tracking), new_task,
                             extra_files={REFERENCE: MOLECULE.reference}, baseline=baseline,
                             test_positives=int(y.sum()) if card["task"] == "classification" else None)


@flow(name="molecule-register")
def molecule_register(params_file: str = "params.yaml", new_task: bool = False) -> dict:
    """Register the exported model; promote it to `champion` if it passes the gate. `new_task`: the model predicts
    another task than the champion (another target or inputs) and may replace it."""
    params = load_params(params_file)
    card = read_json(MOLECULE.model_card)
    baseline = read_json(MOLECULE.baseline)
    test = load_molecules().splits["test"]
    with stage_run(params.tracking, "molecule", "register", {"registry": params.molecule.registry.model_dump()},
                   {"molecule": MOLECULE.prepared}):
        outcome = register(params, card, test, new_task, baseline["test"])
        mlflow.log_metrics({f"test_{k}": v for k, v in card["test_metrics"].items()})
        mlflow.log_metrics({f"baseline_test_{k}": v for k, v in baseline["test"].items()})
        y = test["target"].to_numpy()
        predictions = {"ensemble (ours)": pd.read_csv(MOLECULE.predictions)["prediction"].to_numpy(),
                       baseline["name"]: np.asarray(baseline["test_prediction"])}
        draw = plots.parity_plot if card["task"] == "regression" else plots.reliability_diagram
        mlflow.log_artifact(str(draw(y, predictions, MOLECULE.plots / "test_performance.png")))
        if card["task"] == "classification":  # reliability above; ROC too (logged, not a DVC plot)
            mlflow.log_artifact(str(roc_curves(y, predictions, MOLECULE.plots / "roc_test.png")))
    summary = {"model": card["test_metrics"], "model_val": card["val_metrics"],
               "baseline": {"name": baseline["name"], **baseline["test"]}, **outcome}
    write_json(MOLECULE.metrics, summary)
    write_metrics_by_model(MOLECULE.test_metrics, {"ours": card["test_metrics"], baseline["name"]: baseline["test"]})
    verdict = "promoted to champion" if outcome["promoted"] else "kept as challenger"
    print(f"molecule model version {outcome['registered_version']} {verdict}: {'; '.join(outcome['reasons'])}")
    return summary


if __name__ == "__main__":
    stage_cli(molecule_register, new_task=typer.Option(
        False, "--new-task", help="the model predicts another task than the champion (another target or inputs): "
        "judge it on calibration alone and let it replace the champion"))
