"""flows/tuning.py without Prefect: how settings are suggested, and one trial against a real Optuna journal file."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from flows.config import SearchDimension, TuneConfig
from flows.family import FinetuneData
from flows.molecule.family import FAMILY as MOLECULE
from flows.params import Params, with_overrides
from flows.sensor.family import SensorFamily
from flows.stages import tune as tune_stage
from flows.tuning import journal, run_trial, searched, suggest
from models.training import TrainResult


def test_suggest_gives_back_mapping_choices_as_mappings_and_ranges_as_numbers():
    trial = optuna.trial.FixedTrial({"loss": '{"gce": 1.0}', "lr": 0.002, "layers": 3, "drop": 0.1})
    assert suggest(trial, "loss", SearchDimension(choices=[{"bce": 1.0}, {"gce": 1.0}])) == {"gce": 1.0}
    assert suggest(trial, "lr", SearchDimension(low=0.001, high=0.01, log=True)) == 0.002
    assert suggest(trial, "layers", SearchDimension(low=1, high=4, integer=True)) == 3
    assert suggest(trial, "drop", SearchDimension(choices=[0.0, 0.1])) == 0.1


class Curve(SensorFamily):
    """The sensor family with a stand-in for training and no data: validation score lr * 100 at every epoch (higher
    lr, better trial)."""

    def finetune_data(self, cfg, in_flow: bool = True) -> FinetuneData:
        return FinetuneData(None, None, "score")

    def train_member(self, cfg, inputs, seed, checkpoint=None, distributed=None, on_epoch=None):
        result = TrainResult()
        for epoch in range(cfg.finetune.epochs):
            score = cfg.finetune.lr * 100
            on_epoch(epoch, score)
            if score > result.best_score:
                result.best_score, result.best_epoch = score, epoch
        return None, result


class Fails(Curve):
    def train_member(self, cfg, inputs, seed, checkpoint=None, distributed=None, on_epoch=None):
        raise RuntimeError("size mismatch for encoder.weight")


def _study(tmp_path, choices, trials=8):
    params = with_overrides(Params(), {"sensor.finetune.epochs": 6, "sensor.tune.trials": trials,
                                       "sensor.tune.sampler": "grid",
                                       "sensor.tune.space": {"finetune.lr": {"choices": choices}}})
    path = tmp_path / "study.jsonl"
    study = optuna.create_study(study_name="sensor", storage=journal(path), direction="maximize")
    for lr in choices:
        study.enqueue_trial({"finetune.lr": lr})
    return params, path


def test_a_trial_below_the_median_of_earlier_trials_is_pruned_and_the_study_learns_each_outcome(tmp_path):
    rates = [0.03, 0.02, 0.025, 0.015, 0.035, 0.01]  # five finished trials, then one below their median
    params, path = _study(tmp_path, rates)
    records = [run_trial.fn(Curve(), index, params, None, str(path), 1.0) for index in range(6)]
    assert [r.state for r in records] == ["complete"] * 5 + ["pruned"]
    assert records[4].value == pytest.approx(3.5) and records[4].epochs == 6
    assert records[5].epochs == 3  # judged from a third of its 6 epochs on: after epochs 0, 1 and 2
    assert records[5].params == {"finetune.lr": 0.01} and records[5].value is None
    study = optuna.load_study(study_name="sensor", storage=journal(path))
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 5 + ["PRUNED"]
    assert study.best_params == {"finetune.lr": 0.035}


def test_a_trial_that_cannot_train_is_failed_with_its_reason_and_the_study_goes_on(tmp_path):
    params, path = _study(tmp_path, [0.03])
    record = run_trial.fn(Fails(), 0, params, None, str(path), 1.0)
    assert record.state == "failed" and "size mismatch for encoder.weight" in record.error
    assert optuna.load_study(study_name="sensor", storage=journal(path)).trials[0].state.name == "FAIL"


def test_settings_that_cannot_change_a_trial_leave_the_search():
    params = Params()
    space = {"finetune.lr": {"low": 1e-4, "high": 1e-2}, "finetune.regression_loss": {"choices": ["mse", "huber"]}}
    cfg = TuneConfig(trials=4, space=space)
    classifier = with_overrides(params, {"molecule.data.task": "classification"})
    kept, skipped = searched(cfg, MOLECULE.inert_tune_settings(classifier))
    assert list(kept.space) == ["finetune.lr"] and skipped == ["finetune.regression_loss"]
    kept, skipped = searched(cfg, MOLECULE.inert_tune_settings(params))  # the default is a regression
    assert list(kept.space) == list(space) and skipped == []
    with pytest.raises(ValueError, match="no setting of the search space"):
        searched(TuneConfig(trials=4, space={"finetune.huber_delta": {"low": 0.5, "high": 2.0}}), MOLECULE.inert_tune_settings(classifier))


PROJECT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "torch_geometric", "optuna")  # what the tune flows load


def _write_params(path: Path, family: str, tune: dict) -> None:
    """The project's params with `<family>.tune` updated by `tune`, at `path`."""
    params = yaml.safe_load((PROJECT / "params.yaml").read_text())
    params[family]["tune"].update(tune)
    path.write_text(yaml.safe_dump(params))


def _tune_stage(folder: Path, family: str, tune: dict, *options: str,
                  file: str = "params.yaml") -> tuple[subprocess.CompletedProcess, list[str]]:
    """`python -m flows.stages.tune <family> *options` in `folder`, with the project's params and `<family>.tune`
    updated by `tune` in `file`: its result, and which of HEAVY it imported (its last line of output)."""
    _write_params(folder / file, family, tune)
    probe = ("import runpy, sys\nsys.argv = ['flows/stages/tune.py', *sys.argv[1:]]\ntry:\n"
             "    runpy.run_module('flows.stages.tune', run_name='__main__')\nfinally:\n"
             f"    print([m for m in {HEAVY!r} if m in sys.modules])")
    result = subprocess.run([sys.executable, "-c", probe, family, *options], cwd=folder, capture_output=True,
                            text=True)
    return result, ast.literal_eval(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else None


@pytest.mark.parametrize("family", ["sensor", "molecule"])
def test_the_stage_command_writes_the_untuned_outputs_without_the_training_libraries(tmp_path, family):
    result, imported = _tune_stage(tmp_path, family, {"trials": 0})
    assert result.returncode == 0, result.stderr
    assert imported == []
    assert yaml.safe_load((tmp_path / "tuned" / f"{family}.yaml").read_text()) == {}
    assert json.loads((tmp_path / "artifacts" / family / "tune" / "trials.json").read_text()) == []
    assert f"{family} tune: off" in result.stdout


def test_the_stage_command_hands_what_it_cannot_settle_to_the_tune_flow(tmp_path):
    """Params that do not load: the flow's command line reports them (one paragraph, status 2) and writes nothing;
    the file named by --params is the one read (either spelling: the next test); other options (--help) are the
    flow's."""
    _write_params(tmp_path / "params.yaml", "sensor", {"trials": 0})  # this file alone would be settled here
    result, _ = _tune_stage(tmp_path, "sensor", {"trials": 0, "budget_minutes": "soon"}, "--params", "other.yaml",
                              file="other.yaml")
    assert result.returncode == 2, result.stdout
    assert "sensor.tune.budget_minutes" in result.stderr and "Traceback" not in result.stderr
    result, _ = _tune_stage(tmp_path, "sensor", {"trials": 0}, "--help")
    assert result.returncode == 0 and "--params" in result.stdout and "tune: off" not in result.stdout
    assert not (tmp_path / "tuned").exists()


def test_the_stage_command_reads_the_params_file_named_in_either_spelling(tmp_path, monkeypatch):
    """`--params=FILE` is read like `--params FILE`: FILE settles the stage here (trials 0), while params.yaml, whose
    params do not load, goes to the flow's command line (the flow itself is the test above's)."""
    _write_params(tmp_path / "params.yaml", "sensor", {"trials": 0, "budget_minutes": "soon"})
    _write_params(tmp_path / "other.yaml", "sensor", {"trials": 0})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # main sets the flow's argv before handing over
    monkeypatch.setattr(tune_stage, "hold_for_stage", lambda: None)  # the lock lives as long as a stage's process
    handed = []
    monkeypatch.setattr(tune_stage, "run_flow", lambda family, options: handed.append((family, options)))
    tune_stage.main(["sensor", "--params=other.yaml"])
    assert handed == [] and yaml.safe_load((tmp_path / "tuned" / "sensor.yaml").read_text()) == {}
    tune_stage.main(["sensor"])
    assert handed == [("sensor", [])]


def test_the_stage_writes_its_trials_best_first_and_the_best_settings(tmp_path, monkeypatch):
    """The whole study (trials as Prefect tasks, MLflow runs in a throwaway store): trials.json ranks the records,
    tuned/sensor.yaml holds the best trial's settings."""
    import mlflow
    from prefect import flow

    from flows.tuning import TrialRecord, tune

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    _write_params(tmp_path / "params.yaml", "sensor", {"trials": 3, "sampler": "grid", "pruner": "none",
                                                        "space": {"finetune.lr": {"choices": [0.01, 0.03, 0.02]}}})
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    params["sensor"]["finetune"]["epochs"] = 2
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "prepared" / "sensor").mkdir(parents=True)  # the data the stage's MLflow run names
    ranked = flow(lambda: tune(Curve(), str(tmp_path / "params.yaml")), name="tiny-tune")()
    assert all(isinstance(r, TrialRecord) for r in ranked)
    assert [r.params["finetune.lr"] for r in ranked] == [0.03, 0.02, 0.01]
    written = json.loads((tmp_path / "artifacts" / "sensor" / "tune" / "trials.json").read_text())
    assert written == [r.model_dump() for r in ranked] and written[0]["value"] == pytest.approx(3.0)
    assert {r["state"] for r in written} == {"complete"} and written[0]["epochs"] == 2
    assert yaml.safe_load((tmp_path / "tuned" / "sensor.yaml").read_text()) == {"finetune.lr": 0.03}
