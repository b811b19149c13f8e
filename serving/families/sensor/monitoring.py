"""What the service watches of sensor inputs: the drift (PSI and KS per channel, models/drift.py) of the channel
means of the served version's recent windows, as the prediction store holds them, against its training
reference."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from models.drift import channel_drift
from serving.loading import LoadedModel
from serving.settings import ServingSettings


def _number(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


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
