"""Data-parallel training across processes (PyTorch DDP) launched by `torchrun`.

Every rank builds the same global batch and trains on its own contiguous, equal shard of it; DDP
averages the gradients, which is then the gradient of the global batch's mean loss. gloo on CPU,
NCCL on GPUs (one per process, cuda:LOCAL_RANK).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist


@dataclasses.dataclass(frozen=True)
class DistributedContext:
    """This process's place in a torchrun job."""

    rank: int
    world_size: int
    local_rank: int
    backend: str  # "nccl" or "gloo"

    @classmethod
    def from_env(cls) -> DistributedContext | None:
        """Read torchrun's RANK, WORLD_SIZE and LOCAL_RANK; None when not launched by torchrun or alone."""
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if "RANK" not in os.environ or world_size == 1:
            return None
        return cls(rank=int(os.environ["RANK"]), world_size=world_size,
                   local_rank=int(os.environ.get("LOCAL_RANK", "0")),
                   backend="nccl" if torch.cuda.is_available() else "gloo")

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes files and logs."""
        return self.rank == 0

    def device(self) -> torch.device:
        """cuda:local_rank with NCCL, else the CPU."""
        return torch.device("cuda", self.local_rank) if self.backend == "nccl" else torch.device("cpu")

    def shard(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous slice of a global batch: (B, ...) -> (B // world_size, ...).

        The last B % world_size rows are dropped, so every rank holds the same number of rows and DDP's
        gradient average is the gradient of the mean loss over the kept rows.
        """
        rows = len(tensor) // self.world_size
        return tensor[self.rank * rows:(self.rank + 1) * rows]

    def shard_batch(self, batch):
        """Shard a batch: a tensor (B, ...), or a tuple/list (or dataclass: its fields in order) whose tensors with B
        rows (B: the first tensor's length) are sharded and whose other elements pass as they are. None when
        B < world_size (no rows)."""
        if isinstance(batch, torch.Tensor):
            return self.shard(batch) if len(batch) >= self.world_size else None
        if dataclasses.is_dataclass(batch):
            names = [f.name for f in dataclasses.fields(batch)]
            values = self.shard_batch(tuple(getattr(batch, name) for name in names))
            return None if values is None else dataclasses.replace(batch, **dict(zip(names, values)))
        rowed = [isinstance(a, torch.Tensor) and a.ndim > 0 for a in batch]
        if not any(rowed):
            raise ValueError("a batch to shard needs a tensor with a batch dimension")
        size = len(batch[rowed.index(True)])
        if size < self.world_size:
            return None
        return type(batch)(self.shard(a) if is_rowed and len(a) == size else a for a, is_rowed in zip(batch, rowed))

    def all_reduce_mean(self, value: float) -> float:
        """The mean of `value` over all ranks (the same float on every rank)."""
        tensor = torch.tensor([value], dtype=torch.float64, device=self.device())
        dist.all_reduce(tensor)
        return float(tensor) / self.world_size

    def broadcast(self, value: float, src: int = 0) -> float:
        """Rank `src`'s `value`, on every rank."""
        tensor = torch.tensor([value], dtype=torch.float64, device=self.device())
        dist.broadcast(tensor, src)
        return float(tensor)

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        dist.barrier(device_ids=[self.local_rank] if self.backend == "nccl" else None)


@contextmanager
def process_group(context: DistributedContext) -> Iterator[DistributedContext]:
    """Join the job's process group (torchrun's env:// rendezvous) for the block, then leave it."""
    if context.backend == "nccl":
        torch.cuda.set_device(context.local_rank)
    dist.init_process_group(context.backend, rank=context.rank, world_size=context.world_size)
    try:
        yield context
    finally:
        dist.destroy_process_group()
