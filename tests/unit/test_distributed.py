"""Distributed context: torchrun's environment, and the equal contiguous shards of a global batch (no processes)."""

import pytest
import torch

from models.distributed import DistributedContext


def context(rank: int, world_size: int) -> DistributedContext:
    return DistributedContext(rank=rank, world_size=world_size, local_rank=rank, backend="gloo")


def test_from_env_reads_torchrun_and_is_none_when_alone(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert DistributedContext.from_env() is None
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert DistributedContext.from_env() is None

    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    found = DistributedContext.from_env()
    assert (found.rank, found.world_size, found.local_rank) == (3, 4, 1) and not found.is_main
    assert found.backend == ("nccl" if torch.cuda.is_available() else "gloo")


def test_shards_are_contiguous_equal_and_cover_the_batch_when_it_divides():
    batch = torch.arange(12).reshape(6, 2)
    shards = [context(rank, 3).shard(batch) for rank in range(3)]
    assert [len(s) for s in shards] == [2, 2, 2]
    assert torch.equal(torch.cat(shards), batch)


def test_uneven_batch_drops_the_last_rows_so_shards_stay_equal():
    batch = torch.arange(7)
    shards = [context(rank, 3).shard(batch) for rank in range(3)]
    assert [s.tolist() for s in shards] == [[0, 1], [2, 3], [4, 5]]  # row 6 (7 % 3 = 1 row) is dropped


def test_shard_batch_shards_row_tensors_and_passes_the_rest():
    x, y, lengths = torch.arange(8).reshape(4, 2), torch.arange(4.0), torch.arange(3)
    sharded = context(1, 2).shard_batch((x, y, lengths, torch.tensor(0.5), 0.1))
    assert isinstance(sharded, tuple) and len(sharded) == 5
    assert torch.equal(sharded[0], x[2:]) and torch.equal(sharded[1], y[2:])
    assert sharded[2] is lengths and float(sharded[3]) == 0.5 and sharded[4] == 0.1
    assert torch.equal(context(0, 2).shard_batch(x), x[:2])
    assert isinstance(context(0, 2).shard_batch([x, y]), list)


def test_shard_batch_is_none_when_the_batch_has_fewer_rows_than_ranks():
    assert context(0, 3).shard_batch((torch.zeros(2, 5), torch.zeros(2))) is None
    assert context(2, 3).shard_batch(torch.zeros(2)) is None


def test_shard_batch_needs_a_tensor_with_rows():
    with pytest.raises(ValueError, match="batch dimension"):
        context(0, 2).shard_batch((torch.tensor(1.0), 3))


def test_shard_batch_shards_a_dataclass_batch_field_by_field():
    from models.sensor.training import SensorBatch

    x, u = torch.arange(16.0).reshape(4, 2, 2), torch.zeros(3, 2, 2)
    batch = SensorBatch(x=x, x_aug=x + 1, y=torch.arange(4.0), w=torch.ones(4), drop=0.2, x_u=u, x_u_aug=u, ramp=0.5)
    sharded = context(1, 2).shard_batch(batch)
    assert isinstance(sharded, SensorBatch)
    assert torch.equal(sharded.x, x[2:]) and torch.equal(sharded.x_aug, x[2:] + 1)
    assert torch.equal(sharded.y, torch.tensor([2.0, 3.0])) and torch.equal(sharded.w, torch.ones(2))
    assert sharded.x_u is u and sharded.drop == 0.2 and sharded.ramp == 0.5  # not B rows: passed whole
    plain = SensorBatch(x=x[:1], y=torch.zeros(1), w=torch.ones(1), drop=0.0)
    assert context(0, 2).shard_batch(plain) is None and context(0, 1).shard_batch(plain).x_aug is None
