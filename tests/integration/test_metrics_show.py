"""`dvc metrics show` on the project's dvc.yaml lists one row per family and model, a few columns each."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from flows.json_io import write_metrics_by_model
from flows.paths import StagePaths
from models.metrics import classification_metrics, regression_metrics
from tests.integration.workspace import BIN, PROJECT

pytestmark = pytest.mark.integration


def dvc(root, *args: str) -> str:
    return subprocess.run([str(BIN / "dvc"), *args], cwd=root, check=True, capture_output=True, text=True,
                          env={"DVC_NO_ANALYTICS": "1", "PATH": str(BIN)}).stdout


def test_metrics_show_has_a_row_per_model_and_a_narrow_table_per_family(tmp_path):
    shutil.copy(PROJECT / "dvc.yaml", tmp_path / "dvc.yaml")
    (tmp_path / ".dvc").mkdir()
    (tmp_path / ".dvc" / "config").write_text("[core]\n    no_scm = true\n")
    rng = np.random.default_rng(0)
    y, p = rng.integers(0, 2, 200), rng.random(200)
    classified = classification_metrics(y, p, 0.5)
    regressed = regression_metrics(rng.normal(size=50), rng.normal(size=50), lower=-np.ones(50), upper=np.ones(50))
    sensor, molecule = StagePaths("sensor", tmp_path), StagePaths("molecule", tmp_path)
    (sensor.test_metrics / "old_baseline.json").parent.mkdir(parents=True)
    (sensor.test_metrics / "old_baseline.json").write_text("{}")  # from an earlier run: removed
    write_metrics_by_model(sensor.test_metrics, {"ours": classified, "hist_gradient_boosting": classified,
                                                 "minirocket": {**classified, "name": "minirocket"}})
    write_metrics_by_model(molecule.test_metrics, {"ours": regressed, "random_forest_morgan": regressed})

    shown = json.loads(dvc(tmp_path, "metrics", "show", "--json"))
    (revision,) = shown.values()  # the workspace (named "" before the first commit)
    files = {path: data["data"] for path, data in revision["data"].items()}
    assert sorted(files) == ["metrics/molecule/ours.json", "metrics/molecule/random_forest_morgan.json",
                             "metrics/sensor/hist_gradient_boosting.json", "metrics/sensor/minirocket.json",
                             "metrics/sensor/ours.json"]
    assert files["metrics/sensor/ours.json"] == pytest.approx(classified)
    assert files["metrics/sensor/minirocket.json"] == pytest.approx(classified)  # numbers only
    assert set(files["metrics/molecule/ours.json"]) == {"rmse", "mae", "r2", "coverage", "interval_width"}
    for family in ("sensor", "molecule"):
        table = dvc(tmp_path, "metrics", "show", f"metrics/{family}").splitlines()
        assert len(table) == 1 + (3 if family == "sensor" else 2)
        assert max(len(line) for line in table) <= 110, "\n".join(table)
