"""Tune-stage benchmark (not a test): what `molecule_tune` with a wall-clock budget buys over the defaults.

Per dataset (ESOL, BBBP on the ANCHORS.md scaffold split, `duplicates: keep`), in a scratch copy of the
pipeline: `dvc repro molecule_export` with params.yaml as it is (tuning off), then the same workspace with
`molecule.tune.trials` on and `budget_minutes` set, `dvc repro molecule_export` again (tune, finetune, calibrate
and export re-run; prepare and pretrain are reused). Side by side: the test metric of the exported model
(its model card), the tuning's best validation score, trials run, complete and pruned, and the chosen settings.
Writes bench/results/tune_molecule.json and .md.

    .venv/bin/python bench/tune_benchmark.py                     # both datasets, 30-minute budget each
    .venv/bin/python bench/tune_benchmark.py --datasets esol --budget-minutes 10
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from tabulate import tabulate

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

from flows.params import write_overrides  # noqa: E402
from flows.server import prefect_server  # noqa: E402
from tests.integration.workspace import make_workspace, workspace_env  # noqa: E402

SHARED = Path(os.environ.get("SHARED_DATA_DIR", PROJECT.parent / "shared" / "data"))
DATASETS = {
    "esol": {"path": "esol/delaney-processed.csv", "target": "measured log solubility in mols per litre",
             "task": "regression", "metric": "rmse"},
    "bbbp": {"path": "bbbp/BBBP.csv", "target": "BBBP", "task": "classification", "metric": "roc_auc"},
}
RESULTS = PROJECT / "bench" / "results"


def workspace(root: Path, dataset: str) -> Path:
    """The pipeline copied into `root` (a git repository, as the integration tests make one), reading `dataset`
    from the shared data."""
    spec = DATASETS[dataset]
    return make_workspace(root, {"molecule": {"data": {
        "source": "file", "path": str(SHARED / spec["path"]), "target_column": spec["target"], "task": spec["task"],
        "duplicates": "keep"}}})


def repro(root: Path, env: dict[str, str]) -> float:
    """`dvc repro molecule_export` in the workspace (its output appended to repro.log there); wall-clock seconds."""
    started = time.monotonic()
    with open(root / "repro.log", "a") as log:
        subprocess.run([str(Path(sys.executable).with_name("dvc")), "repro", "molecule_export"], cwd=root, env=env,
                       check=True, stdout=log, stderr=subprocess.STDOUT)
    return time.monotonic() - started


def exported_metric(root: Path, metric: str) -> float:
    card = json.loads((root / "artifacts" / "molecule" / "export" / "model_card.json").read_text())
    return float(card["test_metrics"][metric])


def run_dataset(dataset: str, budget: float, trials: int, scratch: Path) -> dict:
    spec = DATASETS[dataset]
    root = workspace(scratch / dataset, dataset)
    env = {**workspace_env(root), "TQDM_DISABLE": "1"}
    os.environ["PREFECT_HOME"] = env["PREFECT_HOME"]
    with prefect_server() as api:
        env["PREFECT_API_URL"] = api
        default_s = repro(root, env)
        default = exported_metric(root, spec["metric"])
        write_overrides(root / "params.yaml", {"molecule.tune.trials": trials, "molecule.tune.budget_minutes": budget})
        tuned_s = repro(root, env)
    tuned = exported_metric(root, spec["metric"])
    records = json.loads((root / "artifacts" / "molecule" / "tune" / "trials.json").read_text())
    complete = [r for r in records if r["state"] == "complete"]
    row = {"dataset": dataset, "metric": f"test {spec['metric']}", "defaults": round(default, 4),
           "tuned": round(tuned, 4), "budget_minutes": budget, "trials": len(records), "complete": len(complete),
           "pruned": sum(r["state"] == "pruned" for r in records), "best_validation": round(complete[0]["value"], 4),
           "validation_metric": "rmse (standardised)" if spec["task"] == "regression" else "roc_auc",
           "settings": yaml.safe_load((root / "tuned" / "molecule.yaml").read_text()),
           "defaults_pipeline_s": round(default_s), "tune_and_retrain_s": round(tuned_s)}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--budget-minutes", type=float, default=30.0)
    parser.add_argument("--trials", type=int, default=200, help="at most; the budget usually ends the study first")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tune-bench-") as scratch:
        print(f"scratch workspaces under {scratch} (each dataset's repro.log)", flush=True)
        rows = [run_dataset(name, args.budget_minutes, args.trials, Path(scratch)) for name in args.datasets]
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "tune_molecule.json"  # rows of other datasets from an earlier run are kept
    kept = [r for r in json.loads(out.read_text())["rows"] if r["dataset"] not in args.datasets] if out.exists() else []
    rows = sorted(kept + rows, key=lambda r: list(DATASETS).index(r["dataset"]))
    meta = {"script": "bench/tune_benchmark.py", "date": time.strftime("%Y-%m-%d"), "cpu": platform.processor()
            or platform.machine(), "cores": os.cpu_count(), "seed": 0, "split": "scaffold (ANCHORS.md)",
            "space": "molecule.tune.space of params.yaml", "sampler": "tpe, median pruner"}
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    body = [[r["dataset"], r["metric"], r["defaults"], r["tuned"], r["budget_minutes"], r["trials"], r["complete"],
             r["pruned"], f"{r['validation_metric']} {r['best_validation']}",
             ", ".join(f"{k}={v}" for k, v in sorted(r["settings"].items()))] for r in rows]
    table = tabulate(body, ["dataset", "metric", "defaults", "tuned", "budget min", "trials", "complete", "pruned",
                            "best validation", "tuned settings"], tablefmt="github", disable_numparse=True)
    (RESULTS / "tune_molecule.md").write_text(
        f"# molecule_tune against the defaults\n\n`bench/tune_benchmark.py` on {meta['date']}, {meta['cores']} cores, "
        "one seed, scaffold split; the same workspace, tuning off then on.\n\n" + table + "\n")
    print(table)


if __name__ == "__main__":
    main()
