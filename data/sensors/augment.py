"""Time-series augmentations for contrastive pretraining (numpy, seeded, no torch).

Every function takes featurised windows x (n, 2C, T) -- C standardised channels (0 where missing),
then C observed-masks (1.0 observed, 0.0 missing), see featurize.py -- and a numpy Generator, and
returns a new float32 array of the same shape. Value augmentations (jitter, scaling, magnitude warp,
frequency noise) leave the masks alone and keep missing values at 0; time augmentations (time warp,
crop) move values and masks together: a resampled step is observed only when the step it comes from
is (linear interpolation between two observed neighbours, the nearest neighbour otherwise).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy.interpolate import CubicSpline


def _split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 3 or x.shape[1] % 2:
        raise ValueError(f"expected featurised windows (n, 2C, T), got shape {x.shape}")
    c = x.shape[1] // 2
    return x[:, :c], x[:, c:], c


def _join(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.concatenate([np.where(mask > 0.5, values, 0.0), mask], axis=1).astype(np.float32)


def _smooth_curves(rng: np.random.Generator, shape: tuple[int, ...], length: int, sigma: float, knots: int) -> np.ndarray:
    """Random smooth curves around 1: a cubic spline through knots ~ N(1, sigma). shape + (length,)."""
    knot_x = np.linspace(0, length - 1, knots + 2)
    knot_y = rng.normal(1.0, sigma, size=shape + (knots + 2,))
    return CubicSpline(knot_x, knot_y, axis=-1)(np.arange(length))


def jitter(x: np.ndarray, rng: np.random.Generator, sigma: float = 0.05) -> np.ndarray:
    """Add N(0, sigma) noise to observed values."""
    values, mask, _ = _split(x)
    return _join(values + rng.normal(0.0, sigma, values.shape), mask)


def scaling(x: np.ndarray, rng: np.random.Generator, sigma: float = 0.1) -> np.ndarray:
    """Multiply each window's channel by one factor ~ N(1, sigma)."""
    values, mask, _ = _split(x)
    return _join(values * rng.normal(1.0, sigma, values.shape[:2] + (1,)), mask)


def magnitude_warp(x: np.ndarray, rng: np.random.Generator, sigma: float = 0.2, knots: int = 4) -> np.ndarray:
    """Multiply each channel by a smooth random curve around 1 (cubic spline through `knots` inner knots)."""
    values, mask, _ = _split(x)
    return _join(values * _smooth_curves(rng, values.shape[:2], values.shape[-1], sigma, knots), mask)


def resample(x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Read each window at fractional time positions (n, T') in [0, T-1] -> (n, 2C, T').

    Between two observed steps: linear interpolation; otherwise the nearest step's value and mask.
    """
    values, mask, _ = _split(x)
    t = values.shape[-1]
    positions = np.clip(np.asarray(positions, dtype=np.float64), 0, t - 1)[:, None, :]
    lo = np.floor(positions).astype(int)
    hi = np.minimum(lo + 1, t - 1)
    w = positions - lo
    nearest = np.where(w < 0.5, lo, hi)
    lo, hi, nearest = (np.broadcast_to(a, values.shape[:2] + a.shape[-1:]) for a in (lo, hi, nearest))
    take = lambda a, i: np.take_along_axis(a, i, axis=-1)  # noqa: E731
    both = (take(mask, lo) > 0.5) & (take(mask, hi) > 0.5)
    linear = (1 - w) * take(values, lo) + w * take(values, hi)
    new_values = np.where(both, linear, take(values, nearest))
    new_mask = np.where(both, 1.0, take(mask, nearest))
    return _join(new_values, new_mask)


def time_warp(x: np.ndarray, rng: np.random.Generator, sigma: float = 0.2, knots: int = 4) -> np.ndarray:
    """Stretch and squeeze time smoothly: a random speed curve around 1 (clipped positive), integrated
    and rescaled so the warped window still spans the first to the last step."""
    n, _, t = np.shape(x)
    speed = np.clip(_smooth_curves(rng, (n,), t, sigma, knots), 0.1, None)
    position = np.concatenate([np.zeros((n, 1)), np.cumsum(speed[:, :-1], axis=1)], axis=1)
    return resample(x, position / position[:, -1:] * (t - 1))


def crop(x: np.ndarray, rng: np.random.Generator, min_ratio: float = 0.8) -> np.ndarray:
    """A random sub-window of ratio ~ U(min_ratio, 1) of the length, resized back to T steps."""
    n, _, t = np.shape(x)
    length = rng.uniform(min_ratio, 1.0, n) * (t - 1)
    start = rng.uniform(0, 1, n) * (t - 1 - length)
    return resample(x, start[:, None] + length[:, None] * np.linspace(0, 1, t)[None, :])


def frequency_noise(x: np.ndarray, rng: np.random.Generator, sigma: float = 0.1) -> np.ndarray:
    """Perturb the spectrum: each rfft coefficient of each channel gets complex Gaussian noise of sd
    sigma * (that channel's mean amplitude); back with irfft to T steps."""
    values, mask, _ = _split(x)
    t = values.shape[-1]
    spectrum = np.fft.rfft(values, axis=-1)
    scale = sigma * np.abs(spectrum).mean(axis=-1, keepdims=True)
    noise = rng.normal(size=spectrum.shape) + 1j * rng.normal(size=spectrum.shape)
    return _join(np.fft.irfft(spectrum + scale * noise, n=t, axis=-1), mask)


AUGMENTATIONS: dict[str, Callable[[np.ndarray, np.random.Generator], np.ndarray]] = {
    "jitter": jitter,
    "scaling": scaling,
    "magnitude_warp": magnitude_warp,
    "time_warp": time_warp,
    "crop": crop,
    "frequency_noise": frequency_noise,
}


def augment(x: np.ndarray, rng: np.random.Generator, names: Sequence[str], probability: float = 0.5) -> np.ndarray:
    """Apply each named augmentation, in order, to a random share `probability` of the windows."""
    out = np.asarray(x, dtype=np.float32).copy()
    for name in names:
        chosen = rng.random(len(out)) < probability
        if chosen.any():
            out[chosen] = AUGMENTATIONS[name](out[chosen], rng)
    return out
