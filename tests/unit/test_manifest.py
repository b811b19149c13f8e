"""Signed manifests (contract/manifest.py) and task identities (contract/card.py)."""

from __future__ import annotations

import json
import stat

import pytest

from contract.card import CardError, describe_identity, read_card, task_identity, write_card
from contract.manifest import (MANIFEST, SIGNATURE, ManifestError, key_id, load_signing_key, load_verify_key,
                               public_key_path, sign_directory, verify_directory)

SENSOR_CARD = {"family": "sensor", "task": "classification", "target": "failure within 48 steps",
               "channels": ["a", "b", "c"], "window": 32, "threshold": 0.4, "featurizer": {}}


@pytest.fixture
def key(tmp_path):
    return load_signing_key(tmp_path / "keys" / "signing.key")


@pytest.fixture
def folder(tmp_path, key):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"\x08\x09onnx bytes")
    write_card(folder, SENSOR_CARD)
    (folder / "sub").mkdir()
    (folder / "sub" / "extra.txt").write_text("x")
    sign_directory(folder, key)
    return folder


def test_a_new_key_pair_is_private_and_reloads(tmp_path, key):
    path = tmp_path / "keys" / "signing.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert key_id(load_signing_key(path, create=False).public_key()) == key_id(key.public_key())
    assert key_id(load_verify_key(public_key_path(path))) == key_id(key.public_key())
    with pytest.raises(ManifestError, match="no signing key"):
        load_signing_key(tmp_path / "other.key", create=False)
    with pytest.raises(ManifestError, match="no public key at"):
        load_verify_key(tmp_path / "missing.pub")


def test_a_signed_folder_verifies_and_lists_every_file(folder, key):
    manifest = verify_directory(folder, key.public_key())
    assert set(manifest["files"]) == {"model.onnx", "card.json", "sub/extra.txt"}
    assert manifest["key_id"] == key_id(key.public_key())
    assert read_card(folder)["threshold"] == 0.4


def test_an_edited_card_is_refused(folder, key):
    card = json.loads((folder / "card.json").read_text())
    card["threshold"] = 0.999999
    (folder / "card.json").write_text(json.dumps(card))
    with pytest.raises(ManifestError, match=r"card.json has sha256 .* its signed manifest says"):
        verify_directory(folder, key.public_key())


@pytest.mark.parametrize("change, message", [
    (lambda f: (f / "model.onnx").unlink(), "model.onnx is listed in its signed manifest but missing"),
    (lambda f: (f / "planted.py").write_text("import os"), "planted.py is not in its signed manifest"),
    (lambda f: (f / SIGNATURE).unlink(), "no signed manifest"),
])
def test_a_missing_or_added_file_is_refused(folder, key, change, message):
    change(folder)
    with pytest.raises(ManifestError, match=message):
        verify_directory(folder, key.public_key())


def test_an_edited_manifest_or_another_key_is_refused(folder, key, tmp_path):
    other = load_signing_key(tmp_path / "other.key")
    with pytest.raises(ManifestError, match=f"not valid for the trusted key {key_id(other.public_key())}"):
        verify_directory(folder, other.public_key())
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"]["card.json"] = "0" * 64  # re-pointing the manifest breaks its signature
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    with pytest.raises(ManifestError, match="signature is not valid"):
        verify_directory(folder, key.public_key())


def test_a_card_must_exist_and_parse(tmp_path):
    with pytest.raises(CardError, match="no model card"):
        read_card(tmp_path)
    (tmp_path / "card.json").write_text("{not json")
    with pytest.raises(CardError, match="not valid JSON"):
        read_card(tmp_path)


def test_task_identity_tells_tasks_apart():
    same = task_identity({**SENSOR_CARD, "threshold": 0.9, "test_metrics": {"pr_auc": 0.5}})
    assert task_identity(SENSOR_CARD) == same
    assert task_identity({**SENSOR_CARD, "channels": ["a"]}) != same
    assert task_identity({**SENSOR_CARD, "window": 48}) != same
    assert task_identity({**SENSOR_CARD, "target": "failure within 30 steps"}) != same
    molecule = {"family": "molecule", "task": "regression", "target": "solubility", "featurizer_version": 5,
                "tokenizer": {}}
    assert task_identity(molecule) != task_identity({**molecule, "target": "logD"})
    with pytest.raises(CardError, match="target: Field required"):
        task_identity({k: v for k, v in molecule.items() if k != "target"})
    assert describe_identity(same) == "sensor classification of 'failure within 48 steps' from 3 channels (a, b, c), window 32"
    assert describe_identity(task_identity(molecule)) == "molecule regression of 'solubility'"
