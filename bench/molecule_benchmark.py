"""Molecule benchmark (not a test): ESOL and BBBP on the ANCHORS.md deterministic scaffold split.

Ours (the fused graph + SMILES model, and its ablations: graph only, SMILES only, fused; with and without
pretraining) next to a random forest (500 trees, Morgan counts r=2, 2048 bits) and chemprop 2.x with its CLI
defaults, all on the same split of the same standardised SMILES (the data layer with `duplicates: keep`, which
reproduces 902/113/113 and 1631/204/204). Writes bench/results/molecule.json.

    .venv/bin/python bench/molecule_benchmark.py                       # everything, 1 seed
    .venv/bin/python bench/molecule_benchmark.py --datasets esol --variants fused_pre --seeds 0 1 2
    .venv/bin/python bench/molecule_benchmark.py --chemprop ''         # skip chemprop

chemprop lives in its own virtualenv (its pins would change this project's rdkit): see docs/reference/benchmarks.md.
Model sizes and training settings come from params.yaml (`molecule.model`, `.pretrain`, `.finetune`) as a user
gets them, the same for every dataset (bench/recipe_search.py molecule chose them by validation across both), then the
flags; each variant of bench/recipes/molecule_ablations.yaml changes one thing (views, pretraining, descriptors),
and the one that changes nothing is the headline.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import yaml

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

from data.molecules.config import MoleculeDataConfig  # noqa: E402
from data.molecules.descriptors import DESCRIPTOR_SETS  # noqa: E402
from data.molecules.featurize import featurize_smiles  # noqa: E402
from data.molecules.fingerprints import morgan_counts  # noqa: E402
from data.molecules.prepare import prepare_molecule_data  # noqa: E402
from data.molecules.tokenizer import SmilesTokenizer  # noqa: E402
from flows.params import load_params, with_overrides  # noqa: E402
from models.metrics import classification_metrics, regression_metrics  # noqa: E402
from models.molecule.training import Molecules, finetune_member, predict_raw, pretrain_model  # noqa: E402

SHARED = Path(os.environ.get("SHARED_DATA_DIR", PROJECT.parent / "shared" / "data"))
DATASETS = {
    "esol": {"path": "esol/delaney-processed.csv", "target": "measured log solubility in mols per litre",
             "task": "regression", "sizes": [902, 113, 113], "anchors": {"random_forest": 1.297, "chemprop": 0.826}},
    "bbbp": {"path": "bbbp/BBBP.csv", "target": "BBBP", "task": "classification", "sizes": [1631, 204, 204],
             "anchors": {"random_forest": 0.708, "chemprop": 0.667}},
}
# name -> {description, sets: dotted keys under params.yaml's `molecule`}
VARIANTS = yaml.safe_load((PROJECT / "bench" / "recipes" / "molecule_ablations.yaml").read_text())
CPU = torch.device("cpu")


def flagged(params, args):
    """params.yaml with the CLI's run-size flags (fine-tuning and pretraining epochs) set."""
    flags = {"molecule.finetune.epochs": args.epochs, "molecule.pretrain.epochs": args.pretrain_epochs}
    return with_overrides(params, {key: value for key, value in flags.items() if value})


def variant(params, name: str):
    """params' molecule section with variant `name`'s keys set."""
    return with_overrides(params, {f"molecule.{k}": v for k, v in VARIANTS[name]["sets"].items()}).molecule


def metrics(task: str, y: np.ndarray, p: np.ndarray) -> dict:
    if task == "regression":
        return regression_metrics(y, p)
    m = classification_metrics(y, p)
    return {"roc_auc": m["roc_auc"], "pr_auc": m["pr_auc"], "ece": m["ece"]}


def load(name: str):
    spec = DATASETS[name]
    cfg = MoleculeDataConfig(source="file", path=SHARED / spec["path"], smiles_column="smiles",
                             target_column=spec["target"], task=spec["task"], split="scaffold", duplicates="keep")
    prepared = prepare_molecule_data(cfg)
    sizes = [len(prepared.splits[s]) for s in ("train", "val", "test")]
    if sizes != spec["sizes"]:
        raise SystemExit(f"{name}: split sizes {sizes} differ from the anchors' {spec['sizes']}")
    return prepared, SmilesTokenizer.from_dict(prepared.tokenizer)


@dataclass
class DefaultEnsemble:
    """An ensemble trained with params.yaml's molecule settings on a developer dataset (bench/uncertainty.py,
    bench/fallback_molecule.py): its featurised splits, targets, target scaling and members."""

    task: str
    tokenizer: SmilesTokenizer
    data: dict
    y: dict
    mean: float
    std: float
    members: list
    seconds: float


def default_ensemble(params, name: str, seed: int, finetune=None) -> DefaultEnsemble:
    """Pretrain (where params.yaml does) and fine-tune `molecule.finetune.ensemble_size` members on `name`'s
    scaffold split; `finetune` replaces params.yaml's fine-tuning settings."""
    molecule = params.molecule
    finetune = finetune or molecule.finetune
    prepared, tokenizer = load(name)
    task = DATASETS[name]["task"]
    y = {s: prepared.splits[s]["target"].to_numpy(dtype=float) for s in ("train", "val", "test")}
    data = {s: Molecules.from_smiles(list(prepared.splits[s]["smiles"]), tokenizer) for s in y}
    mean, std = (float(y["train"].mean()), float(y["train"].std())) if task == "regression" else (0.0, 1.0)
    started = time.time()
    pretrained = None
    if molecule.pretrain.enabled and finetune.use_pretrained:
        cfg = molecule.pretrain.model_copy(update={"seed": seed})
        pretrained = pretrain_model(data["train"], len(tokenizer), tokenizer.max_length, molecule.model, cfg, CPU)[0].state_dict()
    members = [finetune_member(data["train"], (y["train"] - mean) / std, data["val"], (y["val"] - mean) / std, task,
                               molecule.model, finetune, pretrained, len(tokenizer), tokenizer.max_length,
                               seed * 100 + i, CPU)[0] for i in range(finetune.ensemble_size)]
    return DefaultEnsemble(task, tokenizer, data, y, mean, std, members, time.time() - started)


def run_forest(prepared, task: str, seed: int) -> np.ndarray:
    from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor
    forest = (RandomForestRegressor if task == "regression" else RandomForestClassifier)(
        n_estimators=500, n_jobs=-1, random_state=seed)
    forest.fit(morgan_counts(list(prepared.splits["train"]["smiles"])), prepared.splits["train"]["target"])
    x = morgan_counts(list(prepared.splits["test"]["smiles"]))
    return forest.predict(x) if task == "regression" else forest.predict_proba(x)[:, 1]


def run_ours(data: dict, y: dict, task: str, tokenizer, model_cfg, finetune_cfg, pretrained: dict | None, seed: int,
             members: int) -> tuple[np.ndarray, list[int]]:
    mean, std = (float(y["train"].mean()), float(y["train"].std())) if task == "regression" else (0.0, 1.0)
    outs, epochs = [], []
    for member in range(members):
        net, result = finetune_member(data["train"], (y["train"] - mean) / std, data["val"], (y["val"] - mean) / std,
                                      task, model_cfg, finetune_cfg, pretrained, len(tokenizer),
                                      tokenizer.max_length, seed * 100 + member, CPU)
        raw = predict_raw(net, data["test"], CPU)
        outs.append(mean + std * raw if task == "regression" else 1 / (1 + np.exp(-raw)))
        epochs.append(result.best_epoch)
    return np.mean(outs, axis=0), epochs


def run_chemprop(binary: str, prepared, task: str, seed: int, epochs: int | None, descriptors: int = 0) -> np.ndarray:
    """chemprop's CLI defaults; `descriptors` > 0: plus the leading columns of our DESCRIPTORS (the set params.yaml's
    model uses) as extra datapoint descriptors (chemprop scales them and concatenates them to its learned
    representation), the same information our model gets."""
    columns = [f"descriptor_{i}" for i in range(descriptors)]
    with tempfile.TemporaryDirectory(prefix="chemprop-") as tmp:
        tmp = Path(tmp)
        paths = []
        for split in ("train", "val", "test"):
            paths.append(tmp / f"{split}.csv")
            frame = prepared.splits[split][["smiles", "target"]].copy()
            if columns:
                values = np.stack([featurize_smiles(x).descriptors[:descriptors] for x in frame["smiles"]])
                frame[columns] = values
            frame.to_csv(paths[-1], index=False)
        extra = ["--descriptors-columns", *columns] if columns else []
        command = [binary, "train", "--data-path", *map(str, paths), "--task-type", task, "--smiles-columns", "smiles",
                   "--target-columns", "target", "--output-dir", str(tmp / "out"), "--pytorch-seed", str(seed),
                   "--data-seed", str(seed), "--num-workers", "0", *extra]
        if epochs:
            command += ["--epochs", str(epochs)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"chemprop train failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        model = next((tmp / "out").rglob("best*.pt"))
        preds = tmp / "preds.csv"
        done = subprocess.run([binary, "predict", "--test-path", str(paths[2]), "--smiles-columns", "smiles",
                               "--model-paths", str(model), "--preds-path", str(preds), "--num-workers", "0", *extra],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"chemprop predict failed:\n{done.stderr[-3000:]}")
        frame = pd.read_csv(preds)
        column = [c for c in frame.columns if c != "smiles"][0]
        return frame[column].to_numpy(dtype=float)


def summarise(runs: list[dict]) -> dict:
    out = {}
    for run in runs:
        out.setdefault(run["method"], []).append(run)
    table = {}
    for method, group in out.items():
        keys = group[0]["metrics"].keys()
        table[method] = {k: {"mean": float(np.mean([g["metrics"][k] for g in group])),
                             "sd": float(np.std([g["metrics"][k] for g in group])), "n": len(group)} for k in keys}
        table[method]["seconds"] = float(np.mean([g["seconds"] for g in group]))
    return table


def markdown_table(report: dict) -> str:
    """A markdown table: per dataset and method, the test metric (mean +- sd over seeds) and seconds."""
    lines = ["| dataset | method | test metric | seeds | seconds per run |", "|---|---|---|---|---|"]
    for name, entry in report.get("datasets", {}).items():
        metric = "rmse" if entry["task"] == "regression" else "roc_auc"
        label = "RMSE" if metric == "rmse" else "ROC-AUC"
        for method, summary in entry["summary"].items():
            m = summary[metric]
            sd = f" +- {m['sd']:.3f}" if m["n"] > 1 else ""
            lines.append(f"| {name} | {method} | {label} {m['mean']:.3f}{sd} | {m['n']} | {summary['seconds']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--members", type=int, default=None, help="ensemble members (default: molecule.finetune.ensemble_size)")
    parser.add_argument("--epochs", type=int, default=None, help="fine-tuning epochs (default: params)")
    parser.add_argument("--pretrain-epochs", type=int, default=None)
    parser.add_argument("--no-forest", action="store_true")
    parser.add_argument("--chemprop", default="chemprop", help="chemprop CLI, a path or a command on PATH (its own venv: "
                        "docs/reference/benchmarks.md); '' to skip")
    parser.add_argument("--chemprop-epochs", type=int, default=None, help="default: chemprop's own (50)")
    parser.add_argument("--chemprop-descriptors", action="store_true",
                        help="also chemprop with our descriptors as extra inputs (method chemprop_descriptors)")
    parser.add_argument("--no-chemprop-default", action="store_true", help="skip chemprop's plain default run")
    parser.add_argument("--params", default=str(PROJECT / "params.yaml"))
    parser.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1), help="torch CPU threads")
    parser.add_argument("--out", default=str(PROJECT / "bench" / "results" / "molecule.json"))
    parser.add_argument("--table", action="store_true", help="print the markdown table of --out and stop")
    parser.add_argument("--merge", action="store_true",
                        help="keep the runs already in --out for this dataset except the (method, seed) pairs run now")
    args = parser.parse_args()
    if args.table:
        print(markdown_table(json.loads(Path(args.out).read_text())))
        return
    torch.set_num_threads(args.threads)

    params = load_params(args.params)
    chemprop = args.chemprop if args.chemprop and shutil.which(args.chemprop) else None

    out_path = Path(args.out)
    report = json.loads(out_path.read_text()) if out_path.is_file() else {}
    report.setdefault("datasets", {})
    for name in args.datasets:
        spec = DATASETS[name]
        prepared, tokenizer = load(name)
        task = spec["task"]
        y = {s: prepared.splits[s]["target"].to_numpy(dtype=float) for s in ("train", "val", "test")}
        data = {s: Molecules.from_smiles(list(prepared.splits[s]["smiles"]), tokenizer) for s in ("train", "val", "test")}
        base = flagged(params, args)
        model_cfg, finetune, pretrain_cfg = base.molecule.model, base.molecule.finetune, base.molecule.pretrain
        members = args.members or finetune.ensemble_size
        # the variant that leaves params.yaml as it is: the headline row
        pipeline_variant = next((f"ours_{n}" for n in VARIANTS if variant(base, n) == base.molecule), None)
        runs = []
        kept = list(report["datasets"].get(name, {}).get("runs", [])) if args.merge else []

        def save():
            done = {(r["method"], r["seed"]) for r in runs}
            merged = [r for r in kept if (r["method"], r["seed"]) not in done] + runs
            report["datasets"][name] = {
                "task": task, "split": "scaffold (ANCHORS.md, DeepChem order), duplicates: keep", "sizes": spec["sizes"],
                "ours": pipeline_variant,
                "anchors_test": spec["anchors"], "seeds": sorted({r["seed"] for r in merged}), "members": members,
                "finetune": finetune.model_dump(mode="json"), "pretrain": pretrain_cfg.model_dump(mode="json"),
                "model": model_cfg.model_dump(), "summary": summarise(merged), "runs": merged,
            }
            # the file as it is now, this dataset replaced: benchmarks of other datasets may write it meanwhile
            current = json.loads(out_path.read_text()) if out_path.is_file() else {}
            current.setdefault("datasets", {})[name] = report["datasets"][name]
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(json.dumps(current, indent=1) + "\n")

        def record(method, seed, prediction, seconds, **extra):
            m = metrics(task, y["test"], prediction)
            runs.append({"method": method, "seed": seed, "metrics": m, "seconds": round(seconds, 1), **extra})
            print(f"{name} {method} seed {seed}: { {k: round(v, 4) for k, v in m.items()} } ({seconds:.0f} s)", flush=True)
            save()  # after every run: a long benchmark stopped half-way keeps what it measured

        for seed in args.seeds:
            if not args.no_forest:
                t = time.time()
                record("random_forest", seed, run_forest(prepared, task, seed), time.time() - t)
            if chemprop and not args.no_chemprop_default:
                t = time.time()
                record("chemprop", seed, run_chemprop(chemprop, prepared, task, seed, args.chemprop_epochs), time.time() - t)
            if chemprop and args.chemprop_descriptors:
                t = time.time()
                record("chemprop_descriptors", seed,
                       run_chemprop(chemprop, prepared, task, seed, args.chemprop_epochs,
                                    descriptors=DESCRIPTOR_SETS[model_cfg.descriptors]), time.time() - t)
            pretrained = {}  # pretraining settings -> (pretrained state, seconds per epoch)

            def pretrained_state(molecule) -> tuple[dict, float] | None:
                """The state pretrained with the variant's `pretrain` section (on params.yaml's model, the training split),
                shared by the variants of the same settings; None where the variant does not pretrain."""
                if not (molecule.pretrain.enabled and molecule.finetune.use_pretrained):
                    return None
                cfg = molecule.pretrain.model_copy(update={"seed": seed})
                key = cfg.model_dump_json()
                if key not in pretrained:
                    t = time.time()
                    net, _ = pretrain_model(data["train"], len(tokenizer), tokenizer.max_length, model_cfg, cfg, CPU)
                    pretrained[key] = net.state_dict(), round((time.time() - t) / cfg.epochs, 1)
                    print(f"{name} pretraining seed {seed} on {len(data['train'])} molecules: {time.time() - t:.0f} s",
                          flush=True)
                return pretrained[key]

            for variant_name in args.variants:
                molecule = variant(base, variant_name)
                state = pretrained_state(molecule)
                t = time.time()
                prediction, best = run_ours(data, y, task, tokenizer, molecule.model, molecule.finetune,
                                            state and state[0], seed, members)
                per_epoch = {"pretrain_seconds_per_epoch": state[1]} if state else {}
                record(f"ours_{variant_name}", seed, prediction, time.time() - t, best_epochs=best, members=members,
                       **per_epoch)
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
