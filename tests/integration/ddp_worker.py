"""One torchrun process of tests/integration/test_ddp.py: fine-tunes a tiny sensor model data-parallel.

python -m torch.distributed.run --standalone --nproc-per-node 2 -m tests.integration.ddp_worker OUT
writes OUT/rank{r}.pt (each rank's final weights), OUT/rows{r}.json (the rows of each training forward
pass on that rank), and from rank 0 OUT/history.json and OUT/member.pt (the checkpoint). The data and
settings live here so that the test trains the same thing in one process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from models.distributed import DistributedContext, process_group
from models.sensor.config import SensorFinetuneConfig, SensorModelConfig
from models.sensor.network import SensorClassifier
from models.sensor.training import finetune_member

SEED = 7
MODEL = SensorModelConfig(hidden=16, layers=2, dropout=0.0, attention_layers=1, heads=2, projection=4)
# sampling none, mixup 0, no small-loss drop and unweighted bce: the loss is a plain mean over rows, so two
# shards of 32 average to the gradient of the 64-row global batch.
FINETUNE = SensorFinetuneConfig(epochs=5, batch_size=64, lr=3e-3, patience=10, sampling="none", mixup_alpha=0.0,
                                small_loss_drop=0.0, checkpoint=True)


def windows(n: int, seed: int, c: int = 2, t: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """n featurised windows (n, 2C, T) (values, then all-observed masks) and labels (n,): positives drift upward."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.3).astype(np.int8)
    values = rng.normal(size=(n, c, t)) + y[:, None, None] * np.linspace(0, 0.6, t)
    return np.concatenate([values, np.ones((n, c, t))], axis=1).astype(np.float32), y


def data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """train_x (256, 4, 32), train_y (256,), val_x (64, 4, 32), val_y (64,)."""
    return *windows(256, seed=0), *windows(64, seed=1)


def main(out: Path) -> None:
    context = DistributedContext.from_env()
    rows: list[int] = []

    def count_rows(module: torch.nn.Module, args: tuple) -> None:
        if isinstance(module, SensorClassifier) and module.training:
            rows.append(len(args[0]))

    torch.nn.modules.module.register_module_forward_pre_hook(count_rows)
    with process_group(context):
        model, result = finetune_member(*data(), MODEL, FINETUNE, None, seed=SEED, device=context.device(),
                                        checkpoint=out / "member.pt", distributed=context)
        torch.save(model.state_dict(), out / f"rank{context.rank}.pt")
        (out / f"rows{context.rank}.json").write_text(json.dumps(rows))
        if context.is_main:
            (out / "history.json").write_text(json.dumps(result.history))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
