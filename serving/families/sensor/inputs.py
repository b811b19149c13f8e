"""Sensor windows from a request, checked against the model that will answer them (steps, channels, float32)."""

from __future__ import annotations

import numpy as np

from serving.inputs import BadInput


def sensor_windows(windows: list[list[list[float | None]]], channels: list[str], steps: int) -> np.ndarray:
    """The windows as one (n, T, C) float32 array with NaN for `null`, after checking T == `steps`, the C values of
    each step == `channels`, and that every reading fits in float32."""
    with np.errstate(over="ignore"):
        try:
            array = np.array(windows, dtype=np.float32)  # null -> NaN, which the featurizer masks as missing
        except ValueError:  # ragged: some window or step has another length, found below
            array = None
    if array is None or array.shape[1:] != (steps, len(channels)):
        _name_wrong_shape(windows, channels, steps)
    overflow = np.argwhere(np.isinf(array))
    if len(overflow):
        i, t, c = overflow[0]
        raise BadInput(f"windows[{i}][{t}][{c}] ({channels[c]}) is {windows[i][t][c]:g}, which does not fit in "
                       f"float32 (largest magnitude {float(np.finfo(np.float32).max):.4g})")
    return array


def _name_wrong_shape(windows: list, channels: list[str], steps: int) -> None:
    for i, window in enumerate(windows):
        if len(window) != steps:
            raise BadInput(f"windows[{i}] has {len(window)} time steps; this model needs exactly {steps} "
                           f"(each a list of {len(channels)} values: {', '.join(channels)})")
        for t, step in enumerate(window):
            if len(step) != len(channels):
                raise BadInput(f"windows[{i}][{t}] has {len(step)} values; this model needs {len(channels)} "
                               f"channels in this order: {', '.join(channels)}")
