"""params.yaml validation: unknown keys and wrong types are errors that name the key."""

import difflib
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from flows.params import Params, ParamsError, load_params, with_overrides, write_overrides

PROJECT = Path(__file__).resolve().parents[2]


def write(tmp_path, data) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_project_params_file_is_valid_and_complete():
    params = load_params(PROJECT / "params.yaml")
    assert params.sensor.data.source == "simulator"
    assert params.molecule.data.source == "solubility"
    raw = yaml.safe_load((PROJECT / "params.yaml").read_text())
    assert set(raw) == set(Params.model_fields)


def settings(section: BaseModel, prefix: str = "") -> dict[str, object]:
    """Every setting of a params section by its dotted key (a mapping-valued setting, such as a loss's terms or a
    tune space, is one setting)."""
    out = {}
    for name in type(section).model_fields:
        value = getattr(section, name)
        out.update(settings(value, f"{prefix}{name}.") if isinstance(value, BaseModel) else {f"{prefix}{name}": value})
    return out


def written(raw: dict, key: str) -> bool:
    node = raw
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_params_yaml_states_every_setting_at_the_classes_default():
    """One source of defaults: the config classes' defaults are params.yaml's values, key by key, and params.yaml
    writes every key out."""
    defaults, shipped = settings(Params()), settings(load_params(PROJECT / "params.yaml"))
    raw = yaml.safe_load((PROJECT / "params.yaml").read_text())
    assert [key for key in defaults if not written(raw, key)] == [], "settings missing from params.yaml"
    differ = {key: {"params.yaml": shipped[key], "class default": value}
              for key, value in defaults.items() if shipped[key] != value}
    assert differ == {}, "class defaults that differ from params.yaml"


def test_a_partial_params_file_takes_params_yaml_s_values_for_what_it_omits(tmp_path):
    partial = load_params(write(tmp_path, {"sensor": {"finetune": {"epochs": 3}}, "molecule": {"data": {"seed": 2}}}))
    shipped = load_params(PROJECT / "params.yaml")
    assert partial == with_overrides(shipped, {"sensor.finetune.epochs": 3, "molecule.data.seed": 2})
    assert load_params(write(tmp_path, {})) == shipped


def test_unknown_key_is_named(tmp_path):
    with pytest.raises(ParamsError, match=r"sensor\.finetune\.epochz: Extra inputs are not permitted"):
        load_params(write(tmp_path, {"sensor": {"finetune": {"epochz": 3}}}))


def test_wrong_type_is_named(tmp_path):
    with pytest.raises(ParamsError, match=r"molecule\.data\.train_fraction: Input should be a valid number"):
        load_params(write(tmp_path, {"molecule": {"data": {"train_fraction": "most"}}}))


def test_out_of_range_value_is_named(tmp_path):
    with pytest.raises(ParamsError, match=r"sensor\.data\.window"):
        load_params(write(tmp_path, {"sensor": {"data": {"window": 1}}}))


def test_every_bad_key_is_listed_with_the_file(tmp_path):
    path = write(tmp_path, {"sensor": {"model": {"hidden": "wide"}}, "tracking": {"url": "x"}})
    with pytest.raises(ParamsError) as error:
        load_params(path)
    message = str(error.value)
    assert str(path) in message and "sensor.model.hidden" in message and "tracking.url" in message


def test_file_source_needs_a_path(tmp_path):
    with pytest.raises(ParamsError, match="sensor.data.path is required"):
        load_params(write(tmp_path, {"sensor": {"data": {"source": "file"}}}))


def test_the_registry_gate_follows_the_task(tmp_path):
    """A classification molecule dataset is judged by PR-AUC, higher better; regression by RMSE, lower better."""
    classification = load_params(write(tmp_path, {"molecule": {"data": {"task": "classification"}}}))
    assert (classification.molecule.registry.metric, classification.molecule.registry.direction) == ("pr_auc", "max")
    shipped = load_params(PROJECT / "params.yaml")
    assert (shipped.molecule.registry.metric, shipped.molecule.registry.direction) == ("rmse", "min")
    assert (shipped.sensor.registry.metric, shipped.sensor.registry.direction) == ("pr_auc", "max")
    assert shipped.molecule.registry.primary_metric is None  # as written: a task set later still chooses
    chosen = load_params(write(tmp_path, {"molecule": {"data": {"task": "classification"},
                                                        "registry": {"model_name": "bbb", "primary_metric": "roc_auc"}}}))
    assert (chosen.molecule.registry.metric, chosen.molecule.registry.direction) == ("roc_auc", "max")
    assert with_overrides(shipped, {"molecule.data.task": "classification"}).molecule.registry.metric == "pr_auc"


@pytest.mark.parametrize(("registry", "message"), [
    ({"primary_metric": "rmse"}, "registry.primary_metric is 'rmse', which a classification model does not report"),
    ({"primary_metric": "roc_auc", "mode": "min"}, "registry.mode is 'min', but a higher roc_auc is better"),
])
def test_a_gate_metric_the_task_cannot_judge_stops_at_load(tmp_path, registry, message):
    with pytest.raises(ParamsError, match=message):
        load_params(write(tmp_path, {"molecule": {"data": {"task": "classification"},
                                                   "registry": {"model_name": "bbb", **registry}}}))


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ParamsError, match="file not found"):
        load_params(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("sensor: [unclosed")
    with pytest.raises(ParamsError, match="not valid YAML"):
        load_params(bad)


def test_write_overrides_sets_keys_and_keeps_comments(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text((PROJECT / "params.yaml").read_text())
    params = write_overrides(path, {"sensor.finetune.epochs": 3, "sensor.finetune.seed": 7, "molecule.data.path": "m.csv"})
    assert (params.sensor.finetune.epochs, params.sensor.finetune.seed) == (3, 7)
    reloaded = load_params(path)
    assert (reloaded.sensor.finetune.epochs, reloaded.sensor.finetune.seed, str(reloaded.molecule.data.path)) == (3, 7, "m.csv")
    text = path.read_text()
    assert "# The single source of truth" in text and "# time steps per window" in text
    diff = difflib.unified_diff((PROJECT / "params.yaml").read_text().splitlines(), text.splitlines(), lineterm="")
    added = [line for line in diff if line.startswith("+") and not line.startswith("+++")]
    assert len(added) == 3  # epochs, the new seed line, path: nothing else reformatted


@pytest.mark.parametrize("overrides, message", [
    ({"sensor.finetune.epochz": 3}, "unknown parameter 'sensor.finetune.epochz'"),
    ({"sensor.finetune.epochs": "many"}, r"sensor\.finetune\.epochs: Input should be a valid integer"),
    ({"orchestration.schedules.retrain": "61 * * * *"}, "Invalid cron string"),
])
def test_bad_override_is_named_and_leaves_the_file_untouched(tmp_path, overrides, message):
    path = tmp_path / "params.yaml"
    path.write_text((PROJECT / "params.yaml").read_text())
    with pytest.raises(ParamsError, match=message):
        write_overrides(path, overrides)
    assert path.read_text() == (PROJECT / "params.yaml").read_text()


def test_with_overrides_leaves_the_original_alone():
    params = load_params(PROJECT / "params.yaml")
    changed = with_overrides(params, {"sensor.model.hidden": 48})
    assert changed.sensor.model.hidden == 48 and params.sensor.model.hidden != 48


def test_schedules_are_checked_by_prefects_cron_and_timezone(tmp_path):
    with pytest.raises(ParamsError, match=r"orchestration\.schedules.*retrain: Invalid cron string"):
        load_params(write(tmp_path, {"orchestration": {"schedules": {"retrain": "0 3 * *"}}}))
    with pytest.raises(ParamsError, match="Invalid timezone"):
        load_params(write(tmp_path, {"orchestration": {"schedules": {"timezone": "Mars/Olympus"}}}))
    schedules = load_params(write(tmp_path, {"orchestration": {"schedules": {"data_refresh": None}}})).orchestration.schedules
    assert schedules.schedule("data_refresh") is None and schedules.schedule("retrain").cron == "0 3 * * 0"


def test_a_tune_space_says_what_is_wrong_with_each_dimension(tmp_path):
    def tune(**cfg):
        return load_params(write(tmp_path, {"molecule": {"tune": {"space": {}, **cfg}}})).molecule.tune

    with pytest.raises(ParamsError, match="finetune.lr: Value error, give either `choices` or both"):
        tune(space={"finetune.lr": {"low": 0.001}})
    with pytest.raises(ParamsError, match=r"low \(0.01\) must be below high"):
        tune(space={"finetune.lr": {"low": 0.01, "high": 0.001}})
    with pytest.raises(ParamsError, match="a log-scale range needs low > 0"):
        tune(space={"model.dropout": {"low": 0.0, "high": 0.3, "log": True}})
    with pytest.raises(ParamsError, match=r"`finetune\.\*` and `model\.\*` keys only, not \['data.seed'\]"):
        tune(space={"data.seed": {"choices": [1, 2]}})
    with pytest.raises(ParamsError, match=r"grid sampler needs `choices` for every key; ranges: \['finetune.lr'\]"):
        tune(sampler="grid", space={"finetune.lr": {"low": 0.001, "high": 0.01}, "model.dropout": {"choices": [0.1]}})
    with pytest.raises(ParamsError, match="trials > 0 needs a non-empty `space`"):
        tune(trials=3)
    grid = tune(sampler="grid", space={"finetune.lr": {"choices": [0.001, 0.003]}, "model.hidden": {"choices": [8, 16, 32]}})
    assert grid.grid_size() == 6 and grid.trials == 0  # off unless asked for


def test_the_tuned_file_goes_on_top_of_params_and_a_bad_key_names_the_file(tmp_path):
    from flows.params import with_tuned

    params = load_params(write(tmp_path, {}))
    assert with_tuned(params, "sensor", tmp_path)[1] == {}  # no tuned file: params as they are
    (tmp_path / "tuned").mkdir()
    (tmp_path / "tuned" / "sensor.yaml").write_text("# written by the sensor_tune stage\n{}\n")
    assert with_tuned(params, "sensor", tmp_path)[0] == params
    (tmp_path / "tuned" / "sensor.yaml").write_text("finetune.lr: 0.0007\nfinetune.loss.terms: {gce: 1.0}\n")
    tuned, keys = with_tuned(params, "sensor", tmp_path)
    assert tuned.sensor.finetune.lr == 0.0007 and tuned.sensor.finetune.loss.terms == {"gce": 1.0}
    assert keys == {"finetune.lr": 0.0007, "finetune.loss.terms": {"gce": 1.0}}
    assert tuned.molecule == params.molecule and tuned.sensor.model == params.sensor.model
    (tmp_path / "tuned" / "sensor.yaml").write_text("finetune.lrr: 0.0007\n")
    with pytest.raises(ParamsError, match=r"tuned/sensor.yaml: unknown parameter 'sensor.finetune.lrr'"):
        with_tuned(params, "sensor", tmp_path)
    (tmp_path / "tuned" / "sensor.yaml").write_text("- 1\n")
    with pytest.raises(ParamsError, match="must be a mapping of dotted keys"):
        with_tuned(params, "sensor", tmp_path)


def test_the_params_reference_documents_every_setting():
    """docs/reference/params.md has a table row for every setting, under its section's heading."""
    reference = (PROJECT / "docs" / "reference" / "params.md").read_text()
    sections = {heading: body for heading, body in
                (part.split("`\n", 1) for part in reference.split("\n### `")[1:])}
    missing = [key for key in settings(Params())
               if f"| `{key.rsplit('.', 1)[1]}` |" not in sections.get(key.rsplit(".", 1)[0], "")]
    assert missing == [], "settings without a row in docs/reference/params.md"


def test_the_services_monitoring_thresholds_default_to_params_yaml_s_monitor_section():
    """The service reads no params file, so its SERVING_MONITOR_* defaults must be the `monitor` section's values:
    a threshold changed in one place only fails here, naming it."""
    from serving.settings import ServingSettings

    monitor = yaml.safe_load((PROJECT / "params.yaml").read_text())["monitor"]
    service = ServingSettings.model_fields
    shared = {"window": "monitor_outcome_window", "drift_window": "monitor_drift_window",
              "min_outcomes": "monitor_min_items", **{key: f"monitor_{key}" for key in
                                                      ("max_ece", "max_coverage_error", "max_psi", "min_similarity",
                                                       "max_out_of_domain")}}
    differing = {key: (monitor[key], service[field].default) for key, field in shared.items()
                 if monitor[key] != service[field].default}
    assert not differing, f"params.yaml monitor.<key> vs the service's default: {differing}"
