"""Single-view answers of the molecule model (not a test): how good the service's fallbacks are, side by side in one
run, with params.yaml's defaults, on ESOL and BBBP (deterministic scaffold split, ../shared/ANCHORS.md).

    .venv/bin/python bench/fallback_molecule.py                          # both datasets, seed 0
    .venv/bin/python bench/fallback_molecule.py --datasets esol --seeds 0 1 2 --modality-dropout 0 0.1
    .venv/bin/python bench/fallback_molecule.py --descriptor-dropout 0 0.5   # also train the no-descriptor answer

The same trained ensemble answers every test molecule four ways:
- `fused`: both views, as the service answers a molecule it can build a graph for;
- `smiles_only`: the graph view hidden, descriptors kept (a molecule over the size limit of the structural
  encodings: RDKit still reads it);
- `smiles_only_no_descriptors`: the graph view hidden and the descriptors unknown (RDKit cannot sanitise it);
- `graph_only`: the SMILES view hidden (a SMILES the tokenizer cannot take).
`--modality-dropout` trains one ensemble per value of `molecule.finetune.modality_dropout` (the default hides one
view of a training molecule with probability 0.1 each, which is what trains the fallbacks), and one per value of
`--descriptor-dropout` (`molecule.finetune.descriptor_dropout`: a hidden graph takes its descriptors with it). Results
merge into
bench/results/fallback_molecule.json after every condition; bench/results/fallback_molecule.md is generated from it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np
import torch
from tabulate import tabulate

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))
sys.path.insert(0, str(PROJECT / "bench"))

import molecule_benchmark  # noqa: E402
from data.molecules.featurize import graph_less, smiles_view_only  # noqa: E402
from flows.params import load_params  # noqa: E402
from models.molecule.training import Molecules, predict_raw  # noqa: E402
from sensor_benchmark import commit  # noqa: E402

RESULTS = PROJECT / "bench" / "results" / "fallback_molecule.json"
TABLE = RESULTS.with_suffix(".md")
CPU = torch.device("cpu")
VIEWS = ("fused", "smiles_only", "smiles_only_no_descriptors", "graph_only")
HIDDEN = "graph view hidden by the benchmark"


def views(test: Molecules) -> dict[str, Molecules]:
    """The test molecules as each view answers them."""
    smiles = [graph.smiles for graph in test.graphs]
    return {
        "fused": test,
        "smiles_only": Molecules([smiles_view_only(s, HIDDEN) for s in smiles], test.tokens),
        "smiles_only_no_descriptors": Molecules([graph_less(s, HIDDEN) for s in smiles], test.tokens),
        "graph_only": Molecules(test.graphs, [None] * len(test)),
    }


def condition(params, dataset: str, seed: int, modality_dropout: float, descriptor_dropout: float) -> dict:
    finetune = params.molecule.finetune.model_copy(update={"modality_dropout": modality_dropout,
                                                           "descriptor_dropout": descriptor_dropout})
    trained = molecule_benchmark.default_ensemble(params, dataset, seed, finetune)
    task, y, mean, std = trained.task, trained.y, trained.mean, trained.std
    scores = {}
    for view, molecules in views(trained.data["test"]).items():
        raw = np.stack([predict_raw(m, molecules, CPU) for m in trained.members])
        # as the exported ensemble answers: the members' mean value, or their mean probability
        prediction = mean + std * raw.mean(axis=0) if task == "regression" else (1 / (1 + np.exp(-raw))).mean(axis=0)
        scores[view] = molecule_benchmark.metrics(task, y["test"], prediction)
    return {"dataset": dataset, "task": task, "seed": seed, "descriptors": params.molecule.model.descriptors,
            "modality_dropout": modality_dropout, "descriptor_dropout": descriptor_dropout,
            "test_molecules": len(y["test"]), "train_seconds": round(trained.seconds, 1), "views": scores,
            "measured_at": commit()}


def write_table(results: dict) -> str:
    """bench/results/fallback_molecule.md: per dataset, descriptor set, modality and descriptor dropout, each view's
    test metric over seeds (records without a descriptor set were measured with the 16 physical descriptors)."""
    groups: dict[tuple, list[dict]] = {}
    for run in results.values():
        key = (run["dataset"], run.get("descriptors", "physical"), run["modality_dropout"], run["descriptor_dropout"])
        groups.setdefault(key, []).append(run)
    body = []
    for (dataset, descriptors, dropout, descriptor_dropout), runs in sorted(groups.items()):
        metric = "rmse" if runs[0]["task"] == "regression" else "roc_auc"
        cells = []
        for view in VIEWS:
            values = np.array([run["views"][view][metric] for run in runs])
            cells.append(f"{values.mean():.3f}" + (f" ± {values.std():.3f}" if len(values) > 1 else ""))
        body.append([dataset, descriptors, f"{dropout:g}", f"{descriptor_dropout:g}",
                     "RMSE" if metric == "rmse" else "ROC-AUC",
                     ", ".join(str(run["seed"]) for run in sorted(runs, key=lambda r: r["seed"])), *cells])
    text = ("# Single-view answers of the molecule model\n\n"
            "Generated by `bench/fallback_molecule.py` from `bench/results/fallback_molecule.json`: the test split "
            "answered by one ensemble (params.yaml's defaults but `modality_dropout` and `descriptor_dropout`) from "
            "both views and from each view alone, mean ± sd over seeds (numpy std, ddof 0). descriptors: the "
            "ensemble's `molecule.model.descriptors` (the records before 2026-12-07 used the 16 physical ones, and "
            "their BBBP probabilities were the sigmoid of the members' mean logit, not the members' mean probability "
            "that the service answers).\n\n"
            + tabulate(body, ["dataset", "descriptors", "modality dropout", "descriptor dropout", "metric", "seeds",
                              *VIEWS], tablefmt="github", disable_numparse=True) + "\n")
    TABLE.write_text(text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=list(molecule_benchmark.DATASETS),
                        choices=list(molecule_benchmark.DATASETS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--modality-dropout", nargs="+", type=float, default=None,
                        help="default: molecule.finetune.modality_dropout of params.yaml")
    parser.add_argument("--descriptor-dropout", nargs="+", type=float, default=None,
                        help="default: molecule.finetune.descriptor_dropout of params.yaml")
    parser.add_argument("--table", action="store_true", help="only write the markdown table from the stored results")
    args = parser.parse_args()
    if not args.table:
        params = load_params(PROJECT / "params.yaml")
        for dataset in args.datasets:
            for dropout, descriptor_dropout, seed in itertools.product(
                    args.modality_dropout or [params.molecule.finetune.modality_dropout],
                    args.descriptor_dropout or [params.molecule.finetune.descriptor_dropout], args.seeds):
                result = condition(params, dataset, seed, dropout, descriptor_dropout)
                print(f"{dataset} modality dropout {dropout} descriptor dropout {descriptor_dropout} seed {seed}: "
                      f"{result['views']}", flush=True)
                results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
                results[f"{dataset}/{result['descriptors']}/modality_dropout{dropout:g}/"
                        f"descriptor_dropout{descriptor_dropout:g}/seed{seed}"] = result
                RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(write_table(json.loads(RESULTS.read_text())))


if __name__ == "__main__":
    main()
