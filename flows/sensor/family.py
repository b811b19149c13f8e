"""The sensor failure detector's parts for the generic stages (flows/family.py): windows of multivariate time series,
the pretrained encoder, the CNN/TCN/transformer ensemble, HistGradientBoosting and MiniRocket baselines, the ONNX
graph (flows/sensor/onnx_export.py). Its own stage: novelty (flows/sensor/novelty.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flows.family import Exported, FinetuneData, PipelineFamily, Prepared
from flows.sensor.windows import load_windows
from flows.tasks import compute_task, io_task
from flows.tracking import flatten

HIST_GRADIENT_BOOSTING = "hist_gradient_boosting"
MINIROCKET = "minirocket"


@dataclass
class Windows:
    """Featurised windows (n, F, T) (F = WindowFeaturizer.width), labels (n,), the fitted featurizer and the
    featurised training windows without a label (m, F, T) for the mean teacher."""

    train_x: np.ndarray
    train_y: np.ndarray
    val_x: np.ndarray
    val_y: np.ndarray
    featurizer: object
    unlabelled_x: np.ndarray


@io_task(name="load-validate-window")
def build_windows(cfg):
    from data.sensors.prepare import prepare_sensor_data

    return prepare_sensor_data(cfg)


@compute_task(name="self-supervised-pretraining")
def pretrain_encoder(features: np.ndarray, model_cfg, cfg):
    from models.device import pick_device
    from models.sensor.training import pretrain_encoder

    return pretrain_encoder(features, model_cfg, cfg, pick_device())


@compute_task(name="fit-hist-gradient-boosting")
def fit_hist_gradient_boosting(X: np.ndarray, y: np.ndarray, seed: int):
    from models.sensor.baselines import fit_hist_gradient_boosting

    return fit_hist_gradient_boosting(X, y, seed)


@compute_task(name="fit-minirocket")
def fit_minirocket(X: np.ndarray, y: np.ndarray, units: np.ndarray, cfg, seed: int):
    from models.sensor.baselines import fit_minirocket

    return fit_minirocket(X, y, units, n_features=cfg.minirocket_features, c_grid=cfg.c_grid, folds=cfg.cv_folds,
                          seed=seed)


def evaluate_baseline(name: str, scorer, val, test, target_precision: float, extra: dict | None = None) -> dict:
    """Threshold for `target_precision` on validation, metrics and probabilities on test."""
    from models.calibration import choose_threshold
    from models.metrics import classification_metrics

    p_val, p_test = scorer(val.X), scorer(test.X)
    threshold = choose_threshold(val.y, p_val, target_precision)
    return {"name": name, "threshold": threshold, "test": classification_metrics(test.y, p_test, threshold),
            "test_probability": np.round(p_test, 6).tolist(), **(extra or {})}


class SensorFamily(PipelineFamily):
    name = "sensor"
    summary_metrics = ("pr_auc", "roc_auc", "recall_at_p90", "f2", "brier", "ece")
    sources_without_files = ("simulator",)

    def prepare(self, data) -> Prepared:
        prepared = build_windows(data)
        metrics = {k.replace("/", "_"): float(v) for k, v in flatten("", prepared.report).items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        sizes = {name: (len(w), int(w.y.sum())) for name, w in prepared.windows.items()}
        return Prepared(prepared, prepared.report, metrics,
                        f"sensor windows (total, positive): {sizes}; channels: {prepared.channels}")

    def save_prepared(self, prepared: Prepared, folder: Path) -> None:
        from data.sensors.prepare import save_prepared

        save_prepared(prepared.data, folder)

    def load_prepared(self):
        return load_windows()

    def no_pretraining(self) -> dict:
        return {"encoder": None, "decoder": None}

    def pretrain(self, cfg) -> tuple[dict, list[dict], str]:
        """Masked reconstruction + SimCLR contrastive on the train split's windows, with those without a label."""
        prepared = load_windows()
        featurizer = prepared.fit_featurizer(cfg.model.relative_channels)
        unlabelled = np.concatenate([prepared.features(featurizer, split, cfg.model.level_dropout)
                                     for split in ("train", "unlabelled")])
        encoder, decoder, result = pretrain_encoder(unlabelled, cfg.model, cfg.pretrain)
        state = {"encoder": encoder.state_dict(), "decoder": decoder.state_dict(), "model": cfg.model.model_dump(),
                 "history": result.history}
        return state, result.history, f"encoder pretrained on {len(unlabelled)} windows"

    def finetune_data(self, cfg, in_flow: bool = True) -> FinetuneData:
        from flows.sensor.artifacts import load_encoder

        prepared = load_windows() if in_flow else load_windows.fn()
        featurizer = prepared.fit_featurizer(cfg.model.relative_channels)
        dropout = cfg.model.level_dropout
        windows = Windows(prepared.features(featurizer, "train", dropout), prepared.windows["train"].y,
                          prepared.features(featurizer, "val"), prepared.windows["val"].y, featurizer,
                          prepared.features(featurizer, "unlabelled", dropout))
        teacher = len(windows.unlabelled_x) if cfg.finetune.mean_teacher.enabled else 0
        return FinetuneData(windows, load_encoder(self.paths.pretrained) if cfg.finetune.use_pretrained else None,
                            "PR-AUC", {"unlabelled_windows": str(teacher)})

    def train_member(self, cfg, inputs: FinetuneData, seed: int, checkpoint: Path | None = None, distributed=None,
                     on_epoch=None):
        from models.device import pick_device
        from models.sensor.training import finetune_member

        data = inputs.data
        encoder = inputs.pretrained if cfg.finetune.use_pretrained else None
        return finetune_member(data.train_x, data.train_y, data.val_x, data.val_y, cfg.model, cfg.finetune, encoder,
                               seed, pick_device(), checkpoint=checkpoint, distributed=distributed,
                               unlabelled_x=data.unlabelled_x, on_epoch=on_epoch)

    def save_ensemble(self, cfg, inputs: FinetuneData, members: list, histories: list[list[dict]]) -> None:
        from flows.sensor.artifacts import save_ensemble

        save_ensemble(self.paths.finetuned, members, cfg.model, inputs.data.featurizer, histories)

    def tune_metric(self, inputs: FinetuneData) -> tuple[str, float]:
        return "val_pr_auc", 1.0

    def calibrate(self, cfg) -> tuple[dict, list[Path], str]:
        from flows.sensor.calibrate import calibrate

        return calibrate(cfg, self.paths)

    def baselines(self, cfg) -> dict:
        """HistGradientBoosting on per-window summaries (the gate's) and MiniRocket + logistic regression with C
        chosen by grouped CV over units; thresholds on validation."""
        prepared = load_windows()
        train, val, test = (prepared.windows[name] for name in ("train", "val", "test"))
        seed, target = cfg.data.seed, cfg.calibrate.target_precision
        results = [evaluate_baseline(HIST_GRADIENT_BOOSTING, fit_hist_gradient_boosting(train.X, train.y, seed), val,
                                     test, target)]
        if cfg.baseline.minirocket:
            scorer, info = fit_minirocket(train.X, train.y, train.unit, cfg.baseline, seed)
            results.append(evaluate_baseline(MINIROCKET, scorer, val, test, target,
                                             {"C": info["C"], "cv_pr_auc": info["cv_pr_auc"]}))
        return {**results[0], "baselines": results}

    def export(self, cfg) -> Exported:
        from flows.sensor.onnx_export import export_model

        return export_model(cfg, self.paths, load_windows())

    def predictor(self, onnx_path: Path, card: dict, threads: int | None = None):
        from models.predictors import SensorPredictor

        return SensorPredictor(onnx_path, card, prefer_cuda=False, threads=threads)

    def serving_items(self, prepared, card: dict) -> np.ndarray:
        return prepared.windows["test"].X

    def signature(self, card: dict):
        """Dynamic batch and time; the featurizer's feature channels (values, relative values with relative channels,
        then observed-masks); with the novelty score, each window's unit reference (its D description dimensions)
        in, the novelty outputs out."""
        from mlflow.models import ModelSignature
        from mlflow.types import Schema, TensorSpec

        from data.sensors.featurize import WindowFeaturizer

        float32 = np.dtype(np.float32)
        channels = WindowFeaturizer.from_dict(card["featurizer"]).width
        description = len(card["novelty"]["fleet_reference"]["mean"]) if "novelty" in card else None
        shapes = {"features": (-1, channels, -1), "reference_mean": (-1, description),
                  "reference_scale": (-1, description), "reference_log_error": (-1,)}
        return ModelSignature(
            inputs=Schema([TensorSpec(float32, shapes[name], name) for name in card["inputs"]]),
            outputs=Schema([TensorSpec(float32, (-1, description) if name == "description" else (-1,), name)
                            for name in card["outputs"]]))

    def champion_metrics(self, prepared, onnx_path: Path, card: dict) -> dict[str, float]:
        """The model on the test windows, each unit against its first `reference_windows` (as the export's)."""
        from data.sensors.featurize import first_windows
        from models.metrics import classification_metrics
        from models.predictors import SensorPredictor

        test = prepared.windows["test"]
        model = SensorPredictor(onnx_path, card, prefer_cuda=False)
        marked = first_windows(test.unit, test.time, prepared.report["reference_windows"])
        out = model.predict(test.X, model.own_references(test.X, test.unit, marked))
        return classification_metrics(test.y, out["probability"], card["threshold"])

    def test_positives(self, prepared, card: dict) -> int | None:
        return int(prepared.windows["test"].y.sum())

    def test_figures(self, prepared, card: dict, baseline: dict) -> list[Path]:
        """PR curves of the model and every baseline on test."""
        from flows import plots

        probability = np.loadtxt(self.paths.predictions, delimiter=",", skiprows=1, usecols=3, ndmin=1)
        scores = {"ensemble (ours)": probability,
                  **{o["name"]: np.asarray(o["test_probability"]) for o in baseline["baselines"]}}
        return [plots.pr_curves(prepared.windows["test"].y, scores, self.paths.plots / "pr_curve_test.png")]

    def input_drift(self, reference: dict, recent, cfg) -> tuple[dict, list[str], dict[str, float]]:
        """PSI and KS of each channel's window means against the training windows'; the alarm on the worst PSI."""
        import math

        from contract.prediction_store import summary_means
        from models.monitoring import sensor_drift

        channels = reference["channels"].tolist()
        drift = sensor_drift(reference, summary_means(recent["input_summary"], channels))
        psi = {c: d["psi"] for c, d in drift.items() if math.isfinite(d["psi"])}
        report = {"n": len(recent), "channels": drift, "max_psi": max(psi.values(), default=float("nan")),
                  "max_ks": max((d["ks"] for d in drift.values() if math.isfinite(d["ks"])), default=float("nan"))}
        alarms = []
        if len(recent) >= cfg.min_outcomes and psi and report["max_psi"] > cfg.max_psi:
            worst = max(psi, key=psi.get)
            alarms.append(f"input drift: PSI {psi[worst]:.3f} on channel {worst} exceeds {cfg.max_psi} "
                          f"(last {len(recent)} windows)")
        metrics = {f"input_{k}": report[k] for k in ("max_psi", "max_ks") if math.isfinite(report[k])}
        return report, alarms, {**metrics, **{f"input_psi_{c}": value for c, value in psi.items()}}


FAMILY = SensorFamily()
