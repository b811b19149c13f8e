"""Uncertainty quality (not a test): a deep ensemble, MC-dropout, and both together, side by side in one run, for
each family with params.yaml's defaults (no per-dataset settings), on CMAPSS FD001 (clean and 20 % flipped training
labels; the ../shared/ANCHORS.md protocol) and on ESOL and BBBP (deterministic scaffold split).

    .venv/bin/python bench/uncertainty.py                                  # everything, seed 0
    .venv/bin/python bench/uncertainty.py --datasets fd001 --flips 0 0.2 --seeds 0 1 2
    .venv/bin/python bench/uncertainty.py --table                          # bench/results/uncertainty.md again

The same trained members serve all three methods, so only the uncertainty differs:
- `ensemble`: the finetune.ensemble_size members with dropout off; the spread over members.
- `mc_dropout`: the first member alone, --passes stochastic passes with dropout on (models/mc_dropout.py).
- `ensemble_mc_dropout`: every member, --passes passes each.
- `fixed_masks`, `ensemble_fixed_masks`: the same with each pass's dropout masks drawn once per feature
  (models/<family>/training.py: fixed_mask_members, what `<family>.calibrate.mask_passes` serves; the sensor
  convolutions' masks drop channels, the attention weights' dropout stays off), so that an item's answer repeats and
  does not depend on its batch, as a served graph needs.
Each is calibrated on validation as the pipeline calibrates its family: temperature scaling of the samples'
logits (probabilities), the scaled-variance interval (values). Measured on test (models/uncertainty_quality.py):
the family's metrics, Spearman correlation of the uncertainty with the loss, AURC and its gain over a random
order, interval coverage at 50/80/90/95 % (values), and forward passes per item. Results merge into
bench/results/uncertainty.json after every condition; bench/results/uncertainty.md is generated from it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.special import expit

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))
sys.path.insert(0, str(PROJECT / "bench"))

import molecule_benchmark  # noqa: E402
import sensor_benchmark  # noqa: E402
from data.sensors.config import SensorDataConfig  # noqa: E402
from data.sensors.prepare import prepare_sensor_data  # noqa: E402
from flows.params import load_params  # noqa: E402
from models.calibration import choose_threshold, fit_interval_scale, fit_temperature  # noqa: E402
from models.mc_dropout import mc_dropout_passes, pass_outputs  # noqa: E402
from models.metrics import classification_metrics, regression_metrics  # noqa: E402
from models.molecule.training import fixed_mask_members, predict_raw  # noqa: E402
from models.sensor.training import predict_logits  # noqa: E402
from models.sensor.training import fixed_mask_members as sensor_fixed_mask_members  # noqa: E402
from models.uncertainty_quality import classification_uncertainty_quality, regression_uncertainty_quality  # noqa: E402

RESULTS = PROJECT / "bench" / "results" / "uncertainty.json"
TABLE = RESULTS.with_suffix(".md")
CPU = torch.device("cpu")
METHODS = ("ensemble", "mc_dropout", "ensemble_mc_dropout", "fixed_masks", "ensemble_fixed_masks")
SPLITS = ("val", "test")


def samples(predict, members: list, passes: int, seed: int) -> dict[str, dict[str, np.ndarray]]:
    """method -> split -> raw outputs (n, samples). `predict(member, split, dropout)` -> (n,)."""
    plain = {s: np.stack([predict(m, s, False) for m in members], 1) for s in SPLITS}
    sampled = {s: np.stack([mc_dropout_passes(lambda: predict(m, s, True), passes, seed * 1000 + i)
                            for i, m in enumerate(members)]) for s in SPLITS}  # (members, passes, n)
    return {"ensemble": plain,
            "mc_dropout": {s: sampled[s][0].T for s in SPLITS},
            "ensemble_mc_dropout": {s: sampled[s].reshape(-1, sampled[s].shape[-1]).T for s in SPLITS}}


def fixed_mask_samples(masked: list, predict, passes: int) -> dict[str, dict[str, np.ndarray]]:
    """The fixed-mask methods: method -> split -> raw outputs (n, samples). `masked`: the members with the pipeline's
    masks (the family's fixed_mask_members, `passes` each; the same for both splits); `predict(model, split)` -> (n,)."""
    out = {s: pass_outputs(masked, passes, lambda model: predict(model, s)) for s in SPLITS}  # member by member
    return {"fixed_masks": {s: out[s][:, :passes] for s in SPLITS}, "ensemble_fixed_masks": out}


def probability_scores(logits: dict[str, np.ndarray], y: dict[str, np.ndarray], target_precision: float | None) -> dict:
    """Temperature on validation; probability = mean, uncertainty = std of the samples' sigmoid(logit / T)."""
    temperature = fit_temperature(logits["val"], y["val"])
    p = {s: expit(logits[s] / temperature) for s in SPLITS}
    mean = {s: p[s].mean(1) for s in SPLITS}
    threshold = 0.5 if target_precision is None else choose_threshold(y["val"], mean["val"], target_precision)
    return {**classification_metrics(y["test"], mean["test"], threshold), "temperature": temperature,
            **classification_uncertainty_quality(y["test"], mean["test"], p["test"].std(1))}


def value_scores(values: dict[str, np.ndarray], y: dict[str, np.ndarray], z: float) -> dict:
    """Scaled variance on validation; value = mean, uncertainty = scale * std of the samples."""
    value, spread = ({s: values[s].mean(1) for s in SPLITS}, {s: values[s].std(1) for s in SPLITS})
    scale = fit_interval_scale(y["val"] - value["val"], spread["val"])
    u = scale * spread["test"]
    return {**regression_metrics(y["test"], value["test"], value["test"] - z * u, value["test"] + z * u),
            "scale": scale, **regression_uncertainty_quality(y["test"], value["test"], u)}


def sensor_condition(params, dataset: str, flip: float, seed: int, passes: int) -> dict:
    sensor = params.sensor
    prepared = prepare_sensor_data(SensorDataConfig(**sensor_benchmark.DATASETS[dataset], train_label_flip_rate=flip,
                                                    seed=seed))
    _, x = sensor_benchmark.featurise(prepared, sensor.model)  # as the pipeline featurises (relative channels)
    y = {s: prepared.windows[s].y for s in ("train", *SPLITS)}
    t = time.time()
    members, _ = sensor_benchmark.trained(sensor, x, y, seed, CPU)  # pretrained on the training windows, as the pipeline
    trained = time.time() - t
    by_method = samples(lambda m, s, dropout: predict_logits(m, x[s], CPU, dropout=dropout), members, passes, seed)
    masked = sensor_fixed_mask_members(members, passes, seed, x["val"][:8])
    by_method.update(fixed_mask_samples(masked, lambda model, s: predict_logits(model, x[s], CPU), passes))
    methods = {name: {**probability_scores(by_method[name], y, sensor.calibrate.target_precision),
                      "forward_passes": by_method[name]["test"].shape[1]} for name in METHODS}
    return {"family": "sensor", "task": "classification", "dataset": dataset, "flip": flip, "seed": seed,
            "members": len(members), "passes": passes, "test_windows": len(y["test"]),
            "test_positives": int(y["test"].sum()), "train_seconds": round(trained, 1), "methods": methods}


def molecule_condition(params, dataset: str, seed: int, passes: int) -> dict:
    molecule = params.molecule
    trained_ensemble = molecule_benchmark.default_ensemble(params, dataset, seed)
    task, data, y, members = trained_ensemble.task, trained_ensemble.data, trained_ensemble.y, trained_ensemble.members
    mean, std, trained = trained_ensemble.mean, trained_ensemble.std, trained_ensemble.seconds
    by_method = samples(lambda m, s, dropout: predict_raw(m, data[s], CPU, dropout=dropout), members, passes, seed)
    masked = fixed_mask_members(members, passes, seed, data["val"])
    by_method.update(fixed_mask_samples(masked, lambda model, s: predict_raw(model, data[s], CPU), passes))
    methods = {}
    for name in METHODS:
        raw = by_method[name]
        scores = (value_scores({s: mean + std * raw[s] for s in SPLITS}, y, molecule.calibrate.interval_z)
                  if task == "regression" else probability_scores(raw, y, None))
        methods[name] = {**scores, "forward_passes": raw["test"].shape[1]}
    return {"family": "molecule", "task": task, "dataset": dataset, "flip": 0.0, "seed": seed, "members": len(members),
            "passes": passes, "test_molecules": len(y["test"]), "train_seconds": round(trained, 1), "methods": methods}


def merge(key: str, result: dict) -> None:
    result = {**result, "commit": sensor_benchmark.commit()}
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results.setdefault("script", "bench/uncertainty.py")
    results.setdefault("runs", {})[key] = result
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


def _cell(values: list[float]) -> str:
    values = np.array(values, dtype=float)
    return f"{values.mean():.3f}" + (f" ± {values.std():.3f}" if len(values) > 1 else "")


def table(results: dict) -> str:
    """Markdown: per dataset and condition, each method's test figures (mean ± sd over seeds)."""
    groups: dict[tuple, list[dict]] = {}
    for run in results["runs"].values():
        groups.setdefault((run["family"], run["dataset"], run["flip"]), []).append(run)
    lines = ["# Uncertainty quality: deep ensemble, MC-dropout, both; MC-dropout with fixed masks", "",
             "Generated by `bench/uncertainty.py --table` from `bench/results/uncertainty.json`. Test split; "
             "mean ± sd over seeds. Spearman: rank correlation of the uncertainty with the loss (Brier for "
             "probabilities, absolute error for values). AURC gain: (random - AURC) / (random - oracle) of the "
             "risk-coverage curve (1: orders the items as their losses do, 0: no better than chance). Coverage: "
             "share of test values inside value ± z × uncertainty at each nominal level.", ""]
    for (family, dataset, flip), runs in sorted(groups.items()):
        task = runs[0]["task"]
        primary = ("rmse", "RMSE") if task == "regression" else ("pr_auc", "PR-AUC")
        flipped = f", {int(flip * 100)} % flipped training labels" if family == "sensor" else ""
        lines += [f"## {dataset}{flipped}", "",
                  f"{len(runs)} seed(s) ({', '.join(str(r['seed']) for r in runs)}); {runs[0]['members']} members, "
                  f"{runs[0]['passes']} MC-dropout passes each.", ""]
        extra = ["coverage 50 / 80 / 90 / 95 %"] if task == "regression" else ["ECE"]
        lines += ["| method | forward passes | " + f"{primary[1]} | Spearman | AURC | AURC gain | " + " | ".join(extra) + " |",
                  "|---|---|---|---|---|---|---|"]
        for method in [m for m in METHODS if all(m in r["methods"] for r in runs)]:
            got = [r["methods"][method] for r in runs]
            cells = [method, str(got[0]["forward_passes"]), _cell([g[primary[0]] for g in got]),
                     _cell([g["spearman"] for g in got]), _cell([g["aurc"] for g in got]),
                     _cell([g["aurc_gain"] for g in got])]
            if task == "regression":
                cells.append(" / ".join(_cell([g["coverage"][level] for g in got]) for level in ("0.5", "0.8", "0.9", "0.95")))
            else:
                cells.append(_cell([g["ece"] for g in got]))
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["fd001", "esol", "bbbp"],
                        choices=[*sensor_benchmark.DATASETS, *molecule_benchmark.DATASETS])
    parser.add_argument("--flips", nargs="+", type=float, default=[0.0, 0.2], help="sensor datasets only")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--passes", type=int, default=10, help="MC-dropout passes per member")
    parser.add_argument("--params", default=str(PROJECT / "params.yaml"))
    parser.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1), help="torch CPU threads")
    parser.add_argument("--table", action="store_true", help="only write bench/results/uncertainty.md from the JSON")
    args = parser.parse_args()
    if not args.table:
        torch.set_num_threads(args.threads)
        params = load_params(args.params)
        for dataset in args.datasets:
            for seed in args.seeds:
                if dataset in sensor_benchmark.DATASETS:
                    for flip in args.flips:
                        result = sensor_condition(params, dataset, flip, seed, args.passes)
                        merge(f"{dataset}/flip{flip}/seed{seed}", result)
                        print(json.dumps({k: {m: round(v[m], 4) for m in ("pr_auc", "spearman", "aurc_gain")}
                                          for k, v in result["methods"].items()}), flush=True)
                else:
                    result = molecule_condition(params, dataset, seed, args.passes)
                    merge(f"{dataset}/seed{seed}", result)
                    primary = "rmse" if result["task"] == "regression" else "roc_auc"
                    print(json.dumps({k: {m: round(v[m], 4) for m in (primary, "spearman", "aurc_gain")}
                                      for k, v in result["methods"].items()}), flush=True)
    TABLE.write_text(table(json.loads(RESULTS.read_text())))
    print(TABLE.read_text())


if __name__ == "__main__":
    main()
