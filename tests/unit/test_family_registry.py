"""The registry of model families (flows/family.py): each line names a module whose FAMILY implements the family
under that name, and an unregistered name is refused, by the lookup and by a stage's command line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flows.family import FAMILIES, PipelineFamily, UnknownFamilyError, pipeline_family


def test_every_registered_family_is_a_pipeline_family_of_its_name():
    for name in FAMILIES:
        family = pipeline_family(name)
        assert isinstance(family, PipelineFamily) and family.name == name
        assert family.paths.prepared.parts[-2:] == ("prepared", name)


def test_a_family_registered_at_run_time_is_found(monkeypatch):
    monkeypatch.setitem(FAMILIES, "tabular", "tests.families.tabular.family")
    assert pipeline_family("tabular").name == "tabular"


def test_an_unregistered_family_is_refused_by_name(tmp_path):
    with pytest.raises(UnknownFamilyError, match="no model family 'tabular' \\(registered: sensor, molecule\\)"):
        pipeline_family("tabular")
    result = subprocess.run([sys.executable, "-m", "flows.stages.register", "tabular"], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 2 and "no model family 'tabular'" in result.stderr
