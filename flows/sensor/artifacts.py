"""What sensor stages hand each other on disk besides the prepared windows (flows/sensor/windows.py): the pretrained
encoder (with its reconstruction decoder: the novelty scorer) and the fine-tuned ensemble (.pt files of tensors and
plain data only: models/serialization.py)."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from data.sensors.featurize import WindowFeaturizer
from models.sensor.config import SensorModelConfig
from models.sensor.encoder import SensorEncoder
from models.sensor.network import SensorClassifier
from models.sensor.novelty import NoveltyScorer
from models.sensor.training import MASK_SPAN
from models.serialization import load_state, save_state


def load_encoder(path: Path) -> dict | None:
    """The pretrained encoder's weights (None: pretraining was disabled)."""
    return load_state(path, "re-create it with `dvc repro sensor_pretrain`")["encoder"]


def load_scorer(path: Path) -> NoveltyScorer | None:
    """The pretrained encoder and its reconstruction decoder as the novelty scorer, in eval mode (None: pretraining was
    disabled)."""
    state = load_state(path, "re-create it with `dvc repro sensor_pretrain`")
    if state["encoder"] is None:
        return None
    cfg = SensorModelConfig(**state["model"])
    decoder_weights = state["decoder"]
    n_channels = decoder_weights["weight"].shape[0]
    encoder, decoder = SensorEncoder(2 * n_channels, cfg), nn.Conv1d(cfg.hidden, n_channels, 1)
    encoder.load_state_dict(state["encoder"])
    decoder.load_state_dict(decoder_weights)
    return NoveltyScorer(encoder, decoder, n_channels, MASK_SPAN).eval()


def save_ensemble(path: Path, members: list[SensorClassifier], model_cfg: SensorModelConfig,
                  featurizer: WindowFeaturizer, histories: list[list[dict]]) -> None:
    save_state(
        {
            "model": model_cfg.model_dump(),
            "in_channels": featurizer.width,
            "featurizer": featurizer.to_dict(),
            "members": [m.state_dict() for m in members],
            "histories": histories,
        },
        path,
    )


def load_ensemble(path: Path) -> tuple[list[SensorClassifier], WindowFeaturizer, dict]:
    """Members in eval mode, the fitted featurizer, and the raw checkpoint."""
    state = load_state(path, "re-create it with `dvc repro sensor_finetune`")
    cfg = SensorModelConfig(**state["model"])
    members = []
    for weights in state["members"]:
        member = SensorClassifier(state["in_channels"], cfg)
        member.load_state_dict(weights)
        members.append(member.eval())
    return members, WindowFeaturizer.from_dict(state["featurizer"]), state
