"""Embedded fleet simulator: labelled run-to-failure sensor data with known ground truth.

Why: the real datasets are small and fixed; the simulator gives any size, any seed, and knobs for the
failure modes a failure detector must survive (missing data, drift, regime changes, label noise).

What one machine's channel c looks like at step t (unitless signal z, then scaled to a level per channel):

* operating regimes: the machine switches at random times between a few load regimes, each shifting the channel levels;
* a daily cycle: a sinusoid with period `steps_per_day` and a random phase per machine and channel;
* sensor drift: a random walk with step sd `drift_std`; sensor noise: white noise with sd `noise_std`;
* degradation (failing machines only, `failure_fraction` of the fleet): from a random onset it grows like
  (exp(3 s) - 1) / (exp(3) - 1), s going 0 -> 1 at the failure step, in a subset of channels (vibration,
  temperature and current up, pressure and flow down; other channel names get a seeded random direction or none);
* dropouts: a NaN gap of 1-8 steps starts with probability `dropout_rate` per step and channel.

A failing machine's series ENDS at its failure step and only that last row has label 1; healthy machines run
`n_steps` with label 0. Windows are labelled later with a horizon (data/sensors/windows.py).
Label noise: `label_shift_max` moves the recorded failure (the end of the series and its label) by a random
offset in [-shift, +shift] relative to the physical failure (the degradation keeps growing past it);
`label_flip_rate` flips that share of row labels at random.
Drift (the monitoring scenario): `plant_seed` fixes the plant (channel levels, regime levels, daily amplitudes) so
fleets of other seeds are new machines of the same plant; `regime_shift` moves every regime's level, and
`failure_fraction` sets the failure prevalence.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from data.sensors.config import SimulatorConfig

_DEGRADATION_SIGN = {"vibration": 1.0, "temperature": 1.0, "current": 1.0, "pressure": -1.0, "flow": -1.0}
_N_REGIMES = 3
_MAX_GAP = 8


def _degradation_signs(channels: list[str], rng: np.random.Generator) -> np.ndarray:
    """(C,) direction of the degradation per channel: the known names, else a random -1, 0 or +1."""
    random_signs = rng.choice([-1.0, 0.0, 1.0], size=len(channels))
    return np.array([_DEGRADATION_SIGN.get(name, random_signs[i]) for i, name in enumerate(channels)])


def _regime_shifts(n_units: int, n_steps: int, n_channels: int, rng: np.random.Generator,
                   plant: np.random.Generator) -> np.ndarray:
    """(N, T, C) level shift of the current operating regime (levels drawn from the `plant`); switches about
    twice a day on average."""
    levels = plant.normal(0.0, 0.6, size=(_N_REGIMES, n_channels))
    switches = rng.random((n_units, n_steps)) < 1.0 / 48
    segment = np.cumsum(switches, axis=1)
    regime_of_segment = rng.integers(_N_REGIMES, size=(n_units, n_steps))
    return levels[np.take_along_axis(regime_of_segment, segment, axis=1)]


def _dropout_mask(shape: tuple[int, int, int], rate: float, rng: np.random.Generator) -> np.ndarray:
    """(N, T, C) bool, True inside a NaN gap of 1.._MAX_GAP steps that starts with probability `rate`."""
    starts = rng.random(shape) < rate
    lengths = np.where(starts, rng.integers(1, _MAX_GAP + 1, size=shape), 0)
    mask = np.zeros(shape, dtype=bool)
    for k in range(_MAX_GAP):
        mask[:, k:, :] |= lengths[:, : shape[1] - k, :] > k
    return mask


def simulate_fleet(cfg: SimulatorConfig, seed: int) -> pd.DataFrame:
    """Long frame of N machines: columns unit ("m000"...), time (step), one per cfg.channels, label (0/1)."""
    rng = np.random.default_rng(seed)
    plant = rng if cfg.plant_seed is None else np.random.default_rng(cfg.plant_seed)
    n, t_max, c = cfg.n_units, cfg.n_steps, len(cfg.channels)
    steps = np.arange(t_max)

    failing = np.zeros(n, dtype=bool)
    failing[rng.choice(n, size=max(1, round(cfg.failure_fraction * n)), replace=False)] = True
    failure = rng.integers(int(0.6 * t_max), t_max, size=n)
    duration = rng.integers(int(0.2 * t_max), int(0.5 * t_max), size=n)
    shift = rng.integers(-cfg.label_shift_max, cfg.label_shift_max + 1, size=n)
    end = np.where(failing, np.clip(failure + shift, 0, t_max - 1), t_max - 1)

    progress = np.clip((steps[None, :] - (failure - duration)[:, None]) / duration[:, None], 0.0, None)
    degradation = np.where(failing[:, None], np.expm1(3.0 * progress) / np.expm1(3.0), 0.0)
    severity = rng.uniform(0.5, 1.5, size=(n, 1, c)) * _degradation_signs(cfg.channels, rng)

    phase = rng.uniform(0, 2 * np.pi, size=(n, 1, c))
    daily = plant.uniform(0.2, 0.5, size=(1, 1, c)) * np.sin(2 * np.pi * steps[None, :, None] / cfg.steps_per_day + phase)
    drift = np.cumsum(rng.normal(0.0, cfg.drift_std, size=(n, t_max, c)), axis=1)
    noise = rng.normal(0.0, cfg.noise_std, size=(n, t_max, c))
    z = _regime_shifts(n, t_max, c, rng, plant) + cfg.regime_shift + daily + drift + noise + degradation[:, :, None] * severity

    level = 10.0 ** plant.uniform(0, 2, size=c)
    values = level * (1.0 + 0.1 * z)
    values[_dropout_mask(values.shape, cfg.dropout_rate, rng)] = np.nan

    label = (failing[:, None] & (steps[None, :] == end[:, None])).astype(np.int64)
    flips = rng.random(label.shape) < cfg.label_flip_rate
    label = np.where(flips, 1 - label, label)

    keep = steps[None, :] <= end[:, None]
    frame = pd.DataFrame(values[keep], columns=cfg.channels)
    frame.insert(0, "unit", np.repeat([f"m{i:03d}" for i in range(n)], end + 1))
    frame.insert(1, "time", np.broadcast_to(steps, (n, t_max))[keep])
    frame["label"] = label[keep]
    return frame
