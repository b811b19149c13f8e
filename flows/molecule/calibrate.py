"""The molecule family's calibration (flows/stages/calibrate.py): uncertainty calibration on validation (interval
scale or temperature)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from data.molecules.tokenizer import SmilesTokenizer
from flows.molecule.artifacts import featurize, load_ensemble
from flows.molecule.splits import load_molecules, targets
from flows.paths import StagePaths
from flows.tasks import compute_task
from models.calibration import IntervalCalibrator, TemperatureCalibration, calibrator_class, ensemble_probability
from models.device import pick_device
from models.metrics import expected_calibration_error
from models.molecule.training import ensemble_raw


@compute_task(name="member-outputs")
def member_outputs(members, molecules, mask_passes: int, mask_seed: int) -> np.ndarray:
    """(n, samples) raw outputs: one per member, or with fixed-mask passes `mask_passes` per member (in the order
    of the exported graph: member by member)."""
    return ensemble_raw(members, molecules, pick_device(), mask_passes, mask_seed)


def calibrate(cfg, paths: StagePaths) -> tuple[dict, list[Path], str]:
    """Regression: scale the ensemble spread so validation z-scores have unit variance (scaled_variance) or so
    that value +- z * uncertainty is a split-conformal interval (conformal). Classification: temperature scaling
    on validation NLL."""
    settings = cfg.calibrate
    members, state = load_ensemble(paths.finetuned)
    prepared = load_molecules()
    tokenizer = SmilesTokenizer.from_dict(state["tokenizer"])
    raw = member_outputs(members, featurize(list(prepared.splits["val"]["smiles"]), tokenizer,
                                           cfg.data.max_heavy_atoms), settings.mask_passes, settings.mask_seed)
    y = targets(prepared, "val")
    if state["task"] == "regression":
        values = state["target_mean"] + state["target_std"] * raw
        mean, spread = values.mean(axis=1), values.std(axis=1)
        interval = calibrator_class(settings.method, IntervalCalibrator).fit(y - mean, spread, settings.interval_z)
        result = {**interval.to_dict(),
                  "val_coverage": float(np.mean(np.abs(y - mean) <= interval.half_width(spread)))}
    else:
        temperature = TemperatureCalibration.fit(raw, y)
        result = {**temperature.to_dict(),
                  "val_ece_before": expected_calibration_error(y, ensemble_probability(raw)),
                  "val_ece_after": expected_calibration_error(y, temperature.probability(raw))}
    result.update(mask_passes=settings.mask_passes, mask_seed=settings.mask_seed)  # the sub-networks export builds again
    return result, [], str(result)
