"""The whole default pipeline, for real: `dvc repro` of Prefect flows into an MLflow SQLite store and
registry, with a DVC cache and local remote, in a scratch workspace with tiny settings."""

from __future__ import annotations

import json

import onnx
import pandas as pd
import pytest
from sklearn.metrics import average_precision_score
import yaml
from mlflow import MlflowClient

from contract.card import ServingCost
from contract.manifest import load_verify_key, sha256_file
from contract.reference import read_reference
from contract.registry import download_verified
from models.uncertainty_quality import uncertainty_quality
from tests.integration.workspace import FINISHED, clone_workspace, finished_output, merged, run

pytestmark = pytest.mark.integration

@pytest.fixture(scope="module")
def pipeline(finished_workspace):
    """The pipeline run once through `python -m flows.pipeline run` (what `make run` calls), the sensor model
    quantised to int8 (workspace.FINISHED): the workspace and the run's output. Read, never changed."""
    return finished_workspace, finished_output(finished_workspace)


def test_pipeline_registers_both_families_as_champion(pipeline, tmp_path):
    root, output = pipeline
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow' / 'mlflow.db'}")
    for family, name in (("sensor", "sensor-failure-detector"), ("molecule", "molecular-property")):
        champion = client.get_model_version_by_alias(name, "champion")
        metrics = json.loads((root / "metrics" / f"{family}.json").read_text())
        assert metrics["registered_version"] == champion.version
        assert metrics["promoted"] is True
        assert champion.tags["onnx_sha256"] == json.loads(
            (root / "artifacts" / family / "export" / "model_card.json").read_text())["onnx_sha256"]
        assert set(metrics["model_val"]) == set(metrics["model"])  # the exported model on validation too
        assert metrics["baseline"]["name"] and set(metrics["model"]) >= ({"pr_auc", "ece"} if family == "sensor"
                                                                         else {"rmse", "coverage"})
        # the DVC metrics: a file per model, ours and each baseline
        per_model = {path.stem: json.loads(path.read_text()) for path in (root / "metrics" / family).glob("*.json")}
        assert per_model["ours"] == pytest.approx(metrics["model"])
        assert per_model[metrics["baseline"]["name"]] == pytest.approx(
            {k: v for k, v in metrics["baseline"].items() if k != "name"})
        # the version carries its signed training reference and the run's lineage tags
        verified = download_verified(client, name, champion.version, tmp_path / family,
                                     load_verify_key(root / ".keys" / "model-signing.pub"))
        reference = read_reference(verified.directory)
        assert "reference.npz" in verified.manifest["files"]
        assert verified.card["serving_cost"] == metrics["serving_cost"]  # in the card it signed
        assert ("channels" in reference) if family == "sensor" else (reference["fingerprints"].dtype == "uint8")
        assert any(tag.startswith(f"data.{family}.") for tag in champion.tags) and "git_commit" in champion.tags
    assert "sensor-failure-detector" in output and "molecular-property" in output  # summary table
    assert output.count("(validation") == 2  # each family's first metric on validation too


def test_every_stage_run_carries_lineage(pipeline):
    root, _ = pipeline
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow' / 'mlflow.db'}")
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    commit = run(root, "git", "rev-parse", "HEAD").stdout.strip()
    for family in ("sensor", "molecule"):
        prepared_md5 = lock[f"{family}_prepare"]["outs"][0]["md5"]
        experiment = client.get_experiment_by_name(family)
        runs = client.search_runs([experiment.experiment_id])
        stages = {r.data.tags["stage"] for r in runs}
        assert stages == {"prepare", "pretrain", "finetune", "calibrate", "baseline", "export", "register"} | (
            {"novelty"} if family == "sensor" else set())
        for r in runs:
            assert r.data.tags[f"data.{family}.dvc_md5"] == prepared_md5
            assert r.data.tags["git_commit"].startswith(commit)


def test_predictions_files_follow_the_contract(pipeline):
    root, _ = pipeline
    sensor = (root / "metrics" / "sensor_predictions.csv").read_text().splitlines()
    molecule = (root / "metrics" / "molecule_predictions.csv").read_text().splitlines()
    assert sensor[0] == "unit,time,label,probability,uncertainty,novelty,combined" and len(sensor) > 10
    assert molecule[0] == "smiles,target,prediction,uncertainty" and len(molecule) > 10
    # the cards' uncertainty quality is that of the test predictions written beside them
    sensor, molecule = (pd.read_csv(root / "metrics" / f"{f}_predictions.csv") for f in ("sensor", "molecule"))
    cards = {f: json.loads((root / "artifacts" / f / "export" / "model_card.json").read_text())
             for f in ("sensor", "molecule")}
    expected = {"sensor": uncertainty_quality((sensor.probability - sensor.label) ** 2, sensor.uncertainty),
                "molecule": uncertainty_quality((molecule.prediction - molecule.target).abs(), molecule.uncertainty)}
    for family, figures in expected.items():
        got = cards[family]["uncertainty_quality"]
        assert got["aurc"] == pytest.approx(figures["aurc"], abs=1e-4)
        assert got["aurc_random"] == pytest.approx(figures["aurc_random"], abs=1e-4)
    assert set(cards["molecule"]["uncertainty_quality"]["coverage"]) == {"0.5", "0.8", "0.9", "0.95"}
    for family in ("sensor", "molecule"):
        # what a prediction costs, measured by register (the exported card stays reproducible)
        assert "serving_cost" not in cards[family]
        cost = ServingCost.model_validate(json.loads((root / "metrics" / f"{family}.json").read_text())["serving_cost"])
        assert cost.graph.bytes == (root / "artifacts" / family / "export" / "model.onnx").stat().st_size
        assert all(cost.total_ms_per_item[key] > cost.featurize_ms_per_item[key] > 0 for key in ("batch_1", "batch_64"))
        assert cards[family]["mask_passes"] == cards[family]["calibration"]["mask_passes"] == 2
        # the passes are in the graph (the members' FixedMaskPasses weights) as fixed masks: nothing is drawn at run time
        graph = onnx.load(str(root / "artifacts" / family / "export" / "model.onnx")).graph
        assert any(".masked." in tensor.name for tensor in graph.initializer)
        assert not {node.op_type for node in graph.node} & {"Dropout", "RandomUniform", "RandomUniformLike", "Bernoulli"}
    # the novelty score's test figures are those of the predictions written beside them
    novelty = cards["sensor"]["novelty"]
    for part in ("novelty", "combined"):
        assert novelty["test_metrics"][part]["pr_auc"] == pytest.approx(
            average_precision_score(sensor.label, sensor[part]), abs=1e-3)
    assert novelty["combination"]["rule"] in {"supervised", "novelty", "stacker", "max"}


def test_second_repro_is_a_no_op_and_data_is_pushed(pipeline):
    root, _ = pipeline
    again = run(root, "dvc", "repro")
    assert "Running stage" not in again.stdout
    assert "up to date" in again.stdout
    assert any((root / ".dvc-storage").rglob("*")), "dvc push left the default remote empty"


def test_a_param_change_reruns_exactly_the_stages_it_affects(pipeline, tmp_path):
    root, _ = pipeline
    clone = clone_workspace(root, tmp_path / "ws", merged(FINISHED, {"sensor": {"calibrate": {"target_precision": 0.7}}}))
    dry = run(clone, "dvc", "repro", "--dry").stdout
    ran = {line.split("'")[1] for line in dry.splitlines() if line.startswith("Running stage")}
    assert {"sensor_calibrate", "sensor_baseline"} <= ran
    assert not ran & {"sensor_prepare", "sensor_pretrain", "sensor_finetune"}
    assert not any(name.startswith("molecule_") for name in ran)


def test_quantized_export_is_the_evaluated_and_registered_file(pipeline):
    """`sensor.export.quantize: true`: the export stage writes, evaluates and registers the int8 file only."""
    root, _ = pipeline
    export = root / "artifacts" / "sensor" / "export"
    card = json.loads((export / "model_card.json").read_text())
    bound = yaml.safe_load((root / "params.yaml").read_text())["sensor"]["export"]["quantize_max_diff"]
    assert 0 < card["quantization"]["max_abs_diff_vs_float"] <= bound
    ops = {node.op_type for node in onnx.load(str(export / "model.onnx")).graph.node}
    assert "QLinearConv" in ops and "MatMulInteger" in ops and "Conv" not in ops
    assert not (export / "model.int8.onnx").exists()
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow' / 'mlflow.db'}")
    champion = client.get_model_version_by_alias("sensor-failure-detector", "champion")
    assert champion.tags["onnx_sha256"] == card["onnx_sha256"] == sha256_file(export / "model.onnx")
    metrics = json.loads((root / "metrics" / "sensor.json").read_text())
    assert metrics["model"]["pr_auc"] == pytest.approx(card["test_metrics"]["pr_auc"])
