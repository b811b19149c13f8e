"""The UI's run parameters as params.yaml keys, checked before anything is written."""

from pathlib import Path

import pytest

from flows.orchestration import check_sources, family_overrides
from flows.params import ParamsError, load_params, with_overrides

PROJECT = Path(__file__).resolve().parents[2]


def test_ui_parameters_map_to_the_familys_keys_and_overrides_win():
    keys = family_overrides("sensor", "cmapss", "train_FD001.txt", 4, 7, {"sensor.finetune.epochs": 9})
    assert keys == {"sensor.data.path": "train_FD001.txt", "sensor.data.source": "cmapss",
                    "sensor.finetune.epochs": 9, "sensor.data.seed": 7, "sensor.pretrain.seed": 7,
                    "sensor.finetune.seed": 7}
    assert family_overrides("molecule", "file", "mols.csv", None, None, None) == {
        "molecule.data.path": "mols.csv", "molecule.data.source": "file"}
    assert family_overrides("sensor", None, None, None, None, None) == {}


def test_every_mapped_key_exists_in_params():
    params = load_params(PROJECT / "params.yaml")
    for family in ("sensor", "molecule"):
        with_overrides(params, family_overrides(family, None, None, 2, 3, None))  # raises on an unknown key


def test_a_data_path_without_a_file_source_is_refused():
    params = load_params(PROJECT / "params.yaml")
    with pytest.raises(ParamsError, match="sensor.data.path is set but sensor.data.source is 'simulator'"):
        check_sources(with_overrides(params, family_overrides("sensor", None, "fleet.csv", None, None, None)))
    check_sources(with_overrides(params, family_overrides("molecule", "file", "mols.csv", None, None, None)))
