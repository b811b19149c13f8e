"""The sensor family's calibration (flows/stages/calibrate.py): temperature scaling or isotonic regression (the
better by cross-fitted validation NLL) and the alert threshold, all fitted on validation; with `mask_passes`, on every
member's fixed-mask MC-dropout passes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from flows import plots
from flows.paths import StagePaths
from flows.sensor.artifacts import load_ensemble
from flows.sensor.windows import load_windows
from flows.tasks import compute_task
from models.calibration import binary_nll, choose_threshold, ensemble_probability, select_calibration
from models.device import pick_device
from models.metrics import expected_calibration_error
from models.sensor.training import ensemble_logits


@compute_task(name="member-logits")
def member_logits(members, features: np.ndarray, mask_passes: int = 0, mask_seed: int = 0) -> np.ndarray:
    """(n, F, T) -> (n, members), or (n, members * mask_passes) with fixed-mask passes (the exported graph's)."""
    return ensemble_logits(members, features, pick_device(), mask_passes, mask_seed)


def calibrate(cfg, paths: StagePaths) -> tuple[dict, list[Path], str]:
    """Choose and fit the calibration of `cfg.calibrate` on validation and pick the alert threshold for
    `target_precision`; the reliability diagram before and after."""
    settings = cfg.calibrate
    members, featurizer, _ = load_ensemble(paths.finetuned)
    prepared = load_windows()
    val = prepared.windows["val"]
    logits = member_logits(members, prepared.features(featurizer, "val"), settings.mask_passes, settings.mask_seed)
    calibration, cv_nll = select_calibration(logits, val.y, val.unit, settings.methods)
    before, after = ensemble_probability(logits), calibration.probability(logits)
    threshold = choose_threshold(val.y, after, settings.target_precision)
    result = {
        **calibration.to_dict(),
        "threshold": threshold,
        "target_precision": settings.target_precision,
        "cv_nll": cv_nll,
        "val_nll_before": binary_nll(val.y, before),
        "val_nll_after": binary_nll(val.y, after),
        "val_ece_before": expected_calibration_error(val.y, before),
        "val_ece_after": expected_calibration_error(val.y, after),
        # the sub-networks novelty and export build again
        "mask_passes": settings.mask_passes, "mask_seed": settings.mask_seed,
    }
    figure = plots.reliability_diagram(val.y, {"before": before, f"after {calibration.method}": after},
                                       paths.plots / "reliability_val.png")
    return result, [figure], (f"{calibration.method} (cross-fitted NLL {cv_nll}), threshold={threshold:.3f}, "
                              f"validation ECE {result['val_ece_before']:.4f} -> {result['val_ece_after']:.4f}")
