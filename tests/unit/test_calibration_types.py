"""The typed calibrations (models/calibration.py): today's JSON forms read and write back unchanged, unknown or
incomplete calibrations are refused, a new kind needs only its registration, and reading one needs neither torch,
scipy nor scikit-learn (serving installs without them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
from pydantic import BaseModel, ValidationError

from models import calibration
from models.calibration import (Calibration, ConformalCalibration, IntervalScaleRecalibration, IsotonicCalibration,
                                ProbabilityCalibrator, ScaledVarianceCalibration, TemperatureCalibration,
                                calibrated_probability, parse_calibration)

PROJECT = Path(__file__).resolve().parents[2]

# the forms the calibrate stages and the monitor's recalibration write (calibration.json, a card's `calibration` and
# `recalibrations`), with the keys each writes next to the parameters
WRITTEN = {
    TemperatureCalibration: {"method": "temperature", "temperature": 1.37, "threshold": 0.42, "target_precision": 0.8,
                             "cv_nll": {"temperature": 0.21, "isotonic": 0.23}, "val_nll_before": 0.3,
                             "val_nll_after": 0.2, "val_ece_before": 0.05, "val_ece_after": 0.01, "mask_passes": 0,
                             "mask_seed": 0},
    IsotonicCalibration: {"method": "isotonic", "temperature": 1.0, "knots_x": [0.0, 0.31, 1.0],
                          "knots_y": [0.0005, 0.2, 0.9995], "threshold": 0.5, "cv_nll": {}, "mask_passes": 2,
                          "mask_seed": 0},
    ScaledVarianceCalibration: {"method": "scaled_variance", "scale": 1.21, "interval_z": 1.96,
                                "nominal_coverage": 0.9500042097035593, "val_coverage": 0.93, "mask_passes": 0,
                                "mask_seed": 0},
    ConformalCalibration: {"method": "conformal", "scale": 1.4, "interval_z": 1.645, "nominal_coverage": 0.9,
                           "val_coverage": 0.91, "mask_passes": 0, "mask_seed": 0},
    IntervalScaleRecalibration: {"method": "interval_scale", "factor": 1.7},
}


class Card(BaseModel):
    calibration: Calibration
    recalibrations: list[Calibration] = []


@pytest.mark.parametrize("kind", list(WRITTEN), ids=lambda kind: kind.__name__)
def test_written_calibrations_read_into_their_class_and_write_back_byte_for_byte(kind):
    written = WRITTEN[kind]
    card = Card.model_validate_json(json.dumps({"calibration": written, "recalibrations": [written]}))
    assert type(card.calibration) is kind and type(card.recalibrations[0]) is kind
    assert json.loads(card.model_dump_json()) == {"calibration": written, "recalibrations": [written]}
    assert json.dumps(parse_calibration(written).to_dict(), sort_keys=True) == json.dumps(written, sort_keys=True)


def test_a_fitted_calibration_has_the_form_the_stages_wrote_before():
    rng = np.random.default_rng(0)
    logits, y = rng.normal(size=(200, 2)), rng.integers(0, 2, 200)
    assert set(IsotonicCalibration.fit(logits, y).to_dict()) == {"method", "temperature", "knots_x", "knots_y"}
    assert IsotonicCalibration.fit(logits, y).temperature == 1.0
    assert set(ConformalCalibration.fit(rng.normal(size=50), np.ones(50), 1.96).to_dict()) == {
        "method", "scale", "interval_z", "nominal_coverage"}
    fitted = TemperatureCalibration.fit(logits, y).with_extra(cv_nll={"temperature": 0.7})
    assert fitted.to_dict()["cv_nll"] == {"temperature": 0.7}
    assert np.array_equal(calibrated_probability(logits, fitted.to_dict()), fitted.probability(logits))


@pytest.mark.parametrize("bad", [{"method": "platt", "a": 1.0}, {"temperature": 1.0},
                                 {"method": "temperature"}, {"method": "isotonic", "knots_x": [0.0, 1.0]},
                                 {"method": "temperature", "temperature": "hot"}, ["temperature", 1.0]])
def test_an_unknown_or_incomplete_calibration_is_refused(bad):
    with pytest.raises(ValidationError):
        Card(calibration=bad)


def test_a_calibration_that_maps_no_probability_is_refused_where_one_is_needed():
    with pytest.raises(ValueError, match="maps no probability"):
        calibrated_probability(np.zeros((3, 2)), WRITTEN[ScaledVarianceCalibration])
    with pytest.raises(ValueError, match="unknown calibration method 'conformal' \\(temperature \\| isotonic\\)"):
        calibration.select_calibration(np.zeros((4, 1)), np.array([0, 1, 0, 1]), None, ["conformal"])


def test_a_new_kind_is_read_once_registered(monkeypatch):
    monkeypatch.setattr(calibration, "CALIBRATORS", dict(calibration.CALIBRATORS))

    @calibration.register
    class Shift(ProbabilityCalibrator):
        method: Literal["shift"] = "shift"
        offset: float

        def probability(self, logits: np.ndarray) -> np.ndarray:
            return calibration.ensemble_probability(np.asarray(logits) + self.offset)

    card = Card(calibration={"method": "shift", "offset": 2.0, "threshold": 0.5})
    assert isinstance(card.calibration, Shift) and card.model_dump()["calibration"]["threshold"] == 0.5
    assert calibrated_probability(np.zeros((1, 1)), card.calibration)[0] == pytest.approx(1 / (1 + np.exp(-2.0)))


def test_reading_a_calibration_needs_neither_torch_scipy_nor_scikit_learn():
    """What serving imports to read a card (models/predictors.py, models/calibration.py) with those three blocked."""
    probe = ("import importlib.abc, json, sys\n"
             "class Block(importlib.abc.MetaPathFinder):\n"
             "    def find_spec(self, name, path, target=None):\n"
             "        if name.split('.')[0] in {'torch', 'scipy', 'sklearn'}:\n"
             "            raise ImportError(name)\n"
             "sys.meta_path.insert(0, Block())\n"
             "import models.predictors\n"
             "from models.calibration import parse_calibration\n"
             "print(type(parse_calibration(json.loads(sys.argv[1]))).__name__)\n")
    written = json.dumps(WRITTEN[ConformalCalibration])
    result = subprocess.run([sys.executable, "-c", probe, written], cwd=PROJECT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ConformalCalibration"
