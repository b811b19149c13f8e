"""params.yaml validation: unknown keys and wrong types are errors that name the key."""

from pathlib import Path

import pytest
import yaml

from flows.params import Params, ParamsError, load_params

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


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ParamsError, match="file not found"):
        load_params(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("sensor: [unclosed")
    with pytest.raises(ParamsError, match="not valid YAML"):
        load_params(bad)
