"""What the service watches of sensor inputs: the channel means of recent windows, and their drift (PSI and KS
per channel, models/drift.py) against the served version's training reference."""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Sequence

import numpy as np

from models.drift import channel_drift, window_means
from serving.loading import LoadedModel
from serving.settings import ServingSettings


def _number(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


class SensorInputs:
    """The channel means (C,) of the last `size` sensor windows of one channel layout (a new layout starts over).
    `add` keeps the windows (n, T, C) as sent; `means` summarises what came since its last call."""

    def __init__(self, size: int):
        self.size = size
        self._lock = threading.Lock()
        self._pending: deque[tuple[tuple[str, ...], np.ndarray]] = deque()
        self._pending_rows = 0
        self._channels: tuple[str, ...] = ()
        self._means: deque[np.ndarray] = deque(maxlen=size)

    def add(self, windows: np.ndarray, channels: Sequence[str]) -> None:
        """Keep windows (n, T, C) whose channels are `channels` (on the request path: no computation)."""
        with self._lock:
            self._pending.append((tuple(channels), windows))
            self._pending_rows += len(windows)
            while self._pending_rows - len(self._pending[0][1]) >= self.size:  # pushed out before ever counted
                self._pending_rows -= len(self._pending.popleft()[1])

    def means(self) -> tuple[tuple[str, ...], np.ndarray]:
        """The channels and the recent windows' channel means (m, C), NaN for a channel without readings.
        One caller at a time (the refresh thread)."""
        with self._lock:
            pending, self._pending, self._pending_rows = self._pending, deque(), 0
        for channels, windows in pending:
            if channels != self._channels:
                self._channels = channels
                self._means.clear()
            self._means.extend(window_means(windows.transpose(0, 2, 1)))
        if not self._means:
            return self._channels, np.zeros((0, len(self._channels)))
        return self._channels, np.stack(self._means)


def sensor_drift_report(model: LoadedModel, channels: Sequence[str], means: np.ndarray,
                        settings: ServingSettings) -> dict:
    """SensorDrift's fields: PSI and KS per reference channel of recent channel means (m, C) in `channels`' order."""
    names = model.reference["channels"].tolist()
    position = {name: j for j, name in enumerate(channels)}
    columns = np.stack([means[:, position[name]] if name in position else np.full(len(means), np.nan)
                        for name in names], axis=1) if names else means[:, :0]
    drift = channel_drift(model.reference, columns)
    counted = len(means) >= settings.monitor_min_items
    rows = [{"channel": name, "psi": _number(d["psi"]), "ks": _number(d["ks"]), "n": d["n"],
             "alarm": counted and d["psi"] > settings.monitor_max_psi} for name, d in drift.items()]
    return {"windows": len(means), "max_psi": settings.monitor_max_psi, "channels": rows,
            "alarm": any(row["alarm"] for row in rows)}
