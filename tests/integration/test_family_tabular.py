"""A third family (tests/families/tabular/: its folder and one registration line) through the generic stages to a
signed registry version, then served by the generic service: its version behind a real uvicorn server answers on
/v1/tabular/predict and through the Open Inference Protocol (tritonclient) what its ONNX graph computes, each
answer logged under its prediction id. Neither flows/ nor serving/ names the family."""

from __future__ import annotations

import json
import shutil
import time

import httpx
import numpy as np
import pandas as pd
import pytest
import tritonclient.http as triton

from tests.integration.workspace import PROJECT

pytestmark = pytest.mark.integration
ROWS = np.array([[0.5, -1.0, 2.0], [0.0, 0.0, 0.0], [-1.5, 0.25, 1.0]], dtype=np.float32)


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    """A workspace whose tabular model (y = 2 a - b + 0.5 c + noise) went through the generic stages, and the
    register stage's summary."""
    from flows.family import FAMILIES
    from flows.stages import baseline, calibrate, export, finetune, prepare, register

    root = tmp_path_factory.mktemp("tabular")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(FAMILIES, "tabular", "tests.families.tabular.family")
        patch.chdir(root)
        shutil.copy(PROJECT / "params.yaml", root / "params.yaml")
        rng = np.random.default_rng(0)
        x = rng.normal(size=(200, 3))
        y = 2 * x[:, 0] - x[:, 1] + 0.5 * x[:, 2] + rng.normal(scale=0.3, size=200)
        pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "y": y}).to_csv(root / "table.csv", index=False)
        for stage in (prepare.prepare, finetune.finetune, calibrate.calibrate, baseline.baseline, export.export):
            stage("tabular", params_file=str(root / "params.yaml"))
        summary = register.register("tabular", params_file=str(root / "params.yaml"))
        yield root, summary  # the module's tests run in the workspace, the family registered


def test_a_third_family_runs_the_generic_stages_to_a_signed_registered_version(registered):
    from mlflow import MlflowClient

    from contract.manifest import load_verify_key, public_key_path
    from contract.registry import CHAMPION, download_verified
    from flows.params import load_params
    from flows.tracking import signing_key, use_tracking

    root, summary = registered
    assert summary["registered_version"] == 1 and summary["promoted"], summary["reasons"]
    assert summary["model"]["rmse"] < 0.5 * summary["baseline"]["rmse"]  # the linear model learnt the relation
    assert json.loads((root / "metrics" / "tabular" / "ours.json").read_text()) == summary["model"]
    config = load_params(root / "params.yaml")
    use_tracking(config.tracking)
    client = MlflowClient()
    assert str(client.get_model_version_by_alias("tabular-regressor", CHAMPION).version) == "1"
    verified = download_verified(client, "tabular-regressor", "1", root / "download",
                                 load_verify_key(public_key_path(signing_key(config.tracking))))
    card = verified.card
    assert {"family": card["family"], "task": card["task"], "target": card["target"]} == {
        "family": "tabular", "task": "regression", "target": "y"}
    assert set(card) >= {"inputs", "outputs", "test_metrics", "val_metrics", "calibration", "calibration_error",
                         "uncertainty_quality", "parity_max_abs_diff", "onnx_sha256"}
    assert card["onnx_sha256"] == verified.manifest["files"]["model.onnx"]
    assert {"model.onnx", "card.json", "reference.npz"} <= set(verified.manifest["files"])


@pytest.fixture(scope="module")
def url(registered):
    root = registered[0]
    from contract.registry import RegistrySettings
    from serving.app import create_app
    from serving.served_models import ServedModels
    from serving.settings import ServingSettings
    from tests.families.tabular.family import TabularSettings
    from tests.integration.test_serving_registry import serve

    params = str(root / "params.yaml")
    registry = RegistrySettings.from_params(params, ["tabular"])
    names = {"tabular": TabularSettings().registry.model_name}  # the family keeps its settings out of params.yaml
    models = ServedModels(registry.tracking_uri, names, "champion", registry.verify_key, prefer_cuda=False)
    settings = ServingSettings(params_file=params, families=["tabular"],
                               prediction_store=f"sqlite:///{root / 'predictions.db'}")
    with serve(create_app(settings, store=models)) as url:
        yield url


def test_v1_answers_what_the_exported_graph_computes(registered, url):
    from models.onnx_runtime import load_session, run

    expected = run(load_session(registered[0] / "artifacts" / "tabular" / "export" / "model.onnx", False)[0],
                   {"features": ROWS})
    models = httpx.get(f"{url}/v1/models").json()["models"]
    assert [(m["family"], m["name"], m["version"], m["channels"]) for m in models] == [
        ("tabular", "tabular-regressor", "1", ["a", "b", "c"])]
    answer = httpx.post(f"{url}/v1/tabular/predict", json={"rows": ROWS.tolist()})
    assert answer.status_code == 200, answer.text
    predictions = answer.json()["predictions"]
    assert np.allclose([p["value"] for p in predictions], expected["value"], atol=1e-5)
    assert np.allclose([p["uncertainty"] for p in predictions], expected["uncertainty"], atol=1e-5)
    refused = httpx.post(f"{url}/v1/tabular/predict", json={"rows": [[1.0, 2.0]]})
    assert refused.status_code == 422 and "a, b, c" in refused.json()["detail"]


def test_v2_equals_v1_and_every_answer_is_logged(registered, url):
    from contract.prediction_store import connect, find_predictions

    v1 = httpx.post(f"{url}/v1/tabular/predict", json={"rows": ROWS.tolist()}).json()["predictions"]
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    metadata = client.get_model_metadata("tabular")
    assert metadata["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 3]}]
    assert [o["name"] for o in metadata["outputs"]] == ["value", "uncertainty", "prediction_id"]
    tensor = triton.InferInput("features", list(ROWS.shape), "FP32")
    tensor.set_data_from_numpy(ROWS, binary_data=True)
    result = client.infer("tabular-regressor", [tensor])
    client.close()
    assert np.array_equal(result.as_numpy("value"), np.array([p["value"] for p in v1], np.float32))
    ids = [p["prediction_id"] for p in v1] + [i.decode() for i in result.as_numpy("prediction_id").tolist()]
    store, deadline = connect(f"sqlite:///{registered[0] / 'predictions.db'}"), time.monotonic() + 10
    while len(found := find_predictions(store, ids)) < len(ids) and time.monotonic() < deadline:
        time.sleep(0.2)  # the log writes in the background
    assert set(found) == set(ids) and {row["family"] for row in found.values()} == {"tabular"}
