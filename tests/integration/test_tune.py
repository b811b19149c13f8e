"""The opt-in tune stage in a tiny workspace: Optuna trials as Prefect tasks, nested MLflow runs, the best
settings in tuned/sensor.yaml, and fine-tuning that reads them on top of params.yaml."""

from __future__ import annotations

import json

import pytest
import yaml
from mlflow import MlflowClient

from tests.integration.workspace import TINY, clone_workspace, merged, run

pytestmark = pytest.mark.integration

SPACE = {"finetune.lr": {"low": 0.0005, "high": 0.005, "log": True}, "model.dropout": {"choices": [0.0, 0.2]},
         "finetune.loss.terms": {"choices": [{"bce": 1.0}, {"gce": 1.0}]}}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, finished_workspace):
    """`dvc repro sensor_tune` with four TPE trials in a clone of the finished workspace."""
    params = merged(TINY, {"sensor": {"finetune": {"epochs": 3, "patience": 3},
                                      "tune": {"trials": 4, "space": SPACE, "seed": 1}}})
    root = clone_workspace(finished_workspace, tmp_path_factory.mktemp("tune") / "ws", params)
    result = run(root, "dvc", "repro", "sensor_tune")
    return root, result


def _runs(root, query: str) -> list:
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow' / 'mlflow.db'}")
    return client.search_runs([client.get_experiment_by_name("sensor").experiment_id], query)


def test_the_best_trial_goes_to_the_tuned_file_within_the_space(tuned):
    root, result = tuned
    trials = json.loads((root / "artifacts" / "sensor" / "tune" / "trials.json").read_text())
    assert len(trials) == 4 and {t["state"] for t in trials} <= {"complete", "pruned"}
    complete = [t for t in trials if t["state"] == "complete"]
    assert trials[0]["value"] == max(t["value"] for t in complete)  # best first
    best = yaml.safe_load((root / "tuned" / "sensor.yaml").read_text())
    assert best == trials[0]["params"] and set(SPACE) <= set(best)  # with the default space's other keys
    assert 0.0005 <= best["finetune.lr"] <= 0.005 and best["model.dropout"] in (0.0, 0.2)
    assert best["finetune.loss.terms"] in ({"bce": 1.0}, {"gce": 1.0})  # a mapping choice comes back as one
    assert len({json.dumps(t["params"], sort_keys=True) for t in trials}) == 4  # four different settings
    assert "best val_pr_auc" in result.stdout


def test_each_trial_is_a_nested_mlflow_run_with_its_settings_and_the_plots_are_logged(tuned):
    root, _ = tuned
    parent = _runs(root, "tags.stage = 'tune'")
    assert len(parent) == 1
    children = _runs(root, f"tags.mlflow.parentRunId = '{parent[0].info.run_id}'")
    assert len(children) == 4
    trials = {t["trial"]: t for t in json.loads((root / "artifacts/sensor/tune/trials.json").read_text())}
    for child in children:
        trial = trials[int(child.info.run_name.rsplit("-", 1)[1])]
        assert float(child.data.params["finetune.lr"]) == pytest.approx(trial["params"]["finetune.lr"])
        assert child.data.tags["state"] == trial["state"]
    assert (root / "artifacts/sensor/tune/optimization_history.png").stat().st_size > 10_000


def test_finetune_reads_the_tuned_settings_on_top_of_params_and_says_so(tuned):
    root, _ = tuned
    best = yaml.safe_load((root / "tuned" / "sensor.yaml").read_text())
    run(root, "dvc", "repro", "sensor_finetune")
    finetune = _runs(root, "tags.stage = 'finetune'")
    assert len(finetune) == 1 and finetune[0].data.tags["tuned"] == "tuned/sensor.yaml"
    assert float(finetune[0].data.params["finetune.lr"]) == pytest.approx(best["finetune.lr"])
    assert finetune[0].data.params["model.dropout"] == str(best["model.dropout"])
    again = run(root, "dvc", "status", "sensor_finetune")
    assert "changed" not in again.stdout  # the tuned file is a dependency DVC tracks


def test_a_space_key_that_is_no_setting_fails_before_anything_trains(tmp_path, finished_workspace):
    root = clone_workspace(finished_workspace, tmp_path / "ws", merged(TINY, {"sensor": {"tune": {
        "trials": 2, "space": {"finetune.learning_rate": {"low": 0.001, "high": 0.01}}}}}))
    tuned = (root / "tuned" / "sensor.yaml").read_text()  # the finished pipeline's: not tuned
    result = run(root, "python", "-m", "flows.stages.tune", "sensor", check=False)
    assert result.returncode == 2 and "unknown parameter 'sensor.finetune.learning_rate'" in result.stderr
    assert (root / "tuned" / "sensor.yaml").read_text() == tuned
