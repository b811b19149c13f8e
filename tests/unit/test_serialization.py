"""Safe loading of the pipeline's .pt files: a planted pickle that would run code is refused at every entry point
(training checkpoint, pretrained model, fine-tuned ensemble of each family) without running, and the real
artifacts still survive a save and load."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from data.errors import DataValidationError
from data.molecules.featurize import featurize_smiles
from data.molecules.tokenizer import SmilesTokenizer
from data.sensors.featurize import WindowFeaturizer
from flows.molecule import artifacts as molecule_artifacts
from flows.sensor import artifacts as sensor_artifacts
from models.molecule.config import MoleculeModelConfig
from models.molecule.training import build_model
from models.sensor.config import SensorFinetuneConfig, SensorModelConfig
from models.sensor.network import SensorClassifier
from models.sensor.training import finetune_member
from models.serialization import UnsafeFileError, load_state, save_state

SENSOR_MODEL = SensorModelConfig(hidden=8, layers=1, attention_layers=0, projection=4, statistics_bins=0)
MOLECULE_MODEL = MoleculeModelConfig(hidden=16, layers=1, heads=2, smiles_layers=1, cross_layers=1)
TOKENIZER = SmilesTokenizer.build([featurize_smiles(s).smiles for s in ["CCO", "c1ccccc1", "CC(=O)O"]], max_length=16)


class RunsCode:
    """Unpickling it runs a shell command that creates `marker` (what a crafted .pt file does)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


def sensor_checkpoint_resume(path):
    windows = np.random.default_rng(0).normal(size=(8, 2, 16)).astype(np.float32)
    labels = np.array([0, 1] * 4)
    finetune_member(windows, labels, windows, labels, SENSOR_MODEL, SensorFinetuneConfig(epochs=1), None, seed=0,
                    device=torch.device("cpu"), checkpoint=path)


ENTRY_POINTS = {  # what loads the file -> the remedy its error names
    "training checkpoint": (sensor_checkpoint_resume, "delete it to train from scratch"),
    "sensor pretrained encoder": (sensor_artifacts.load_encoder, "dvc repro sensor_pretrain"),
    "sensor fine-tuned ensemble": (sensor_artifacts.load_ensemble, "dvc repro sensor_finetune"),
    "molecule pretrained model": (molecule_artifacts.load_pretrained, "dvc repro molecule_pretrain"),
    "molecule fine-tuned ensemble": (molecule_artifacts.load_ensemble, "dvc repro molecule_finetune"),
}


@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
def test_a_planted_pickle_is_refused_in_one_line_without_running(tmp_path, entry_point):
    load, remedy = ENTRY_POINTS[entry_point]
    marker, path = tmp_path / "ran", tmp_path / "artifacts" / "planted.pt"
    path.parent.mkdir()
    torch.save({"key": "", "encoder": RunsCode(marker), "members": [], "history": []}, path)
    planted = path.read_bytes()
    with pytest.raises(UnsafeFileError) as refused:
        load(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: refused to load: ") and "\n" not in message
    assert "posix.system" in message and remedy in message
    assert isinstance(refused.value, DataValidationError)  # a stage reports it as bad input: one line, exit 2
    assert not marker.exists()
    assert path.read_bytes() == planted  # left as found, for whoever looks into it


def sensor_members(count: int) -> list[SensorClassifier]:
    torch.manual_seed(0)
    return [SensorClassifier(4, SENSOR_MODEL) for _ in range(count)]


def test_sensor_ensemble_survives_save_and_load(tmp_path):
    members = sensor_members(2)
    featurizer = WindowFeaturizer(["temp", "vibration"]).fit(np.random.default_rng(1).normal(size=(10, 2, 16)))
    histories = [[{"epoch": 0, "train_loss": 0.5, "val_score": float("-inf")}], [{"epoch": 0, "train_loss": 0.25}]]
    path = tmp_path / "finetuned.pt"
    sensor_artifacts.save_ensemble(path, members, SENSOR_MODEL, featurizer, histories)

    loaded, loaded_featurizer, state = sensor_artifacts.load_ensemble(path)
    assert state["model"] == SENSOR_MODEL.model_dump() and state["histories"] == histories
    assert loaded_featurizer.channels == featurizer.channels
    np.testing.assert_array_equal(loaded_featurizer.mean, featurizer.mean)
    np.testing.assert_array_equal(loaded_featurizer.std, featurizer.std)
    for member, original in zip(loaded, members, strict=True):
        for name, tensor in original.state_dict().items():
            assert torch.equal(member.state_dict()[name], tensor), name


def test_sensor_encoder_survives_save_and_load_and_disabled_pretraining_gives_none(tmp_path):
    encoder = sensor_members(1)[0].state_dict()
    path = tmp_path / "pretrained.pt"
    save_state({"encoder": encoder, "model": SENSOR_MODEL.model_dump(), "history": []}, path)
    loaded = sensor_artifacts.load_encoder(path)
    assert loaded.keys() == encoder.keys() and all(torch.equal(loaded[k], v) for k, v in encoder.items())
    save_state({"encoder": None}, path)
    assert sensor_artifacts.load_encoder(path) is None


def test_molecule_ensemble_survives_save_and_load(tmp_path):
    torch.manual_seed(0)
    members = [build_model(len(TOKENIZER), TOKENIZER.max_length, MOLECULE_MODEL) for _ in range(2)]
    histories = [[{"epoch": 0, "train_loss": 1.5, "val_score": -0.75}]] * 2
    path = tmp_path / "finetuned.pt"
    molecule_artifacts.save_ensemble(path, members, MOLECULE_MODEL, "regression", -3.25, 2.0, histories, TOKENIZER)

    loaded, state = molecule_artifacts.load_ensemble(path)
    assert state["model"] == MOLECULE_MODEL.model_dump() and state["histories"] == histories
    assert (state["task"], state["target_mean"], state["target_std"]) == ("regression", -3.25, 2.0)
    assert SmilesTokenizer.from_dict(state["tokenizer"]).to_dict() == TOKENIZER.to_dict()
    for member, original in zip(loaded, members, strict=True):
        for name, tensor in original.state_dict().items():
            assert torch.equal(member.state_dict()[name], tensor), name


def test_saving_anything_but_tensors_and_plain_data_fails_naming_where_and_writes_nothing(tmp_path):
    path = tmp_path / "finetuned.pt"
    history = [{"epoch": 0, "val_score": np.float64(0.5)}]  # a numpy scalar would need a numpy global to load
    with pytest.raises(TypeError, match=r"state\['histories'\]\[0\]\[0\]\['val_score'\] is a numpy\.float64"):
        save_state({"histories": [history]}, path)
    assert not path.exists() and not list(tmp_path.iterdir())


def test_save_state_writes_what_torch_loads_with_weights_only(tmp_path):
    state = {"weights": torch.arange(3.0), "betas": (0.9, 0.999), "names": ["a"], "none": None, 3: True}
    save_state(state, tmp_path / "state.pt")
    for loaded in (load_state(tmp_path / "state.pt", "unused"), torch.load(tmp_path / "state.pt", weights_only=True)):
        assert loaded.keys() == state.keys() and torch.equal(loaded["weights"], state["weights"])
        assert [loaded[k] for k in ("betas", "names", "none", 3)] == [(0.9, 0.999), ["a"], None, True]
