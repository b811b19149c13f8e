"""The molecular property model's parts for the generic stages (flows/family.py): standardised, scaffold-split
SMILES, the graph + SMILES encoders pretrained on unlabelled molecules, the fused ensemble, a random forest on
Morgan counts, the ONNX graph (flows/molecule/onnx_export.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flows.family import Exported, FinetuneData, PipelineFamily, Prepared
from flows.molecule.splits import load_molecules, targets, tokenizer_of
from flows.tasks import cached_io_task, compute_task, source_cache_key

RANDOM_FOREST = "random_forest_morgan"


@dataclass
class Splits:
    """What every member trains on: featurised molecules (models.molecule.training.Molecules), targets standardised
    by the training mean and sd (regression; classification: as they are), the tokenizer."""

    task: str
    train_data: object
    train_y: np.ndarray
    val_data: object
    val_y: np.ndarray
    mean: float
    std: float
    tokenizer: object


@cached_io_task(source_cache_key(code=("data.molecules", "data.config", "data.tables"), packages=("rdkit", "datamol")),
                name="load-clean-split")
def build_splits(cfg):
    """Pure: the same config, source bytes, data code and RDKit give the same molecules (a cache hit skips the
    RDKit standardisation, e.g. in a nightly data refresh of an unchanged file)."""
    from data.molecules.prepare import prepare_molecule_data

    return prepare_molecule_data(cfg)


@compute_task(name="masked-atoms-tokens-contrastive")
def pretrain_model(molecules, vocab_size, max_length, model_cfg, cfg):
    from models.device import pick_device
    from models.molecule.training import pretrain_model

    return pretrain_model(molecules, vocab_size, max_length, model_cfg, cfg, pick_device())


@compute_task(name="fit-random-forest")
def fit_random_forest(smiles: list[str], y: np.ndarray, task: str, n_trees: int, seed: int, max_heavy_atoms: int):
    """The forest, fitted by parallel jobs; it predicts with one job, which sums the trees in their order (parallel
    jobs add them as they finish, and the last bits of the sum then vary from run to run)."""
    from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor

    from data.molecules.fingerprints import morgan_counts

    forest = RandomForestRegressor if task == "regression" else RandomForestClassifier
    fitted = forest(n_estimators=n_trees, n_jobs=-1, random_state=seed).fit(
        morgan_counts(smiles, max_heavy_atoms=max_heavy_atoms), y)
    return fitted.set_params(n_jobs=1)


class MoleculeFamily(PipelineFamily):
    name = "molecule"
    summary_metrics = ("rmse", "mae", "r2", "coverage", "roc_auc", "pr_auc", "ece")
    sources_without_files = ("solubility",)

    def prepare(self, data) -> Prepared:
        prepared = build_splits(data)
        sizes = {name: len(frame) for name, frame in prepared.splits.items()}
        return Prepared(prepared, prepared.report, {f"n_{name}": float(n) for name, n in sizes.items()},
                        f"molecules per split: {sizes}; report: {self.paths.prepared / 'report.json'}")

    def save_prepared(self, prepared: Prepared, folder: Path) -> None:
        from data.molecules.prepare import save_prepared

        save_prepared(prepared.data, folder)

    def load_prepared(self):
        return load_molecules()

    def pretrain(self, cfg) -> tuple[dict, list[dict], str]:
        """Masked atoms, masked tokens and graph/SMILES contrastive alignment on the train split's molecules."""
        from flows.molecule.artifacts import featurize

        prepared = load_molecules()
        tokenizer = tokenizer_of(prepared)
        smiles = list(prepared.splits["train"]["smiles"])
        molecules = featurize(smiles, tokenizer, cfg.data.max_heavy_atoms)
        model, result = pretrain_model(molecules, len(tokenizer), tokenizer.max_length, cfg.model, cfg.pretrain)
        state = {"state": model.state_dict(), "model": cfg.model.model_dump(), "tokenizer": tokenizer.to_dict(),
                 "history": result.history}
        return state, result.history, f"encoders pretrained on {len(smiles)} molecules"

    def finetune_data(self, cfg, in_flow: bool = True) -> FinetuneData:
        """The prepared splits featurised, and the pretrained model where `finetune.use_pretrained` (ValueError where
        it was built with other model sizes or another tokenizer)."""
        from flows.molecule.artifacts import featurize

        prepared = load_molecules() if in_flow else load_molecules.fn()
        task, tokenizer = prepared.task, tokenizer_of(prepared)
        data = [featurize(list(prepared.splits[split]["smiles"]), tokenizer, cfg.data.max_heavy_atoms)
                for split in ("train", "val")]
        train_y, val_y = targets(prepared, "train"), targets(prepared, "val")
        mean, std = (float(train_y.mean()), float(train_y.std()) or 1.0) if task == "regression" else (0.0, 1.0)
        splits = Splits(task, data[0], (train_y - mean) / std, data[1], (val_y - mean) / std, mean, std, tokenizer)
        pretrained = self._pretrained_state(cfg, tokenizer) if cfg.finetune.use_pretrained else None
        return FinetuneData(splits, pretrained, "-RMSE (standardised)" if task == "regression" else "ROC-AUC")

    def _pretrained_state(self, cfg, tokenizer) -> dict | None:
        from flows.molecule.artifacts import load_pretrained

        pretrained = load_pretrained(self.paths.pretrained)
        # the settings that shape the weights (views and dropout do not)
        sizes = lambda model: {k: v for k, v in model.items() if k not in ("modalities", "dropout")}  # noqa: E731
        if pretrained.get("state") is not None and (sizes(pretrained["model"]) != sizes(cfg.model.model_dump())
                                                    or pretrained["tokenizer"] != tokenizer.to_dict()):
            raise ValueError("the pretrained model was built with another molecule.model or tokenizer; rerun pretrain")
        return pretrained.get("state")

    def train_member(self, cfg, inputs: FinetuneData, seed: int, checkpoint: Path | None = None, distributed=None,
                     on_epoch=None):
        """One member; no checkpoints, not data-parallel (torchrun)."""
        from models.device import pick_device
        from models.molecule.training import finetune_member

        if distributed is not None:
            raise ValueError("the molecule family trains no member data-parallel: run its finetune without torchrun")
        data = inputs.data
        pretrained = inputs.pretrained if cfg.finetune.use_pretrained else None
        return finetune_member(data.train_data, data.train_y, data.val_data, data.val_y, data.task, cfg.model,
                               cfg.finetune, pretrained, len(data.tokenizer), data.tokenizer.max_length, seed,
                               pick_device(), on_epoch=on_epoch)

    def save_ensemble(self, cfg, inputs: FinetuneData, members: list, histories: list[list[dict]]) -> None:
        from flows.molecule.artifacts import save_ensemble

        data = inputs.data
        save_ensemble(self.paths.finetuned, members, cfg.model, data.task, data.mean, data.std, histories,
                      data.tokenizer)

    def tune_metric(self, inputs: FinetuneData) -> tuple[str, float]:
        """Regression: the training loop's score is -RMSE (standardised), shown as RMSE; classification: ROC-AUC."""
        return ("val_rmse_standardised", -1.0) if inputs.data.task == "regression" else ("val_roc_auc", 1.0)

    def inert_tune_settings(self, params) -> set[str]:
        """The other task's loss settings: a classifier has no regression loss, a regressor no classification loss."""
        if params.molecule.data.task == "classification":
            return {"finetune.regression_loss", "finetune.huber_delta"}
        return {"finetune.classification_loss", "finetune.focal_gamma"}

    def calibrate(self, cfg) -> tuple[dict, list[Path], str]:
        from flows.molecule.calibrate import calibrate

        return calibrate(cfg, self.paths)

    def baselines(self, cfg) -> dict:
        """Random forest (`baseline.n_trees`, Morgan counts r=2, 2048 bits): fit on train, metrics on test."""
        from data.molecules.fingerprints import morgan_counts
        from models.metrics import classification_metrics, regression_metrics

        prepared = load_molecules()
        task, heavy = prepared.task, cfg.data.max_heavy_atoms
        model = fit_random_forest(list(prepared.splits["train"]["smiles"]), targets(prepared, "train"), task,
                                  cfg.baseline.n_trees, cfg.data.seed, heavy)
        test_x = morgan_counts(list(prepared.splits["test"]["smiles"]), max_heavy_atoms=heavy)
        y = targets(prepared, "test")
        if task == "regression":
            prediction = model.predict(test_x)
            metrics = regression_metrics(y, prediction)
        else:
            prediction = model.predict_proba(test_x)[:, 1]
            metrics = classification_metrics(y, prediction)
        return {"name": RANDOM_FOREST, "test": metrics, "test_prediction": np.round(prediction, 6).tolist()}

    def export(self, cfg) -> Exported:
        from flows.molecule.onnx_export import export_model

        return export_model(cfg, self.paths, load_molecules())

    def predictor(self, onnx_path: Path, card: dict, threads: int | None = None):
        from models.predictors import MoleculePredictor

        return MoleculePredictor(onnx_path, card, prefer_cuda=False, threads=threads)

    def serving_items(self, prepared, card: dict) -> list[str]:
        return list(prepared.splits["test"]["smiles"])

    def signature(self, card: dict):
        """Dynamic numbers of atoms, bonds, molecules, atom slots and SMILES tokens."""
        from mlflow.models import ModelSignature
        from mlflow.types import Schema, TensorSpec

        from data.molecules.descriptors import DESCRIPTOR_SIZE
        from data.molecules.encodings import POSITIONAL_SIZE
        from data.molecules.featurize import ATOM_FEATURE_SIZES, BOND_FEATURE_SIZES
        from flows.molecule.evaluation import outputs

        i64, f32 = np.dtype(np.int64), np.dtype(np.float32)
        inputs = [(i64, (-1, len(ATOM_FEATURE_SIZES)), "atom_features"), (i64, (2, -1), "edge_index"),
                  (i64, (-1, len(BOND_FEATURE_SIZES)), "bond_features"), (f32, (-1, POSITIONAL_SIZE), "positional"),
                  (i64, (-1,), "batch"), (f32, (-1, -1), "atom_mask"), (f32, (-1,), "graph_mask"),
                  (i64, (-1, -1), "tokens"), (f32, (-1, DESCRIPTOR_SIZE), "descriptors")]
        return ModelSignature(inputs=Schema([TensorSpec(*spec) for spec in inputs]),
                              outputs=Schema([TensorSpec(f32, (-1,), name) for name in outputs(card["task"])]))

    def champion_metrics(self, prepared, onnx_path: Path, card: dict) -> dict[str, float]:
        from flows.molecule.evaluation import test_metrics
        from models.predictors import MoleculePredictor

        test = prepared.splits["test"]
        out = MoleculePredictor(onnx_path, card, prefer_cuda=False).predict(list(test["smiles"]))
        return test_metrics(card["task"], targets(prepared, "test"), out["prediction"], out["uncertainty"], card)

    def test_positives(self, prepared, card: dict) -> int | None:
        return int(targets(prepared, "test").sum()) if card["task"] == "classification" else None

    def test_figures(self, prepared, card: dict, baseline: dict) -> list[Path]:
        """Regression: the parity plot; classification: the reliability diagram and ROC curves (logged, not a DVC
        plot)."""
        import pandas as pd

        from flows import plots

        y = targets(prepared, "test")
        predictions = {"ensemble (ours)": pd.read_csv(self.paths.predictions)["prediction"].to_numpy(),
                       baseline["name"]: np.asarray(baseline["test_prediction"])}
        if card["task"] == "regression":
            return [plots.parity_plot(y, predictions, self.paths.plots / "test_performance.png")]
        return [plots.reliability_diagram(y, predictions, self.paths.plots / "test_performance.png"),
                plots.roc_curves(y, predictions, self.paths.plots / "roc_test.png")]

    def input_drift(self, reference: dict, recent, cfg) -> tuple[dict, list[str], dict[str, float]]:
        """The applicability domain: each recent molecule's nearest training neighbour (Tanimoto on Morgan bits) and
        descriptors outside the training ranges; the alarm on the share without a close neighbour."""
        from data.errors import DataValidationError
        from models.drift import nearest_similarity, out_of_range
        from models.monitoring import descriptor_matrix, morgan_bits

        smiles, unreadable = [], 0
        for summary, output in zip(recent["input_summary"], recent["output"]):
            item = (summary or {}).get("canonical_smiles") or (summary or {}).get("smiles") or (output or {}).get("smiles")
            try:
                if item is not None:
                    morgan_bits([item])  # parses and standardises
                    smiles.append(item)
                    continue
            except DataValidationError:
                pass
            unreadable += 1
        report: dict = {"n": len(smiles), "unreadable": unreadable}
        if not smiles:
            return report, [], {}
        similarity = nearest_similarity(reference["fingerprints"], morgan_bits(smiles))
        outside = float(np.mean(similarity < cfg.min_similarity))
        report.update({"out_of_range": out_of_range(reference, descriptor_matrix(smiles)),
                       "nn_similarity_mean": float(similarity.mean()),
                       "nn_similarity_p10": float(np.quantile(similarity, 0.1)), "out_of_domain": outside})
        alarms = []
        if len(smiles) >= cfg.min_outcomes and outside > cfg.max_out_of_domain:
            alarms.append(f"applicability domain: {outside:.1%} of the last {len(smiles)} molecules have no training "
                          f"neighbour with Tanimoto >= {cfg.min_similarity} (bound {cfg.max_out_of_domain:.0%})")
        return report, alarms, {"input_nn_similarity_mean": report["nn_similarity_mean"],
                                "input_out_of_domain": outside, "input_out_of_range_any": report["out_of_range"]["any"]}


FAMILY = MoleculeFamily()
