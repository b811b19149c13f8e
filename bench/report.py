"""The results report: docs/results.md and its plots (docs/results/*.png), generated from bench/results/*.json.

    python bench/report.py            # or `make report`

Per dataset and condition: ours against every baseline and the reference figures of `../shared/ANCHORS.md`,
mean ± sd over seeds (numpy's std, ddof 0, as the benchmark scripts compute it) with the per-seed values.
The output depends only on the JSON files: rerunning gives identical bytes (the plots carry no timestamp).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from tabulate import tabulate  # noqa: E402

PROJECT = Path(__file__).resolve().parents[1]
ANCHORS = "../shared/ANCHORS.md"

SENSOR_METHODS = {"hist_gradient_boosting": "HGB", "minirocket": "MiniRocket + logistic regression",
                  "ours_full": "ours, benchmark recipe (full)", "ours_defaults": "ours, params.yaml defaults",
                  "ours_no_pretraining": "ours, no pretraining",
                  "ours_plain_ce": "ours, plain CE", "ours_no_calibration": "ours, no calibration",
                  "ours_no_statistics": "ours, no statistics", "ours_mean_teacher": "ours, mean teacher",
                  "ours_uncertainty_weights": "ours, uncertainty weights",
                  "recurrent_rnn": "RNN encoder (as many parameters)",
                  "recurrent_gru": "GRU encoder (as many parameters)",
                  "recurrent_lstm": "LSTM encoder (as many parameters)", "ours_novelty": "novelty only",
                  "ours_combined": "ours + novelty", "ours_combined_fleet": "ours + novelty, fleet reference",
                  "ours_combined_stacker": "ours + novelty, stacker", "ours_combined_max": "ours + novelty, max"}
SENSOR_METRICS = {"pr_auc": "PR-AUC", "ece": "ECE", "roc_auc": "ROC-AUC", "recall_at_p90": "recall at P 0.9",
                  "brier": "Brier"}
# ../shared/ANCHORS.md, test split, +- over 3 seeds; sensor.json does not carry them. (name, PR-AUC, sd, ECE)
SENSOR_REFERENCES = {
    ("fd001", 0.0): [("HGB", 0.975, 0.003, 0.020), ("MiniRocket + CV-tuned logistic regression", 0.977, 0.003, 0.013)],
    ("fd001", 0.2): [("HGB", 0.953, 0.011, 0.300), ("MiniRocket + CV-tuned logistic regression", 0.966, 0.004, 0.204),
                     ("MiniRocket + untuned logistic regression (C=1)", 0.302, 0.032, None)],
}
MOLECULE_METRICS = {"regression": {"rmse": "RMSE", "mae": "MAE", "r2": "R2"},
                    "classification": {"roc_auc": "ROC-AUC", "pr_auc": "PR-AUC", "ece": "ECE"}}
MOLECULE_METHODS = {"random_forest": "random forest", "chemprop": "chemprop (defaults)",
                    "chemprop_descriptors": "chemprop + our 16 descriptors", "ours_fused": "ours (graph + SMILES)",
                    "ours_fused_pre": "ours, pretrained", "ours_fused_pre_distance": "ours, pretrained with distances", "ours_fused_no_descriptors": "ours, no descriptors",
                    "ours_graph": "ours, no SMILES", "ours_graph_pre": "ours, no SMILES, pretrained",
                    "ours_smiles": "ours, no graph", "ours_smiles_pre": "ours, no graph, pretrained"}


@dataclass(frozen=True)
class Row:
    """One method in one condition: its role (reference, baseline, ours, ablation) and per-seed metrics."""

    name: str
    role: str
    seeds: tuple[int, ...]
    metrics: dict[str, list[float]]  # metric -> one value per seed (a reference: [mean] and its sd in `sd`)
    sd: dict[str, float] | None = None
    seconds: float | None = None


def role(method: str, ours: str) -> str:
    if method == ours:
        return "ours"
    return "ablation" if method.startswith("ours") else "baseline"


def spread(row: Row, metric: str) -> str:
    """'0.984 ± 0.001' over seeds, '0.984' for one seed, '' when the row lacks the metric."""
    values = row.metrics.get(metric)
    if not values or values[0] is None:
        return ""
    if row.sd is not None:
        sd = row.sd.get(metric)
        return f"{values[0]:.3f}" + (f" ± {sd:.3f}" if sd is not None else "")
    mean = float(np.mean(values))
    return f"{mean:.3f} ± {float(np.std(values)):.3f}" if len(values) > 1 else f"{mean:.3f}"


def per_seed(row: Row, metric: str) -> str:
    if row.role == "reference" or len(row.seeds) < 2:
        return ""
    return ", ".join(f"{seed}: {value:.3f}" for seed, value in zip(row.seeds, row.metrics[metric]))


def sensor_conditions(results: dict) -> dict[tuple[str, float], list[Row]]:
    """sensor.json (`<dataset>/flip<f>/seed<s>` -> metrics per method) -> rows per (dataset, flip)."""
    runs: dict[tuple[str, float], list[dict]] = {}
    for run in results.values():
        runs.setdefault((run["dataset"], run["flip"]), []).append(run)
    conditions = {}
    for (dataset, flip), group in sorted(runs.items()):
        group = sorted(group, key=lambda run: run["seed"])
        rows = [Row(name, "reference", (), {"pr_auc": [pr], "ece": [ece]}, {"pr_auc": sd})
                for name, pr, sd, ece in SENSOR_REFERENCES.get((dataset, flip), [])]
        # the headline: what a user gets (params.yaml's defaults) where the condition measured it, else the
        # benchmark's `full` recipe (the same settings for every dataset, not params.yaml's)
        headline = "ours_defaults" if any("ours_defaults" in run for run in group) else "ours_full"
        for method, name in SENSOR_METHODS.items():
            having = [run for run in group if method in run]
            if having:
                rows.append(Row(name, role(method, headline), tuple(run["seed"] for run in having),
                                {m: [run[method][m] for run in having] for m in SENSOR_METRICS}))
        conditions[(dataset, flip)] = rows
    return conditions


def molecule_conditions(report: dict) -> dict[str, tuple[str, list[Row]]]:
    """molecule*.json (`datasets.<name>`: `runs` of method, seed, metrics; `ours`, the method params.yaml's pipeline
    trains, `ours_fused` where absent) -> (task, rows) per dataset."""
    conditions = {}
    for dataset, result in report["datasets"].items():
        task, metrics = result["task"], MOLECULE_METRICS[result["task"]]
        primary = next(iter(metrics))
        rows = [Row(MOLECULE_METHODS.get(method, method), "reference", (), {primary: [value]})
                for method, value in result.get("anchors_test", {}).items()]
        methods = list(dict.fromkeys(run["method"] for run in result["runs"]))
        order = list(MOLECULE_METHODS)
        for method in sorted(methods, key=lambda m: order.index(m) if m in order else len(order)):
            having = sorted((run for run in result["runs"] if run["method"] == method), key=lambda run: run["seed"])
            rows.append(Row(MOLECULE_METHODS.get(method, method), role(method, result.get("ours", "ours_fused")),
                            tuple(run["seed"] for run in having),
                            {m: [run["metrics"][m] for run in having] for m in metrics},
                            seconds=float(np.mean([run["seconds"] for run in having]))))
        conditions[dataset] = (task, rows)
    return conditions


def table(rows: list[Row], metrics: dict[str, str], seconds: bool = False) -> str:
    primary = next(iter(metrics))
    header = ["method", "role", "seeds", *metrics.values(), f"{metrics[primary]} per seed"]
    body = []
    for row in rows:
        name = f"**{row.name}**" if row.role == "ours" else row.name
        seeds = "" if row.role == "reference" else str(len(row.seeds))
        body.append([name, row.role, seeds, *(spread(row, m) for m in metrics), per_seed(row, primary)])
    if seconds:
        header.append("seconds per run")
        for line, row in zip(body, rows):
            line.append("" if row.seconds is None else f"{row.seconds:.0f}")
    return tabulate(body, header, tablefmt="github", disable_numparse=True)


def plot(path: Path, panels: list[tuple[str, list[Row]]], metric: str, label: str) -> None:
    """One horizontal bar chart per panel, stacked: the mean of `metric` per method, sd as error bar, seeds as
    dots, references as open diamonds (a reference beyond the measured range sits at the edge, with its value).
    Drawn in matplotlib's default style, whatever style the process set before, so the PNG bytes are the same."""
    with plt.style.context("default"):
        _draw(path, panels, metric, label)


def _draw(path: Path, panels: list[tuple[str, list[Row]]], metric: str, label: str) -> None:
    colours = {"reference": "#9e9e9e", "baseline": "#5b8bd0", "ours": "#d9622b", "ablation": "#f2b38f"}
    heights = [0.55 + 0.2 * len(rows) for _, rows in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(6.4, sum(heights)), dpi=100, squeeze=False,
                             gridspec_kw={"height_ratios": heights}, layout="constrained")
    for ax, (title, rows) in zip(axes[:, 0], panels):
        rows = [row for row in rows if row.metrics.get(metric)]
        measured = [value for row in rows if row.role != "reference" for value in row.metrics[metric]]
        margin = 0.15 * (max(measured) - min(measured)) + 0.01
        low, high = min(measured) - margin, max(measured) + margin
        ys = np.arange(len(rows))[::-1]
        for y, row in zip(ys, rows):
            values = row.metrics[metric]
            mean = float(np.mean(values))
            if row.role == "reference":
                shown = min(max(mean, low), high)
                sd = (row.sd or {}).get(metric) if shown == mean else None
                ax.errorbar(shown, y, xerr=sd, fmt="D", mfc="white", color=colours["reference"], capsize=2, ms=4)
                if shown != mean:
                    ax.annotate(f"{mean:.3f}", (shown, y), xytext=(-6 if shown == high else 6, 0),
                                textcoords="offset points", va="center", ha="right" if shown == high else "left",
                                fontsize=7)
                continue
            ax.barh(y, mean - low, left=low, color=colours[row.role], height=0.7)
            if len(values) > 1:
                ax.errorbar(mean, y, xerr=float(np.std(values)), color="black", capsize=2, lw=1)
                ax.plot(values, [y] * len(values), "k.", ms=3)
        names = [f"reference: {row.name}" if row.role == "reference" else row.name for row in rows]
        ax.set_yticks(ys, names, fontsize=7)
        ax.set_xlim(low, high)
        ax.set_title(title, fontsize=8)
        ax.set_xlabel(label, fontsize=7)
        ax.tick_params(axis="x", labelsize=7)
    fig.savefig(path, format="png", metadata={"Software": None})
    plt.close(fig)


def flip_name(flip: float) -> str:
    return "clean labels" if flip == 0 else f"{flip:.0%} of training labels flipped"


FAULT_TYPE = "skab_fault_type/"


def fault_type_section(conditions: dict[tuple[str, float], list[Row]]) -> list[str]:
    """One table per flip rate: a row per held-out SKAB fault type, test PR-AUC per method, and their mean."""
    lines = ["### SKAB by fault type", "",
             "Each fault type held out in turn as the test split; validation is a seeded fifth of the other types' "
             "runs ([reference/benchmarks.md](reference/benchmarks.md#sensor-failure-detector) lists the runs of each type).", ""]
    for flip in sorted({flip for _, flip in conditions}):
        groups = sorted(dataset for dataset, f in conditions if f == flip)
        methods = list(dict.fromkeys(row.name for g in groups for row in conditions[(g, flip)]))
        body, per_method = [], {m: [] for m in methods}
        for group in groups:
            found = {row.name: float(np.mean(row.metrics["pr_auc"])) for row in conditions[(group, flip)]}
            for method in methods:
                if method in found:
                    per_method[method].append(found[method])
            body.append([group.removeprefix(FAULT_TYPE), *(f"{found[m]:.3f}" if m in found else "" for m in methods)])
        body.append([f"**mean of {len(groups)} held-out types**", *(f"{np.mean(v):.3f}" if len(v) == len(groups) else "" for v in per_method.values())])
        lines += [f"Held-out fault type, {flip_name(flip)} (test PR-AUC):", "",
                  tabulate(body, ["held-out fault type", *methods], tablefmt="github", disable_numparse=True), ""]
    return lines


RECURRENT = ("recurrent_rnn", "recurrent_gru", "recurrent_lstm")


def _headline_beside(run: dict, kind: str) -> float | None:
    """The run's test PR-AUC of ours (params.yaml's detector, else the former `full` recipe) where it was measured
    at the same commit as `kind`'s record."""
    measured_at = run.get("measured_at", {})
    for key in ("ours_defaults", "ours_full"):
        if key in run and measured_at.get(key) == measured_at.get(kind):
            return run[key]["pr_auc"]
    return None


def recurrent_section(results: dict) -> list[str]:
    """Per (dataset, flip) with recurrent records: our encoder (the headline of the same runs) and each recurrent one,
    test PR-AUC over seeds, encoder parameters and one member's inference time per window (mean over seeds)."""
    runs: dict[tuple[str, float], list[dict]] = {}
    for run in results.values():
        if any(kind in run for kind in RECURRENT):
            runs.setdefault((run["dataset"], run["flip"]), []).append(run)
    if not runs:
        return []
    lines = ["### Recurrent encoders at our encoder's parameter count", "",
             "The benchmark's `full` recipe and classifier (window-statistics branch, head, calibration) around our "
             "encoder or a two-layer recurrent one whose hidden size gives the parameter count nearest ours, not "
             "pretrained. Milliseconds per window: one member, eager PyTorch on the CPU, batches of 1024, the best "
             "of 3 rounds, mean over seeds, timed in the benchmark's run beside each recurrent member (under whatever else "
             "the machine ran then; `bench/encoder_cost.py` times them side by side on a quiet machine).", ""]
    for (dataset, flip), group in sorted(runs.items()):
        group = sorted(group, key=lambda run: run["seed"])
        body = []
        for kind in RECURRENT:
            having = [run for run in group if kind in run]
            if not having:
                continue
            if not body:  # ours, from the first recurrent kind's runs
                ours = [score for score in (_headline_beside(run, kind) for run in having) if score is not None]
                body.append(["ours (CNN + TCN + transformer)",
                             spread(Row("", "", (), {"pr_auc": ours}), "pr_auc") if ours else "remeasured since",
                             f"{having[0][kind]['ours_encoder_parameters']:,}",
                             "", f"{np.mean([run[kind]['ours_ms_per_window'] for run in having]):.4f}", "1.0"])
            records = [run[kind] for run in having]
            ms = float(np.mean([r["ms_per_window"] for r in records]))
            ours_ms = float(np.mean([r["ours_ms_per_window"] for r in records]))
            body.append([SENSOR_METHODS[kind].removesuffix(" (as many parameters)"),
                         spread(Row("", "", (), {"pr_auc": [r["pr_auc"] for r in records]}), "pr_auc"),
                         f"{records[0]['encoder_parameters']:,}", str(records[0]["hidden"]), f"{ms:.4f}",
                         f"{ms / ours_ms:.1f}"])
        lines += [f"{dataset}, {flip_name(flip)}, seeds {', '.join(str(run['seed']) for run in group)}:", "",
                  tabulate(body, ["encoder", "test PR-AUC", "encoder parameters", "hidden", "ms per window",
                                  "time / ours"], tablefmt="github", disable_numparse=True), ""]
    return lines


def sensor_section(results: dict, images: Path) -> list[str]:
    conditions = sensor_conditions(results)
    by_fault_type = {key: rows for key, rows in conditions.items() if key[0].startswith(FAULT_TYPE)}
    conditions = {key: rows for key, rows in conditions.items() if key not in by_fault_type}
    lines = ["## Sensor failure detector", "",
             "`bench/results/sensor.json` (`bench/sensor_benchmark.py`), test split. "
             "HGB: HistGradientBoosting on window summaries; MiniRocket: its features + logistic "
             "regression with C tuned by grouped CV. The bold row is params.yaml's defaults where the condition "
             "measured them, the benchmark's `full` recipe (one setting for every dataset, not params.yaml's) elsewhere. "
             "Reference rows: the figures of "
             f"`{ANCHORS}` (same protocol, 3 seeds; FD001 only). Protocol and settings: "
             "[reference/benchmarks.md](reference/benchmarks.md#sensor-failure-detector). SKAB's seed also draws the split of runs.", ""]
    for dataset in sorted({dataset for dataset, _ in conditions}):
        flips = sorted(flip for d, flip in conditions if d == dataset)
        image = f"sensor_{dataset}.png"
        plot(images / image, [(f"{dataset}, {flip_name(flip)}", conditions[(dataset, flip)]) for flip in flips],
             "pr_auc", "test PR-AUC")
        lines += [f"### {dataset}", "", f"![test PR-AUC on {dataset}](results/{image})", ""]
        for flip in flips:
            lines += [f"{dataset}, {flip_name(flip)}:", "", table(conditions[(dataset, flip)], SENSOR_METRICS), ""]
    return lines + recurrent_section(results) + (fault_type_section(by_fault_type) if by_fault_type else [])


def molecule_section(reports: dict[str, dict], images: Path) -> list[str]:
    lines = ["## Molecular property model", "",
             "`bench/results/molecule*.json` (`bench/molecule_benchmark.py`), test split of the deterministic "
             "scaffold split. Reference rows: `anchors_test` of the JSON, the "
             f"figures of `{ANCHORS}` (chemprop there: RMSE 0.826 ± 0.020 on ESOL, ROC-AUC 0.667 ± 0.037 on "
             "BBBP, 3 seeds). Seconds are wall-clock per run on a loaded 2-core machine. Protocol and settings: "
             "[reference/benchmarks.md](reference/benchmarks.md#molecular-property-model).", ""]
    for source, report in reports.items():
        for dataset, (task, rows) in molecule_conditions(report).items():
            variant = source.removeprefix("molecule").strip("_").removeprefix(dataset).strip("_")  # e.g. hidden128
            name = f"{dataset}, {variant}" if variant else dataset
            metrics = MOLECULE_METRICS[task]
            primary = next(iter(metrics))
            image = f"molecule_{name.replace(', ', '_')}.png"
            plot(images / image, [(name, rows)], primary, f"test {metrics[primary]}")
            lines += [f"### {name}", "", f"`bench/results/{source}.json`", "",
                      f"![test {metrics[primary]} on {name}](results/{image})", "",
                      table(rows, metrics, seconds=True), ""]
    return lines


def devices_section(result: dict) -> list[str]:
    meta = result["meta"]
    body = [[row["family"], row["device"], f"{row['pretrain_s_per_epoch']:.2f}", f"{row['finetune_s_per_epoch']:.2f}",
             f"{row['score']} {row['val_score']:.3f}"] for row in result["rows"]]
    return ["## Training, CPU against CUDA", "",
            f"`bench/results/training_devices.json` (`bench/training_devices.py`): {meta['epochs']} epochs of each "
            f"stage, default data and settings; CPU {meta['cpu']} "
            f"({meta['threads']} torch threads), GPU {meta['gpu']}, torch {meta['torch']}.", "",
            tabulate(body, ["family", "device", "pretrain s/epoch", "finetune s/epoch", "validation score"],
                     tablefmt="github", disable_numparse=True), ""]


def others_section(results: Path, found: dict[str, dict]) -> list[str]:
    """A line per other JSON file, naming the script that wrote it (its `script` or its meta's, else
    bench/<name>.py) and linking the table it writes beside it."""
    lines = ["## Other benchmarks", ""]
    for name, report in sorted(found.items()):
        table_link = f": [{name}.md](../bench/results/{name}.md)" if (results / f"{name}.md").exists() else ""
        script = report.get("script") or report.get("meta", {}).get("script") or f"bench/{name}.py"
        lines.append(f"- `bench/results/{name}.json` (`{script}`){table_link}")
    return [*lines, ""]


def write_report(results: Path, docs: Path) -> Path:
    """Write docs/results.md and docs/results/*.png from the JSON files in `results`; returns the .md path."""
    images = docs / "results"
    images.mkdir(parents=True, exist_ok=True)
    for old in images.glob("*.png"):
        old.unlink()
    found = {path.stem: json.loads(path.read_text()) for path in sorted(results.glob("*.json"))}
    lines = ["# Benchmark results", "",
             "Generated by `bench/report.py` (`make report`) from `bench/results/*.json`; do not edit by hand. "
             "mean ± sd over seeds (numpy std, ddof 0); one value where one seed was run.", ""]
    if "sensor" in found:
        lines += sensor_section(found.pop("sensor"), images)
    molecules = {name: found.pop(name) for name in sorted(found) if name.startswith("molecule")}
    if molecules:
        lines += molecule_section(molecules, images)
    if "training_devices" in found:
        lines += devices_section(found.pop("training_devices"))
    if found:
        lines += others_section(results, found)
    out = docs / "results.md"
    out.write_text("\n".join(lines).rstrip() + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=PROJECT / "bench" / "results")
    parser.add_argument("--docs", type=Path, default=PROJECT / "docs")
    args = parser.parse_args()
    print(write_report(args.results, args.docs))


if __name__ == "__main__":
    main()
