"""Sensor benchmark (not a test): our detector against HistGradientBoosting and MiniRocket, clean and with
flipped training labels, plus ablations, on CMAPSS FD001 (the ../shared/ANCHORS.md protocol) and SKAB.

    .venv/bin/python bench/sensor_benchmark.py --datasets fd001 --flips 0 0.2 --seeds 0
    .venv/bin/python bench/sensor_benchmark.py --datasets fd001 skab --flips 0 0.2 --seeds 0 1 2

Runs in-process with the pipeline's own functions (no Prefect/MLflow). Results are merged into
bench/results/sensor.json after every condition (so a partial run keeps what it finished), keyed
"<dataset>/flip<rate>/seed<seed>"; `--table` prints a markdown table from it.

The headline (`--variants defaults`) is params.yaml's detector as it is, `sensor.model`, `.pretrain`, `.finetune` and
`.calibrate` as a user gets them, pretrained on the training windows as the pipeline does (`ours_defaults`); the same
members give `ours_no_calibration` (the raw ensemble probability) and, with relative channels, `ours_without_level`
(no test unit's level known: what a unit without a reference in the service gets). Novelty (`--variants novelty`):
the departure-from-normal score of the pretrained encoder and its decoder (models/sensor/novelty.py), each unit
against its first `reference_steps` rows, calibrated on validation: alone (`ours_novelty`), combined with the
headline by the rule validation chooses (`ours_combined`, models/sensor/combination.py), by a fixed rule
(`ours_combined_stacker`, `ours_combined_max`), by validation's choice of `supervised` or `max`
(`ours_combined_supervised_or_max`), and with every unit scored against the training fleet's normal
(`ours_combined_fleet`). Ablations, each params.yaml with one change of bench/recipes/sensor_ablations.yaml
(`ours_<name>`): no_relative, no_pretraining, plain_ce, no_statistics, mean_teacher (on the unlabelled windows too
where the condition has them: `fd001_half_labelled` withholds half of the training windows' labels) and
uncertainty_weights. Recurrent encoders (`--variants rnn gru lstm`): an Elman RNN, GRU or LSTM encoder
(models/sensor/recurrent.py) with the parameter count of ours in the same classifier, recipe and calibration, not
pretrained; their records and the headline's carry `encoder_parameters` and `ms_per_window` (one member, eager).
Baselines are uncalibrated, as in the anchors. Each method's record also holds its test PR-AUC per test unit
(`per_unit_pr_auc`: SKAB run or CMAPSS engine, where it has both classes), to see where a model fails. Records
of `ours_full` are the benchmark's former fixed recipe, kept as measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import yaml
from sklearn.metrics import average_precision_score

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from data.sensors.config import SensorDataConfig  # noqa: E402
from data.sensors.prepare import PreparedSensorData, prepare_sensor_data  # noqa: E402
from data.sensors.sources import load_skab  # noqa: E402
from flows.params import load_params, with_overrides  # noqa: E402
from models.calibration import calibrated_probability, choose_threshold, ensemble_probability, select_calibration  # noqa: E402
from models.metrics import classification_metrics  # noqa: E402
from models.sensor.baselines import fit_hist_gradient_boosting, fit_minirocket  # noqa: E402
from models.sensor.config import SensorModelConfig  # noqa: E402
from models.sensor.encoder import SensorEncoder  # noqa: E402
from models.sensor.recurrent import RECURRENT_KINDS, RecurrentEncoder, matched_hidden, parameter_count  # noqa: E402
from models.sensor.network import SensorClassifier  # noqa: E402
from models.sensor.combination import choose_rule, combined_probability, fit_rule  # noqa: E402
from data.sensors.featurize import first_windows  # noqa: E402
from models.sensor.departure import against_own_references, fit_fleet_reference  # noqa: E402
from models.sensor.novelty import NoveltyCalibrator, NoveltyScorer, score_windows  # noqa: E402
from models.sensor.training import MASK_SPAN, finetune_member, predict_logits, pretrain_encoder  # noqa: E402

SHARED = Path(os.environ.get("SHARED_DATA_DIR", ROOT.parent / "shared" / "data"))  # ../shared/data beside the project
RESULTS = ROOT / "bench" / "results" / "sensor.json"
DATASETS = {
    "fd001": dict(source="cmapss", path=SHARED / "cmapss_fd001" / "train_FD001.txt.gz", window=30, stride=1, horizon=30,
                  split="unit", unit_order="sorted", drop_constant=True),
    # SKAB: each run is a unit; a window is positive when its last row is labelled anomalous (horizon 0). SKAB
    # labels intervals during which an induced fault is active (one per run, ~35 % of rows), not failures to
    # forecast: with a look-ahead of 8 the only extra positives are the 8 rows before each induced onset, which
    # the sensors cannot announce. See docs/reference/benchmarks.md.
    # FD001 with half of the training windows' labels withheld (seeded): the semi-supervised condition
    "fd001_half_labelled": dict(source="cmapss", path=SHARED / "cmapss_fd001" / "train_FD001.txt.gz", window=30,
                                stride=1, horizon=30, split="unit", unit_order="sorted", drop_constant=True,
                                train_unlabelled_fraction=0.5),
    "skab": dict(source="skab", path=SHARED / "skab", window=32, stride=4, horizon=0, split="unit",
                 unit_order="shuffled", drop_constant=True, val_fraction=0.2, test_fraction=0.2),
}
# SKAB grouped by fault type (docs/reference/benchmarks.md): `--protocol fault_type` holds each group out in
# turn as the test split; validation is a seeded fifth of the other groups' runs, so nothing chooses by the held-out kind.
SKAB_FAULT_TYPES = {
    "valve1": [f"valve1/{i}" for i in range(16)],           # the valve at the pump's inlet closed
    "valve2": [f"valve2/{i}" for i in range(4)],            # the valve at the pump's outlet closed
    "fluid_leak_or_addition": [f"other/{i}" for i in range(1, 5)],
    "rotor_imbalance": [f"other/{i}" for i in range(5, 10)],
    "water_volume_increase": ["other/10", "other/11"],
    "cavitation": ["other/12", "other/13"],
    "hot_water": ["other/14"],
}
ABLATIONS = ROOT / "bench" / "recipes" / "sensor_ablations.yaml"
MINIROCKET_C_GRID = [1e-4, 1e-3, 1e-2, 1e-1, 1.0]  # the reference's grid (../shared/ANCHORS.md)
TARGET_PRECISION = load_params(ROOT / "params.yaml").sensor.calibrate.target_precision  # the alert threshold's
FIXED_RULES = ("stacker", "max")  # ablations: the combination rule fixed instead of chosen on validation


def ablations() -> dict[str, dict]:
    """bench/recipes/sensor_ablations.yaml: name -> {description, sets: dotted keys under params.yaml's `sensor`}."""
    return yaml.safe_load(ABLATIONS.read_text())


@dataclass
class Condition:
    """One benchmark condition (dataset, flip, seed): its prepared windows, their featurisations (cached per
    featurisation setting) and where to train."""

    name: str
    prepared: PreparedSensorData
    seed: int
    device: torch.device
    cache: dict = field(default_factory=dict)

    def split(self, name: str):
        return self.prepared.windows[name]

    @property
    def labels(self) -> dict[str, np.ndarray]:
        return {split: self.split(split).y for split in ("train", "val")}

    def featurised(self, model: SensorModelConfig) -> dict[str, np.ndarray]:
        """Each split's windows (and the training windows without a label, `unlabelled`) featurised as `model` says;
        with relative channels also `test_without_level`: no test unit's level known."""
        key = (model.relative_channels, model.level_dropout)
        if key not in self.cache:
            featurizer, self.cache[key] = featurise(self.prepared, model)
            if model.relative_channels:
                self.cache[key]["test_without_level"] = featurizer.transform(self.split("test").X)
        return self.cache[key]

    def log(self, what: str, result: dict) -> None:
        print(f"[{self.name}] {what} {result}", flush=True)


def scores_on_test(test, p_test: np.ndarray, threshold: float) -> dict:
    """The test metrics, plus PR-AUC per test unit (run or engine) where it has both classes: where a model fails."""
    per_unit = {str(u): round(float(average_precision_score(test.y[test.unit == u], p_test[test.unit == u])), 4)
                for u in np.unique(test.unit) if 0 < test.y[test.unit == u].mean() < 1}
    return {**classification_metrics(test.y, p_test, threshold), "per_unit_pr_auc": per_unit}


def featurise(prepared, model: SensorModelConfig) -> tuple:
    """The featurizer `model` asks for, fitted on the training windows, and each split's windows featurised as the
    pipeline does (`train`, `val`, `test`, and `unlabelled`: training windows without a label; the level dropout on
    the training ones only)."""
    featurizer = prepared.fit_featurizer(model.relative_channels)
    return featurizer, {split: prepared.features(featurizer, split, model.level_dropout if split in (
        "train", "unlabelled") else 0.0) for split in ("train", "val", "test", "unlabelled")}


def pretrained(sensor, x: dict[str, np.ndarray], seed: int, device) -> tuple | None:
    """The encoder and its reconstruction decoder pretrained as the pipeline does, on the training windows labelled or
    not (x: `train`, `unlabelled`), or None where `sensor` (a params.yaml sensor section) does not pretrain."""
    if not (sensor.pretrain.enabled and sensor.finetune.use_pretrained):
        return None
    cfg = sensor.pretrain.model_copy(update={"seed": seed})
    encoder, decoder, _ = pretrain_encoder(np.concatenate([x["train"], x["unlabelled"]]), sensor.model, cfg, device)
    return encoder, decoder


def trained(sensor, x: dict[str, np.ndarray], y: dict[str, np.ndarray], seed: int, device,
            make_encoder=None) -> tuple[list, tuple | None]:
    """The pipeline's ensemble with `sensor` on featurised windows x (`train`, `val`, `unlabelled`) and labels y
    (`train`, `val`): pretrained where `sensor` pretrains (not with a `make_encoder` of another kind), then
    `ensemble_size` members. Returns the members and the pretrained (encoder, decoder) or None."""
    pretraining = None if make_encoder else pretrained(sensor, x, seed, device)
    state = pretraining[0].state_dict() if pretraining else None
    cfg = sensor.finetune.model_copy(update={"seed": seed, "checkpoint": False})
    members = [finetune_member(x["train"], y["train"], x["val"], y["val"], sensor.model, cfg, state, seed + i, device,
                               make_encoder=make_encoder, unlabelled_x=x["unlabelled"])[0]
               for i in range(cfg.ensemble_size)]
    return members, pretraining


def ours_probabilities(members, val_x, val, test_x, calibrate: bool, device,
                       methods=("temperature", "isotonic")) -> tuple[np.ndarray, np.ndarray, dict]:
    """The ensemble's validation and test probabilities (calibrated on validation by the best of `methods`, or the
    plain mean)."""
    logits_val = np.stack([predict_logits(m, val_x, device) for m in members], 1)
    logits_test = np.stack([predict_logits(m, test_x, device) for m in members], 1)
    if calibrate:
        calibration, cv_nll = select_calibration(logits_val, val.y, val.unit, list(methods))
        p_val, p_test = calibrated_probability(logits_val, calibration), calibrated_probability(logits_test, calibration)
        return p_val, p_test, {"calibration": calibration.method, "cv_nll": cv_nll}
    return ensemble_probability(logits_val), ensemble_probability(logits_test), {}


def evaluate_ours(members, val_x, val, test_x, test, calibrate: bool, device,
                  methods=("temperature", "isotonic")) -> dict:
    p_val, p_test, extra = ours_probabilities(members, val_x, val, test_x, calibrate, device, methods)
    return {**scores_on_test(test, p_test, choose_threshold(val.y, p_val, TARGET_PRECISION)), **extra,
            "val_pr_auc": float(average_precision_score(val.y, p_val))}


def novelty_variants(members, scorer: NoveltyScorer, x: dict, windows: dict, count: int, device) -> dict:
    """Novelty only, and combined with the supervised probability by the rule validation chooses, each unit scored
    against its first `count` windows (its own mean, the spread shrunk to the fleet's within-unit spread); and combined
    with the fleet's normal as every unit's reference (what a unit without its own reference gets)."""
    scored = {split: score_windows(scorer, x[split]) for split in ("train", "val", "test")}
    train = windows["train"]
    healthy = train.y == 0  # training labels, flipped ones included: what a user has
    fleet = fit_fleet_reference(scored["train"][0][healthy], scored["train"][1][healthy], train.unit[healthy],
                                first_windows(train.unit, train.time, count)[healthy])

    def features(split: str, own: bool) -> np.ndarray:
        descriptions, errors = scored[split]
        units = windows[split].unit
        marked = first_windows(units, windows[split].time, count) if own else np.zeros(len(units), bool)
        return against_own_references(descriptions, errors, units, marked, fleet, scorer.encoder.embedding_size)

    val, test = windows["val"], windows["test"]
    p_val, p_test, _ = ours_probabilities(members, x["val"], val, x["test"], True, device)
    out = {}
    for key, own in (("ours_combined", True), ("ours_combined_fleet", False)):
        f_val, f_test = features("val", own), features("test", own)
        calibrator = NoveltyCalibrator().fit(f_val, val.y)
        novel_val, novel_test = calibrator.predict_proba(f_val), calibrator.predict_proba(f_test)
        if own:
            out["ours_novelty"] = {**scores_on_test(test, novel_test, choose_threshold(val.y, novel_val,
                                                                                        TARGET_PRECISION)),
                                   "weights": [float(w) for w in calibrator.coef_],
                                   "val_pr_auc": float(average_precision_score(val.y, novel_val))}
        fitted, cv_nll = choose_rule(p_val, novel_val, val.y, val.unit)
        rules = {key: (fitted, {"cv_nll": cv_nll})}
        if own:  # each rule as fixed, whatever validation prefers; and validation's choice of supervised or max
            rules.update({f"ours_combined_{name}": (fit_rule(name, p_val, novel_val, val.y), {}) for name in FIXED_RULES})
            fitted, cv_nll = choose_rule(p_val, novel_val, val.y, val.unit, ["supervised", "max"])
            rules["ours_combined_supervised_or_max"] = (fitted, {"cv_nll": cv_nll})
        for name, (rule, extra) in rules.items():
            c_val, c_test = combined_probability(p_val, novel_val, rule), combined_probability(p_test, novel_test, rule)
            out[name] = {**scores_on_test(test, c_test, choose_threshold(val.y, c_val, TARGET_PRECISION)), **rule,
                         **extra, "val_pr_auc": float(average_precision_score(val.y, c_val))}
    return out


def skab_fault_type_config(group: str, flip: float, seed: int, folder: Path) -> SensorDataConfig:
    """SKAB with the runs of fault type `group` as test, a seeded fifth of the other runs as validation: a
    `split` column in a Parquet file under `folder` (the pipeline's column split reads it)."""
    frame = load_skab(SHARED / "skab")
    kind = frame["unit"].map({run: name for name, runs in SKAB_FAULT_TYPES.items() for run in runs})
    if kind.isna().any():
        raise SystemExit(f"SKAB runs of no fault type: {sorted(set(frame['unit'][kind.isna()]))}")
    others = sorted(set(frame["unit"][kind != group]))
    val_runs = set(np.random.default_rng(seed).choice(others, size=max(1, round(0.2 * len(others))), replace=False))
    frame["split"] = np.where(kind == group, "test", np.where(frame["unit"].isin(val_runs), "val", "train"))
    path = folder / f"skab_{group}.parquet"
    frame.to_parquet(path, index=False)
    skab = {k: v for k, v in DATASETS["skab"].items() if k not in ("source", "path", "split", "unit_order",
                                                                  "val_fraction", "test_fraction")}
    return SensorDataConfig(source="file", path=path, split="column", **skab, train_label_flip_rate=flip, seed=seed)


def baselines(c: Condition, rocket_features: int, timings: dict) -> dict:
    """HistGradientBoosting on window summaries and (rocket_features > 0) MiniRocket, uncalibrated as in the anchors."""
    train, val, test = (c.split(k) for k in ("train", "val", "test"))
    t = time.time()
    hgb = fit_hist_gradient_boosting(train.X, train.y, c.seed)
    out = {"hist_gradient_boosting": scores_on_test(test, hgb(test.X), choose_threshold(val.y, hgb(val.X),
                                                                                          TARGET_PRECISION))}
    timings["hist_gradient_boosting"] = time.time() - t
    c.log("HGB", out["hist_gradient_boosting"])
    if rocket_features:
        t = time.time()
        rocket, info = fit_minirocket(train.X, train.y, train.unit, n_features=rocket_features,
                                      c_grid=MINIROCKET_C_GRID, folds=3, seed=c.seed)
        out["minirocket"] = {**scores_on_test(test, rocket(test.X), choose_threshold(val.y, rocket(val.X),
                                                                                     TARGET_PRECISION)),
                             "C": info["C"]}
        timings["minirocket"] = time.time() - t
        c.log("MiniRocket", out["minirocket"])
    return out


def headline(c: Condition, sensor, novelty: bool, timings: dict) -> dict:
    """params.yaml's detector as it is (`ours_defaults`), its raw ensemble probability (`ours_no_calibration`), its
    answer with no test unit's level known (`ours_without_level`) and, with `novelty`, the novelty score alone and
    combined with it (`ours_novelty`, `ours_combined*`)."""
    t = time.time()
    x, val, test = c.featurised(sensor.model), c.split("val"), c.split("test")
    members, pretraining = trained(sensor, x, c.labels, c.seed, c.device)

    def evaluate(test_x: np.ndarray, calibrate: bool) -> dict:
        return evaluate_ours(members, x["val"], val, test_x, test, calibrate, c.device, sensor.calibrate.methods)

    out = {"ours_defaults": {**evaluate(x["test"], True), "encoder_parameters": parameter_count(members[0].encoder),
                             "ms_per_window": ms_per_window(members[0], x["test"], c.device)},
           "ours_no_calibration": evaluate(x["test"], False)}
    if "test_without_level" in x:
        out["ours_without_level"] = evaluate(x["test_without_level"], True)
    timings["ours_defaults"] = time.time() - t
    c.log("ours (params.yaml)", out["ours_defaults"])
    if novelty:
        if pretraining is None:
            raise SystemExit("the novelty variants need the pretrained encoder: params.yaml's sensor.pretrain is off")
        t = time.time()
        scorer = NoveltyScorer(*pretraining, x["train"].shape[1] // 2, MASK_SPAN)
        windows = {split: c.split(split) for split in ("train", "val", "test")}
        combined = novelty_variants(members, scorer, x, windows, c.prepared.report["reference_windows"], c.device)
        timings["ours_novelty"] = time.time() - t
        for key, result in combined.items():
            c.log(key, result)
        out.update(combined)
    return out


def ablation(c: Condition, params, name: str, sets: dict, timings: dict) -> dict:
    """params.yaml's detector with ablation `name`'s dotted keys `sets` under `sensor` (`ours_<name>`)."""
    t = time.time()
    sensor = with_overrides(params, {f"sensor.{key}": value for key, value in sets.items()}).sensor
    x = c.featurised(sensor.model)
    members, _ = trained(sensor, x, c.labels, c.seed, c.device)
    result = evaluate_ours(members, x["val"], c.split("val"), x["test"], c.split("test"), True, c.device,
                           sensor.calibrate.methods)
    timings[f"ours_{name}"] = time.time() - t
    c.log(name, result)
    return {f"ours_{name}": result}


def recurrent(c: Condition, sensor, kind: str, timings: dict) -> dict:
    """params.yaml's detector with a recurrent encoder of `kind` (as many parameters as ours, not pretrained) in the
    same classifier, recipe and calibration (`recurrent_<kind>`), and both encoders' inference time."""
    t = time.time()
    x = c.featurised(sensor.model)
    channels = x["train"].shape[1]
    ours_size = parameter_count(SensorEncoder(channels, sensor.model))
    hidden = matched_hidden(kind, channels, ours_size)
    members, _ = trained(sensor, x, c.labels, c.seed, c.device, lambda n: RecurrentEncoder(n, kind, hidden))
    ours = SensorClassifier(channels, sensor.model).fit_statistics(x["train"])  # untrained: the cost is the same
    result = {**evaluate_ours(members, x["val"], c.split("val"), x["test"], c.split("test"), True, c.device,
                              sensor.calibrate.methods),
              "hidden": hidden, "encoder_parameters": parameter_count(members[0].encoder),
              "ours_encoder_parameters": ours_size, "ms_per_window": ms_per_window(members[0], x["test"], c.device),
              "ours_ms_per_window": ms_per_window(ours, x["test"], c.device)}
    timings[f"recurrent_{kind}"] = time.time() - t
    c.log(kind, result)
    return {f"recurrent_{kind}": result}


def run_condition(dataset: str, flip: float, seed: int, variants: list[str], rocket_features: int,
                  cfg: SensorDataConfig | None = None) -> dict:
    """`dataset`'s DATASETS entry, or `cfg` when given (the fault-type protocol): the baselines, params.yaml's
    detector (`defaults`, `novelty`), and the ablations and recurrent encoders among `variants`."""
    cfg = cfg or SensorDataConfig(**DATASETS[dataset], train_label_flip_rate=flip, seed=seed)
    c = Condition(f"{dataset} flip {flip} seed {seed}", prepare_sensor_data(cfg), seed, torch.device("cpu"))
    params, report, timings = load_params(ROOT / "params.yaml"), c.prepared.report, {}
    out = {"dataset": dataset, "flip": flip, "seed": seed, "windows": report["windows"],
           "positives": report["positives"], "channels": c.prepared.channels,
           **baselines(c, rocket_features, timings)}
    if {"defaults", "novelty"} & set(variants):
        out.update(headline(c, params.sensor, "novelty" in variants, timings))
    recipes = ablations()
    for name in [v for v in variants if v in recipes]:
        out.update(ablation(c, params, name, recipes[name]["sets"], timings))
    for kind in [v for v in variants if v in RECURRENT_KINDS]:
        out.update(recurrent(c, params.sensor, kind, timings))
    out["seconds"] = {k: round(v, 1) for k, v in timings.items()}
    return out


def ms_per_window(member, features: np.ndarray, device, rounds: int = 3) -> float:
    """One member's inference time per window (ms), eager PyTorch in batches of 1024, the best of `rounds`."""
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        predict_logits(member, features, device)
        best = min(best, time.perf_counter() - t)
    return round(1000 * best / len(features), 4)


def commit() -> str:
    """The code measured: HEAD's short id, `+dirty` when tracked files other than bench/results/ have changes (a
    benchmark beside this one writes its results there)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/results")
    return git("rev-parse", "--short", "HEAD") + ("+dirty" if changed else "")


def merge(key: str, result: dict) -> None:
    """The condition's record updated with the methods run now (the others stay as measured before); `measured_at`
    gives the commit each method was last measured at (absent: before records carried it)."""
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    record = results.get(key, {})
    measured_at = {**record.get("measured_at", {}), **{k: commit() for k, v in result.items()
                                                        if isinstance(v, dict) and "pr_auc" in v}}
    seconds = {**record.get("seconds", {}), **result.get("seconds", {})}
    results[key] = {**record, **result, "seconds": seconds, "measured_at": measured_at}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")


COLUMNS = [("hist_gradient_boosting", "HGB"), ("minirocket", "MiniRocket"), ("ours_defaults", "ours (params.yaml)"),
           ("ours_full", "ours, former benchmark recipe"), ("ours_without_level", "ours, no test unit's level"),
           ("ours_no_relative", "ours, no relative channels"),
           ("ours_no_pretraining", "ours, no pretraining"), ("ours_plain_ce", "ours, plain CE"),
           ("ours_no_calibration", "ours, no calibration"), ("ours_no_statistics", "ours, no statistics"),
           ("ours_mean_teacher", "ours, mean teacher"), ("ours_uncertainty_weights", "ours, uncertainty weights"),
           ("recurrent_rnn", "RNN encoder"), ("recurrent_gru", "GRU encoder"), ("recurrent_lstm", "LSTM encoder"),
           ("ours_novelty", "novelty only"), ("ours_combined", "ours + novelty"),
           ("ours_combined_fleet", "ours + novelty, fleet reference"), ("ours_combined_stacker", "ours + novelty, stacker"),
           ("ours_combined_max", "ours + novelty, max"),
           ("ours_combined_supervised_or_max", "ours + novelty, supervised or max by validation")]


def table() -> str:
    results = json.loads(RESULTS.read_text())
    groups: dict[tuple, list[dict]] = {}
    for r in results.values():
        groups.setdefault((r["dataset"], r["flip"]), []).append(r)
    lines = ["| dataset | train labels flipped | seeds | " + " | ".join(name for _, name in COLUMNS) + " |",
             "|---|---|---|" + "---|" * len(COLUMNS)]
    for (dataset, flip), runs in sorted(groups.items()):
        cells = []
        for key, _ in COLUMNS:
            got = [r[key] for r in runs if key in r]
            if not got:
                cells.append("n/a")
                continue
            pr, ece = np.array([g["pr_auc"] for g in got]), np.array([g["ece"] for g in got])
            sd = f" +- {pr.std():.3f}" if len(got) > 1 else ""
            cells.append(f"PR-AUC {pr.mean():.3f}{sd}, ECE {ece.mean():.3f}")
        lines.append(f"| {dataset} | {int(flip * 100)} % | {len(runs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["fd001"], choices=sorted(DATASETS))
    parser.add_argument("--flips", nargs="+", type=float, default=[0.0, 0.2])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--variants", nargs="+", default=["defaults", "no_pretraining", "plain_ce", "no_statistics"],
                        choices=["defaults", "novelty", *ablations(), *RECURRENT_KINDS],
                        help="defaults: params.yaml's detector as it is (the headline); novelty: the departure-from-"
                             "normal score, alone and combined with it; each ablation of "
                             "bench/recipes/sensor_ablations.yaml; rnn | gru | lstm: a recurrent encoder of as many "
                             "parameters in its place, not pretrained")
    parser.add_argument("--protocol", choices=["standard", "fault_type"], default="standard",
                        help="fault_type: SKAB, each fault type of --groups held out in turn as test (--datasets unused)")
    parser.add_argument("--groups", nargs="+", default=list(SKAB_FAULT_TYPES), choices=list(SKAB_FAULT_TYPES))
    parser.add_argument("--rocket-features", type=int, default=9996,
                        help="0: no MiniRocket now (a condition keeps the record it has)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--table", action="store_true", help="only print the markdown table of the stored results")
    args = parser.parse_args()
    if args.table:
        print(table())
        return
    torch.set_num_threads(args.threads)
    if args.protocol == "fault_type":
        with tempfile.TemporaryDirectory(prefix="skab-fault-type-") as folder:
            for group in args.groups:
                for flip in args.flips:
                    for seed in args.seeds:
                        cfg = skab_fault_type_config(group, flip, seed, Path(folder))
                        merge(f"skab_fault_type/{group}/flip{flip}/seed{seed}",
                              run_condition(f"skab_fault_type/{group}", flip, seed, args.variants,
                                            args.rocket_features, cfg))
        print(table())
        return
    for dataset in args.datasets:
        for flip in args.flips:
            for seed in args.seeds:
                merge(f"{dataset}/flip{flip}/seed{seed}", run_condition(dataset, flip, seed, args.variants,
                                                                       args.rocket_features))
    print(table())


if __name__ == "__main__":
    main()
