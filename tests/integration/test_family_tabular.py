"""A third family (tests/families/tabular/), one registration line, through the generic stages to a signed registry
version: what a new family needs of the pipeline is flows/family.py's PipelineFamily, nothing else."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from tests.integration.workspace import PROJECT

pytestmark = pytest.mark.integration


@pytest.fixture
def tabular_workspace(tmp_path, monkeypatch):
    """A folder with params.yaml and a CSV of y = 2 a - b + 0.5 c + noise, the tabular family registered."""
    from flows.family import FAMILIES

    monkeypatch.setitem(FAMILIES, "tabular", "tests.families.tabular.family")
    monkeypatch.chdir(tmp_path)
    shutil.copy(PROJECT / "params.yaml", tmp_path / "params.yaml")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3))
    y = 2 * x[:, 0] - x[:, 1] + 0.5 * x[:, 2] + rng.normal(scale=0.3, size=200)
    pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "y": y}).to_csv(tmp_path / "table.csv", index=False)
    return tmp_path


def test_a_third_family_runs_the_generic_stages_to_a_signed_registered_version(tabular_workspace):
    from contract.manifest import load_verify_key, public_key_path
    from contract.registry import CHAMPION, download_verified
    from flows.params import load_params
    from flows.stages import baseline, calibrate, export, finetune, prepare, register
    from flows.tracking import signing_key, use_tracking

    params = str(tabular_workspace / "params.yaml")
    for stage in (prepare.prepare, finetune.finetune, calibrate.calibrate, baseline.baseline, export.export):
        stage("tabular", params_file=params)
    summary = register.register("tabular", params_file=params)

    assert summary["registered_version"] == 1 and summary["promoted"], summary["reasons"]
    assert summary["model"]["rmse"] < 0.5 * summary["baseline"]["rmse"]  # the linear model learnt the relation
    assert json.loads((tabular_workspace / "metrics" / "tabular" / "ours.json").read_text()) == summary["model"]
    config = load_params(params)
    use_tracking(config.tracking)
    client = MlflowClient()
    assert str(client.get_model_version_by_alias("tabular-regressor", CHAMPION).version) == "1"
    verified = download_verified(client, "tabular-regressor", "1", tabular_workspace / "download",
                                 load_verify_key(public_key_path(signing_key(config.tracking))))
    card = verified.card
    assert {"family": card["family"], "task": card["task"], "target": card["target"]} == {
        "family": "tabular", "task": "regression", "target": "y"}
    assert set(card) >= {"inputs", "outputs", "test_metrics", "val_metrics", "calibration", "calibration_error",
                         "uncertainty_quality", "parity_max_abs_diff", "onnx_sha256"}
    assert card["onnx_sha256"] == verified.manifest["files"]["model.onnx"]
    assert {"model.onnx", "card.json", "reference.npz"} <= set(verified.manifest["files"])
