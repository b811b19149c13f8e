"""Stage `molecule_baseline`: random forest on Morgan count fingerprints, same split."""

from __future__ import annotations

import mlflow
import numpy as np
from prefect import flow
from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor

from data.molecules.fingerprints import morgan_counts
from flows.json_io import write_json
from flows.molecule.prepared import load_molecules, targets
from flows.params import load_params
from flows.paths import MOLECULE
from flows.tasks import compute_task, stage_cli
from flows.tracking import stage_run
from models.metrics import classification_metrics, regression_metrics

NAME = "random_forest_morgan"


@compute_task(name="fit-random-forest")
def fit_baseline(smiles: list[str], y: np.ndarray, task: str, n_trees: int, seed: int, max_heavy_atoms: int):
    """The forest, fitted by parallel jobs; it predicts with one job, which sums the trees in their order (parallel
    jobs add them as they finish, and the last bits of the sum then vary from run to run)."""
    forest = RandomForestRegressor if task == "regression" else RandomForestClassifier
    fitted = forest(n_estimators=n_trees, n_jobs=-1, random_state=seed).fit(
        morgan_counts(smiles, max_heavy_atoms=max_heavy_atoms), y)
    return fitted.set_params(n_jobs=1)


@flow(name="molecule-baseline")
def molecule_baseline(params_file: str = "params.yaml") -> dict:
    """Random forest (`molecule.baseline.n_trees`, Morgan counts r=2, 2048 bits): fit on train, metrics on test."""
    params = load_params(params_file)
    n_trees = params.molecule.baseline.n_trees
    prepared = load_molecules()
    task = prepared.task
    model = fit_baseline(list(prepared.splits["train"]["smiles"]), targets(prepared, "train"), task, n_trees,
                         params.molecule.data.seed, params.molecule.data.max_heavy_atoms)
    test_x = morgan_counts(list(prepared.splits["test"]["smiles"]), max_heavy_atoms=params.molecule.data.max_heavy_atoms)
    y = targets(prepared, "test")
    if task == "regression":
        prediction = model.predict(test_x)
        metrics = regression_metrics(y, prediction)
    else:
        prediction = model.predict_proba(test_x)[:, 1]
        metrics = classification_metrics(y, prediction)
    write_json(MOLECULE.baseline, {"name": NAME, "test": metrics, "test_prediction": np.round(prediction, 6).tolist()})
    with stage_run(params.tracking, "molecule", "baseline", {"baseline": NAME, "n_trees": n_trees},
                   {"molecule": MOLECULE.prepared}):
        mlflow.log_metrics({f"test_{k}": v for k, v in metrics.items()})
    print(f"molecule baseline ({NAME}) test metrics: { {k: round(v, 4) for k, v in metrics.items()} }")
    return metrics


if __name__ == "__main__":
    stage_cli(molecule_baseline)
