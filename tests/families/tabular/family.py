"""The tabular family: a small ensemble of linear regressors on a CSV's numeric columns, through the same generic
stages as the two built-in families (flows/stages/). Its settings are its own (no section of params.yaml): a
`TabularSettings` whose sections the stages log and read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch
from pydantic import BaseModel

from flows.config import RegistryConfig
from flows.family import Exported, FinetuneData, PipelineFamily, Prepared
from flows.json_io import read_json
from models.export import check_parity, export_onnx
from models.metrics import regression_metrics
from models.onnx_runtime import load_session, run
from models.serialization import load_state, save_state
from models.training import TrainResult
from models.uncertainty_quality import regression_uncertainty_quality

INTERVAL_Z = 1.645  # a two-sided 90 % normal interval


class Section(BaseModel):
    """A settings section: any keys."""

    model_config = {"extra": "allow"}


class TabularSettings(BaseModel):
    """What the generic stages read of a family's settings."""

    data: Section = Section(path="table.csv", target="y", seed=0)
    model: Section = Section()
    pretrain: Section = Section(enabled=False)
    finetune: Section = Section(seed=0, ensemble_size=3, epochs=60, lr=0.05, use_pretrained=False)
    calibrate: Section = Section(interval_z=INTERVAL_Z)
    baseline: Section = Section()
    export: Section = Section(opset=18)
    registry: RegistryConfig = RegistryConfig(model_name="tabular-regressor", primary_metric="rmse", mode="min",
                                              max_calibration_error=0.5)


class CalibratedLinearEnsemble(torch.nn.Module):
    """(batch, columns) raw features -> value (batch,) and uncertainty (batch,): the members' mean in target units
    and their spread times the calibration scale."""

    def __init__(self, members: list[torch.nn.Linear], state: dict, scale: float):
        super().__init__()
        self.members = torch.nn.ModuleList(members)
        for name in ("x_mean", "x_std"):
            self.register_buffer(name, torch.tensor(state[name], dtype=torch.float32))
        self.y_mean, self.y_std, self.scale = state["y_mean"], state["y_std"], scale

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """inputs: the features alone (models/export.py exports a network's inputs as varargs)."""
        x = (inputs[0] - self.x_mean) / self.x_std
        outputs = torch.stack([m(x).squeeze(-1) for m in self.members], dim=1) * self.y_std + self.y_mean
        return outputs.mean(dim=1), outputs.std(dim=1, unbiased=False) * self.scale


class TabularFamily(PipelineFamily):
    name = "tabular"

    def settings(self, params) -> TabularSettings:
        return TabularSettings()

    def prepare(self, data) -> Prepared:
        frame = pd.read_csv(data.path)
        order = np.random.default_rng(data.seed).permutation(len(frame))
        cut = [int(len(frame) * 0.6), int(len(frame) * 0.8)]
        splits = dict(zip(("train", "val", "test"), (frame.iloc[rows] for rows in np.split(order, cut))))
        report = {"rows": len(frame), "columns": [c for c in frame.columns if c != data.target]}
        return Prepared(splits, report, {f"n_{k}": float(len(v)) for k, v in splits.items()},
                        f"tabular rows per split: { {k: len(v) for k, v in splits.items()} }")

    def save_prepared(self, prepared: Prepared, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        for name, split in prepared.data.items():
            split.to_csv(folder / f"{name}.csv", index=False)

    def load_prepared(self) -> dict[str, pd.DataFrame]:
        return {name: pd.read_csv(self.paths.prepared / f"{name}.csv") for name in ("train", "val", "test")}

    def finetune_data(self, cfg, in_flow: bool = True) -> FinetuneData:
        return FinetuneData({**self._arrays(cfg), "target": cfg.data.target}, None, "-RMSE (standardised)")

    def _arrays(self, cfg) -> dict:
        """Features (n, k) and targets (n,) of every split, and the training split's means and sds."""
        splits = self.load_prepared()
        columns = [c for c in splits["train"].columns if c != cfg.data.target]
        arrays = {f"{name}_x": split[columns].to_numpy(np.float32) for name, split in splits.items()}
        arrays.update({f"{name}_y": split[cfg.data.target].to_numpy(np.float64) for name, split in splits.items()})
        train_x, train_y = arrays["train_x"], arrays["train_y"]
        return {**arrays, "columns": columns, "x_mean": train_x.mean(0).tolist(),
                "x_std": (train_x.std(0) + 1e-6).tolist(), "y_mean": float(train_y.mean()),
                "y_std": float(train_y.std()) or 1.0}

    def train_member(self, cfg, inputs: FinetuneData, seed: int, checkpoint: Path | None = None, distributed=None,
                     on_epoch=None):
        """Full-batch Adam on the standardised data; the validation score is -RMSE (standardised)."""
        d = inputs.data
        standard = lambda x: torch.tensor((x - d["x_mean"]) / d["x_std"], dtype=torch.float32)  # noqa: E731
        target = lambda y: torch.tensor((y - d["y_mean"]) / d["y_std"], dtype=torch.float32)  # noqa: E731
        torch.manual_seed(seed)
        member, result = torch.nn.Linear(len(d["columns"]), 1), TrainResult()
        optimiser = torch.optim.Adam(member.parameters(), lr=cfg.finetune.lr)
        for epoch in range(cfg.finetune.epochs):
            loss = torch.nn.functional.mse_loss(member(standard(d["train_x"])).squeeze(-1), target(d["train_y"]))
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            with torch.no_grad():
                score = -float(torch.sqrt(torch.mean((member(standard(d["val_x"])).squeeze(-1)
                                                      - target(d["val_y"])) ** 2)))
            result.history.append({"epoch": epoch, "train_loss": float(loss), "val_score": score})
            if score > result.best_score:
                result.best_score, result.best_epoch = score, epoch
        return member, result

    def save_ensemble(self, cfg, inputs: FinetuneData, members: list, histories: list[list[dict]]) -> None:
        keys = ("columns", "x_mean", "x_std", "y_mean", "y_std", "target")
        save_state({**{k: inputs.data[k] for k in keys}, "members": [m.state_dict() for m in members],
                    "histories": histories}, self.paths.finetuned)

    def tune_metric(self, inputs: FinetuneData) -> tuple[str, float]:
        return "val_rmse_standardised", -1.0

    def _ensemble(self, scale: float = 1.0) -> tuple[CalibratedLinearEnsemble, dict]:
        state = load_state(self.paths.finetuned, "rerun the tabular finetune stage")
        members = []
        for weights in state["members"]:
            member = torch.nn.Linear(len(state["columns"]), 1)
            member.load_state_dict(weights)
            members.append(member)
        return CalibratedLinearEnsemble(members, state, scale).eval(), state

    def _predict(self, model: CalibratedLinearEnsemble, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad():
            value, spread = model(torch.from_numpy(x))
        return value.numpy(), spread.numpy()

    def calibrate(self, cfg) -> tuple[dict, list[Path], str]:
        """The spread's scale that gives validation z-scores unit variance."""
        model, state = self._ensemble()
        val = self.load_prepared()["val"]
        value, spread = self._predict(model, val[state["columns"]].to_numpy(np.float32))
        scale = float(np.sqrt(np.mean((val[state["target"]].to_numpy() - value) ** 2 / np.maximum(spread, 1e-6) ** 2)))
        return ({"method": "scaled_variance", "scale": scale, "interval_z": cfg.calibrate.interval_z,
                 "nominal_coverage": 0.9, "mask_passes": 0, "mask_seed": 0}, [], f"scale {scale:.3f}")

    def baselines(self, cfg) -> dict:
        """The training mean for every test row."""
        splits = self.load_prepared()
        y = splits["test"][cfg.data.target].to_numpy(float)
        prediction = np.full(len(y), splits["train"][cfg.data.target].mean())
        return {"name": "train_mean", "test": regression_metrics(y, prediction),
                "test_prediction": np.round(prediction, 6).tolist()}

    def export(self, cfg) -> Exported:
        calibration = read_json(self.paths.calibration)
        model, state = self._ensemble(calibration["scale"])
        splits = self.load_prepared()
        example = torch.from_numpy(splits["val"][state["columns"]].to_numpy(np.float32)[:4])
        export_onnx(model, {"features": example}, {"features": {0: "batch"}}, ["value", "uncertainty"],
                    self.paths.onnx, cfg.export.opset)
        card = {"family": "tabular", "task": "regression", "target": state["target"], "columns": state["columns"],
                "calibration": calibration, "ensemble_size": len(state["members"]), "outputs": ["value", "uncertainty"],
                "inputs": {"features": f"(batch, {len(state['columns'])}) float32: {', '.join(state['columns'])}"}}
        with torch.no_grad():
            expected = model(example)
        card["parity_max_abs_diff"] = check_parity(expected, self._run(self.paths.onnx, example.numpy()))
        y = splits["test"][state["target"]].to_numpy(float)
        value, uncertainty = self._run(self.paths.onnx, splits["test"][state["columns"]].to_numpy(np.float32))
        card["test_metrics"] = self._metrics(y, value, uncertainty, calibration)
        val_y = splits["val"][state["target"]].to_numpy(float)
        card["val_metrics"] = self._metrics(val_y, *self._run(self.paths.onnx, splits["val"][state["columns"]]
                                                              .to_numpy(np.float32)), calibration)
        card["calibration_error"] = abs(card["test_metrics"]["coverage"] - calibration["nominal_coverage"])
        card["uncertainty_quality"] = regression_uncertainty_quality(y, value, uncertainty)
        predictions = pd.DataFrame({"target": y, "prediction": np.round(value, 6),
                                    "uncertainty": np.round(uncertainty, 6)})
        reference = {"feature_mean": np.asarray(state["x_mean"]), "feature_std": np.asarray(state["x_std"])}
        return Exported(card, reference, predictions, {}, f"tabular model exported: {card['test_metrics']}")

    def predictor(self, onnx_path: Path, card: dict, threads: int | None = None):
        from tests.families.tabular.serving import TabularPredictor

        return TabularPredictor(onnx_path, card, prefer_cuda=False, threads=threads)

    def _run(self, onnx_path: Path, x: np.ndarray) -> list[np.ndarray]:
        out = run(load_session(onnx_path, prefer_cuda=False)[0], {"features": x})
        return [out["value"], out["uncertainty"]]

    def _metrics(self, y: np.ndarray, value: np.ndarray, uncertainty: np.ndarray, calibration: dict) -> dict:
        half = calibration["interval_z"] * uncertainty
        return regression_metrics(y, value, value - half, value + half)

    def signature(self, card: dict):
        from mlflow.models import ModelSignature
        from mlflow.types import Schema, TensorSpec

        f32 = np.dtype(np.float32)
        return ModelSignature(inputs=Schema([TensorSpec(f32, (-1, len(card["columns"])), "features")]),
                              outputs=Schema([TensorSpec(f32, (-1,), name) for name in card["outputs"]]))

    def serving_items(self, prepared, card: dict) -> np.ndarray:
        return prepared["test"][card["columns"]].to_numpy(np.float32)

    def champion_metrics(self, prepared, onnx_path: Path, card: dict) -> dict[str, float]:
        test = prepared["test"]
        value, uncertainty = self._run(onnx_path, test[card["columns"]].to_numpy(np.float32))
        return self._metrics(test[card["target"]].to_numpy(float), value, uncertainty, card["calibration"])


FAMILY = TabularFamily()
