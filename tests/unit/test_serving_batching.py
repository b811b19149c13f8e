"""Micro-batching: concurrent requests share model calls, each gets its own results, waits are bounded."""

from __future__ import annotations

import asyncio
import time

import pytest

from serving.batching import MicroBatcher


def run_batcher(scenario, max_items=64, wait_s=0.05):
    calls: list[list[int]] = []

    def double(items):
        calls.append(list(items))
        if "boom" in items:
            raise ValueError("boom")
        return [2 * x for x in items], f"call {len(calls)}"

    async def main():
        batcher = MicroBatcher(double, max_items, wait_s)
        batcher.start()
        try:
            return await scenario(batcher)
        finally:
            await batcher.stop()

    return asyncio.run(main()), calls


def test_concurrent_requests_share_one_call_and_get_their_own_results():
    async def scenario(batcher):
        return await asyncio.gather(*(batcher.submit([i, i + 100]) for i in range(5)))

    results, calls = run_batcher(scenario)
    assert len(calls) == 1 and sorted(calls[0]) == sorted(x for i in range(5) for x in (i, i + 100))
    assert [r for r, _ in results] == [[2 * i, 2 * (i + 100)] for i in range(5)]
    assert {by for _, by in results} == {"call 1"}


def test_a_full_batch_runs_without_waiting():
    async def scenario(batcher):
        return await asyncio.gather(*(batcher.submit([i]) for i in range(4)))

    start = time.perf_counter()
    results, calls = run_batcher(scenario, max_items=2, wait_s=5.0)
    assert time.perf_counter() - start < 1.0  # full batches never wait for the 5 s
    assert calls == [[0, 1], [2, 3]]
    assert [r for r, _ in results] == [[0], [2], [4], [6]]


def test_a_lone_request_waits_at_most_the_bound():
    async def scenario(batcher):
        return await batcher.submit([1])

    start = time.perf_counter()
    (result, _), calls = run_batcher(scenario, wait_s=0.05)
    assert result == [2] and calls == [[1]]
    assert time.perf_counter() - start < 1.0


def test_a_failing_call_fails_its_requests_and_the_batcher_goes_on():
    async def scenario(batcher):
        with pytest.raises(ValueError, match="boom"):
            await batcher.submit(["boom"])
        return await batcher.submit([3])

    (result, _), _ = run_batcher(scenario, wait_s=0.0)
    assert result == [6]
