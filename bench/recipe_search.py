"""Choose a family's default recipe by validation across its developer datasets (not a test).

Each recipe of a family (bench/recipes/<family>.yaml) is a complete setting of the keys explored (molecules: capacity,
depth, dropout, epochs and early stopping, schedule, loss, learning rate, ensemble size, descriptors; sensors: loss,
mixup, epochs, learning rate and schedule, capacity, relative channels), laid over params.yaml's section of that
family. Every recipe trains the pipeline's ensemble as
a user gets it (pretraining where params.yaml pretrains, then `ensemble_size` members) on every developer dataset
and is scored on validation: the score is the mean over datasets of the relative validation error reduction
against the family's `baseline` recipe (error: RMSE; 1 - ROC-AUC; 1 - PR-AUC), so each dataset weighs the same
(SKAB's three shuffled splits are one dataset: their reductions are averaged first). params.yaml should hold the
cheapest recipe within one standard error of the highest score (`choose`; seconds within COST_TOLERANCE count as
the same cost, the higher score breaking the tie). Test metrics are recorded beside, never
used to choose. Jobs run in parallel processes (one torch thread each); a run already in the results file is kept,
so a stopped search resumes.

    .venv/bin/python bench/recipe_search.py molecule                   # every recipe, seed 0, 2 processes
    .venv/bin/python bench/recipe_search.py sensor --recipes baseline robust --jobs 1

Writes bench/results/recipe_<family>.json and its table bench/results/recipe_<family>.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import yaml
from tabulate import tabulate

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))
sys.path.insert(0, str(PROJECT / "bench"))

from flows.params import load_params, with_overrides  # noqa: E402


def run_molecule(params, dataset: str, seed: int) -> dict:
    """The ensemble's validation and test metrics on a scaffold split (bench/molecule_benchmark.py)."""
    import torch

    from molecule_benchmark import default_ensemble, metrics
    from models.molecule.training import predict_raw

    ensemble = default_ensemble(params, dataset, seed)
    scores = {}
    for split in ("val", "test"):
        raws = np.stack([predict_raw(net, ensemble.data[split], torch.device("cpu")) for net in ensemble.members])
        prediction = (ensemble.mean + ensemble.std * raws.mean(axis=0) if ensemble.task == "regression"
                      else (1 / (1 + np.exp(-raws))).mean(axis=0))
        scores[split] = metrics(ensemble.task, ensemble.y[split], prediction)
    return scores


SENSOR_DATASETS = {  # name: (sensor_benchmark.DATASETS entry, training label flip rate, SKAB split seed)
    "fd001": ("fd001", 0.0, None), "fd001_flip0.2": ("fd001", 0.2, None),
    **{f"skab_split{i}": ("skab", 0.0, i) for i in range(3)},
}


def run_sensor(params, dataset: str, seed: int) -> dict:
    """Validation PR-AUC of the ensemble's mean probability (calibration is fitted on validation, so it is scored
    before); test metrics of the calibrated probability, as the pipeline serves it (bench/sensor_benchmark.py). With
    relative channels also both without any unit's level (`val_without_level`, `test_without_level`: what the service
    answers for units without a reference), shown, not scored."""
    import torch

    import sensor_benchmark as bench
    from data.sensors.config import SensorDataConfig
    from data.sensors.prepare import prepare_sensor_data
    from models.calibration import choose_threshold
    from models.metrics import classification_metrics

    name, flip, split_seed = SENSOR_DATASETS[dataset]
    sensor, cpu = params.sensor, torch.device("cpu")
    cfg = SensorDataConfig(**bench.DATASETS[name], reference_steps=sensor.data.reference_steps,
                           train_label_flip_rate=flip, seed=seed if split_seed is None else split_seed)
    prepared = prepare_sensor_data(cfg)
    train, val, test = (prepared.windows[k] for k in ("train", "val", "test"))
    featurizer, x = bench.featurise(prepared, sensor.model)
    members, _ = bench.trained(sensor, x, {"train": train.y, "val": val.y}, seed, cpu)
    raw_val, _, _ = bench.ours_probabilities(members, x["val"], val, x["test"], False, cpu)
    p_val, p_test, _ = bench.ours_probabilities(members, x["val"], val, x["test"], True, cpu, sensor.calibrate.methods)
    val_metrics = classification_metrics(val.y, raw_val)
    test_metrics = classification_metrics(test.y, p_test, choose_threshold(val.y, p_val, bench.TARGET_PRECISION))
    keep = ("pr_auc", "roc_auc", "ece")
    out = {"val": {k: val_metrics[k] for k in keep}, "test": {k: test_metrics[k] for k in keep}}
    if featurizer.relative:
        val_x, test_x = featurizer.transform(val.X), featurizer.transform(test.X)
        raw_val, _, _ = bench.ours_probabilities(members, val_x, val, test_x, False, cpu)
        # calibration and threshold as served: fitted on validation with the units' levels
        p_val, p_test, _ = bench.ours_probabilities(members, x["val"], val, test_x, True, cpu, sensor.calibrate.methods)
        val_metrics = classification_metrics(val.y, raw_val)
        test_metrics = classification_metrics(test.y, p_test, choose_threshold(val.y, p_val, bench.TARGET_PRECISION))
        out.update(val_without_level={k: val_metrics[k] for k in keep},
                   test_without_level={k: test_metrics[k] for k in keep})
    return out


@dataclass(frozen=True)
class Family:
    """A family's search: its datasets (name -> (group, primary metric)), its recipes (name -> description and
    overrides, dotted keys of the params.yaml family section; from bench/recipes/<family>.yaml) and how one
    (recipe, dataset, seed) is run."""

    datasets: dict[str, tuple[str, str]]
    recipes: dict[str, dict]
    run: Callable[..., dict]


RECIPES = PROJECT / "bench" / "recipes"


def load_recipes(family: str) -> dict[str, dict]:
    """bench/recipes/<family>.yaml as name -> {"description", "overrides"}: `baseline`, and each recipe's `sets` laid
    over the baseline's."""
    spec = yaml.safe_load((RECIPES / f"{family}.yaml").read_text())
    baseline = spec["baseline"]
    out = {"baseline": {"description": baseline["description"], "overrides": baseline["sets"]}}
    out.update({name: {"description": recipe["description"], "overrides": {**baseline["sets"], **recipe["sets"]}}
                for name, recipe in spec["recipes"].items()})
    return out


MOLECULE = Family(datasets={"esol": ("esol", "rmse"), "bbbp": ("bbbp", "roc_auc")}, recipes=load_recipes("molecule"),
                  run=run_molecule)
SENSOR = Family(datasets={"fd001": ("fd001", "pr_auc"), "fd001_flip0.2": ("fd001_flip0.2", "pr_auc"),
                          **{f"skab_split{i}": ("skab", "pr_auc") for i in range(3)}},
                recipes=load_recipes("sensor"), run=run_sensor)
FAMILIES = {"molecule": MOLECULE, "sensor": SENSOR}


def error(metric: str, metrics: dict) -> float:
    return metrics[metric] if metric == "rmse" else 1.0 - metrics[metric]


def run(family: str, params_path: str, dataset: str, name: str, seed: int) -> dict:
    """Train recipe `name` of `family` on `dataset` with `seed`: its validation and test metrics and seconds."""
    import torch

    torch.set_num_threads(1)
    spec = FAMILIES[family]
    params = with_overrides(load_params(params_path),
                            {f"{family}.{key}": value for key, value in spec.recipes[name]["overrides"].items()})
    started = time.time()
    scores = spec.run(params, dataset, seed)
    return {"dataset": dataset, "recipe": name, "seed": seed, **scores, "seconds": round(time.time() - started, 1)}


def summarise(family: Family, runs: list[dict]) -> dict:
    """Per recipe: each dataset's mean validation/test error over seeds and seconds, and the score (None until the
    recipe and `baseline` both ran every dataset). A dataset's reduction is paired by seed: the recipe's mean error
    against the baseline's over the seeds both ran, so a recipe run with fewer seeds meets the same baseline runs."""
    summary, val_errors = {}, {}
    for run_ in runs:
        row = summary.setdefault(run_["recipe"], {"datasets": {}})
        row["datasets"].setdefault(run_["dataset"], []).append(run_)
        metric = family.datasets[run_["dataset"]][1]
        val_errors[run_["recipe"], run_["dataset"], run_["seed"]] = error(metric, run_["val"])
    for row in summary.values():
        for dataset, done in row["datasets"].items():
            metric = family.datasets[dataset][1]
            row["datasets"][dataset] = {
                "metric": metric, "seeds": sorted(r["seed"] for r in done),
                "val_error": float(np.mean([error(metric, r["val"]) for r in done])),
                "test_error": float(np.mean([error(metric, r["test"]) for r in done])),
                "seconds": float(np.mean([r["seconds"] for r in done]))}
    base = summary.get("baseline", {}).get("datasets", {})
    for name, row in summary.items():
        if set(row["datasets"]) != set(family.datasets) or set(base) != set(family.datasets):
            row["score"] = None
            continue
        groups: dict[str, list[float]] = {}
        for dataset, (group, _) in family.datasets.items():
            seeds = sorted(set(row["datasets"][dataset]["seeds"]) & set(base[dataset]["seeds"]))
            if not seeds:
                groups = {}
                break
            mean = {r: np.mean([val_errors[r, dataset, seed] for seed in seeds]) for r in (name, "baseline")}
            groups.setdefault(group, []).append(1.0 - mean[name] / mean["baseline"])
        row["score"] = float(np.mean([np.mean(gains) for gains in groups.values()])) if groups else None
    return summary


def _seeds(row: dict) -> set[int]:
    """The seeds a recipe ran on every dataset."""
    return set.intersection(*(set(d["seeds"]) for d in row["datasets"].values()))


def seed_scores(family: Family, runs: list[dict]) -> dict[str, dict[int, float]]:
    """recipe -> seed -> its score on that seed alone (against the baseline's run of the same seed)."""
    out: dict[str, dict[int, float]] = {}
    for seed in sorted({r["seed"] for r in runs}):
        for name, row in summarise(family, [r for r in runs if r["seed"] == seed]).items():
            if row["score"] is not None:
                out.setdefault(name, {})[seed] = row["score"]
    return out


def incumbent(family_name: str, params) -> str | None:
    """The recipe `params` holds: laying it over them changes nothing (tests check params.yaml holds the choice)."""
    held = [name for name, recipe in FAMILIES[family_name].recipes.items()
            if with_overrides(params, {f"{family_name}.{k}": v for k, v in recipe["overrides"].items()}) == params]
    return held[0] if held else None


def seconds(row: dict) -> float:
    """A recipe's mean seconds per run over the datasets."""
    return float(np.mean([d["seconds"] for d in row["datasets"].values()]))


COST_TOLERANCE = 0.25
"""Mean seconds per run within this share of the cheapest count as the same cost: they are measured under whatever else
shared the machine (the same network's seconds vary with its load), so a few per cent decide nothing.
Among recipes of the same cost the higher score is chosen."""

CPU_BUDGET_SECONDS = 600.0
"""A CPU default's mean seconds per run (one thread) must stay under this: `make run` trains the same ensemble on
data of the developer datasets' size and has 10 minutes on 2 cores for everything (issue 17). A recipe over it is
reported as the leader at any cost, a candidate for a GPU default, not chosen for the CPU."""


def _most_seeded(rows: dict) -> list[str]:
    """The recipes of `rows` scored on the most seeds."""
    most = max((len(_seeds(row)) for row in rows.values()), default=0)
    return [name for name, row in rows.items() if len(_seeds(row)) == most]


def _leader(pool: list[str], scored: dict) -> str | None:
    return max(pool, key=lambda n: scored[n]["score"], default=None)


def choose(summary: dict, per_seed: dict[str, dict[int, float]], budget: float | None = CPU_BUDGET_SECONDS) -> dict:
    """The rule's choice, by the one-standard-error rule (Breiman et al. 1984) with cost as the simplicity: among the
    recipes scored on the most seeds (a seed moves every recipe's score alike, so a score over fewer seeds is not
    compared with them) and within the `budget` of mean seconds per run, the leader has the highest score; a recipe is
    within one standard error of it when its deficit, the leader's score minus its own paired by seed, is no larger
    than that deficit's standard error; the cheapest of those (mean seconds per run; within COST_TOLERANCE of the
    cheapest counts as cheap as it, and the highest score among those wins) is chosen. Returns the choice,
    the leader, those within, each one's deficit (mean, standard error) and the leader of every cost
    (`leader_any_cost`)."""
    scored = {name: row for name, row in summary.items() if row["score"] is not None}
    any_cost = _leader(_most_seeded(scored), scored)
    pool = _most_seeded({name: row for name, row in scored.items() if budget is None or seconds(row) <= budget})
    if not pool:
        return {"chosen": None, "leader": None, "within_one_se": [], "behind_leader": {}, "leader_any_cost": any_cost}
    leader = _leader(pool, scored)
    behind = {}
    for name in pool:
        if name != leader:
            seeds = sorted(set(per_seed[leader]) & set(per_seed[name]))
            deficit = np.array([per_seed[leader][seed] - per_seed[name][seed] for seed in seeds])
            error_ = float(deficit.std(ddof=1) / np.sqrt(len(deficit))) if len(deficit) > 1 else float("inf")
            behind[name] = {"mean": float(deficit.mean()), "standard_error": error_}
    within = [leader] + [n for n, b in behind.items() if b["mean"] <= b["standard_error"]]
    cheapest = min(seconds(scored[n]) for n in within)
    as_cheap = [n for n in within if seconds(scored[n]) <= cheapest * (1 + COST_TOLERANCE)]
    return {"chosen": max(as_cheap, key=lambda n: scored[n]["score"]), "leader": leader,
            "within_one_se": sorted(within),
            "behind_leader": behind, "leader_any_cost": any_cost}


def markdown(family_name: str, report: dict) -> str:
    family = FAMILIES[family_name]
    headers = ["recipe", "what it sets"]
    for dataset, (_, metric) in family.datasets.items():
        headers += [f"{dataset} val {metric}", f"{dataset} test {metric}"]
    headers += ["seeds", "seconds per run", "score per seed", "score (val)", "behind the leader"]
    body = []
    ranked = sorted(report["summary"].items(), key=lambda kv: -(kv[1]["score"] if kv[1]["score"] is not None else -9))
    for name, row in ranked:
        marks = [m for m, who in (("the rule's choice", "chosen"), ("leader", "leader")) if report.get(who) == name]
        cells = [f"**{name}** ({', '.join(marks)})" if marks else name,
                 report["recipes"][name]["description"]]
        for dataset, (_, metric) in family.datasets.items():
            d = row["datasets"].get(dataset)
            value = (lambda e: e) if metric == "rmse" else (lambda e: 1.0 - e)
            cells += [f"{value(d['val_error']):.3f}", f"{value(d['test_error']):.3f}"] if d else ["", ""]
        cells.append(" ".join(str(seed) for seed in sorted({s for d in row["datasets"].values() for s in d["seeds"]})))
        cells.append(f"{seconds(row):.0f}")
        cells.append(" ".join(f"{v:+.3f}" for _, v in sorted(report["seed_scores"].get(name, {}).items())))
        cells.append(f"{row['score']:+.3f}" if row["score"] is not None else "")
        deficit = report.get("behind_leader", {}).get(name)
        cells.append(f"{deficit['mean']:.3f} ± {deficit['standard_error']:.3f}" if deficit else "")
        body.append(cells)
    verdict = [f"The leader is `{report['leader']}`; within one standard error of it: "
               f"{', '.join(f'`{n}`' for n in report['within_one_se'])}; the cheapest of them (the best scored of "
               f"those within {COST_TOLERANCE:.0%} of the cheapest's seconds), `{report['chosen']}`, is the rule's "
               "choice.", ""] if report.get("leader") else []
    if report.get("leader_any_cost") not in (None, report.get("leader")):
        name = report["leader_any_cost"]
        verdict += [f"`{name}` scores highest at any cost, but takes {seconds(report['summary'][name]):.0f} s per run, "
                    f"over the CPU budget of {CPU_BUDGET_SECONDS:.0f} s: a candidate for a GPU default, not "
                    "the CPU default.", ""]
    seeds = sorted({r["seed"] for r in report["runs"]})
    return "\n".join([
        f"# {family_name.capitalize()} recipe search", "",
        f"`bench/recipe_search.py {family_name}`, seeds {seeds}: each recipe's ensemble as the pipeline trains it, "
        "on every developer dataset. score: the mean over datasets of the relative validation error reduction against "
        "`baseline` over the same seeds (error: RMSE, 1 - ROC-AUC, 1 - PR-AUC; SKAB's splits averaged first). "
        "The leader is the highest score among the recipes run on the most seeds (a seed moves every score alike); "
        "the rule's choice is the cheapest recipe within one standard error of it (its deficit to the leader, paired "
        f"by seed, no larger than that deficit's standard error; seconds within {COST_TOLERANCE:.0%} of the cheapest "
        "count as the same cost, and the higher score wins among them); only recipes of at most "
        f"{CPU_BUDGET_SECONDS:.0f} s per run compete for the CPU default (`make run`'s budget). "
        "Test columns are shown, never used to choose. Seconds: one torch thread, two runs side by side.", "",
        *verdict, tabulate(body, headers, tablefmt="github", disable_numparse=True), ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("family", choices=list(FAMILIES))
    parser.add_argument("--datasets", nargs="+", default=None, help="default: all of the family's")
    parser.add_argument("--recipes", nargs="+", default=None, help="default: all of the family's")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--jobs", type=int, default=2, help="parallel processes (one torch thread each)")
    parser.add_argument("--params", default=str(PROJECT / "params.yaml"))
    parser.add_argument("--out", type=Path, default=None, help="default: bench/results/recipe_<family>.json")
    args = parser.parse_args()
    family = FAMILIES[args.family]
    for given, known, what in ((args.datasets, family.datasets, "dataset"), (args.recipes, family.recipes, "recipe")):
        unknown = sorted(set(given or []) - set(known))
        if unknown:
            parser.error(f"unknown {what}(s) of {args.family}: {unknown}; known: {sorted(known)}")
    out = args.out or PROJECT / "bench" / "results" / f"recipe_{args.family}.json"

    report = json.loads(out.read_text()) if out.is_file() else {"script": f"bench/recipe_search.py {args.family}",
                                                                 "runs": []}
    done = {(r["dataset"], r["recipe"], r["seed"]) for r in report["runs"]}
    # recipe by recipe, so each is scored as soon as its datasets ran
    jobs = [(d, n, s) for s in args.seeds for n in args.recipes or family.recipes for d in args.datasets or family.datasets
            if (d, n, s) not in done]

    def save() -> None:
        recorded = {**report.get("recipes", {}), **family.recipes}  # a recipe since dropped keeps its record
        report["recipes"] = {n: recorded[n] for n in sorted({r["recipe"] for r in report["runs"]})}
        report["summary"] = summarise(family, report["runs"])
        report["seed_scores"] = seed_scores(family, report["runs"])
        report.update(choose(report["summary"], report["seed_scores"]))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1) + "\n")
        out.with_suffix(".md").write_text(markdown(args.family, report))

    print(f"{len(jobs)} runs to do ({len(done)} already in {out.name})", flush=True)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run, args.family, args.params, *job) for job in jobs]
        for future in as_completed(futures):
            result = future.result()
            report["runs"].append(result)
            save()
            print(f"{result['dataset']} {result['recipe']} seed {result['seed']}: val {result['val']} "
                  f"test {result['test']} ({result['seconds']:.0f} s)", flush=True)
    if report["runs"]:
        save()
        print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
