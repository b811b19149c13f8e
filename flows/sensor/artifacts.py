"""What sensor stages hand each other on disk: prepared windows and the fine-tuned ensemble."""

from __future__ import annotations

from pathlib import Path

import torch

from data.sensors.featurize import WindowFeaturizer
from data.sensors.prepare import PreparedSensorData, load_prepared
from flows.paths import SENSOR
from flows.tasks import io_task
from models.sensor.config import SensorModelConfig
from models.sensor.network import SensorClassifier


@io_task(name="load-prepared-windows")
def load_windows() -> PreparedSensorData:
    return load_prepared(SENSOR.prepared)


def save_ensemble(path: Path, members: list[SensorClassifier], model_cfg: SensorModelConfig,
                  featurizer: WindowFeaturizer, histories: list[list[dict]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "model": model_cfg.model_dump(),
            "in_channels": 2 * len(featurizer.channels),
            "featurizer": featurizer.to_dict(),
            "members": [m.state_dict() for m in members],
            "histories": histories,
        },
        path,
    )


def load_ensemble(path: Path) -> tuple[list[SensorClassifier], WindowFeaturizer, dict]:
    """Members in eval mode, the fitted featurizer, and the raw checkpoint."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    cfg = SensorModelConfig(**state["model"])
    members = []
    for weights in state["members"]:
        member = SensorClassifier(state["in_channels"], cfg)
        member.load_state_dict(weights)
        members.append(member.eval())
    return members, WindowFeaturizer.from_dict(state["featurizer"]), state
