"""Adaptive micro-batching: no fixed wait, batches form while the model is busy, caps, fair shares,
dropped work of requests whose caller stopped waiting, closing."""

from __future__ import annotations

import asyncio

import pytest

from serving.batching import Batcher, BatcherClosed, MixedAnswer


class Model:
    """An async batch function that doubles numbers; `hold()` makes calls wait until `release()`."""

    def __init__(self):
        self.calls: list[list[int]] = []
        self.version = "v1"
        self.gate = asyncio.Event()
        self.gate.set()

    def hold(self) -> None:
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    async def __call__(self, parts):
        self.calls.append([x for part in parts for x in part])
        version = self.version  # the model that takes the call
        await self.gate.wait()
        if any("boom" == x for part in parts for x in part):
            raise ValueError("boom")
        return [[2 * x for x in part] for part in parts], version


def batcher(model, max_items=64, max_bytes=10**6, share=64, concurrency=1) -> Batcher:
    return Batcher(model, max_items=max_items, max_bytes=max_bytes, share=share, size_of=lambda _: 1,
                   concurrency=concurrency)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_lone_request_runs_at_once():
    async def main():
        model = Model()
        model.hold()
        b = batcher(model)
        pending = asyncio.create_task(b.submit([1, 2]))
        await settle()
        assert model.calls == [[1, 2]]  # called before any other request could join: no waiting for company
        model.release()
        return await pending

    assert asyncio.run(main()) == ([2, 4], "v1")


def test_requests_submitted_together_share_one_call_and_get_their_own_results():
    async def main():
        model = Model()
        b = batcher(model)
        return model.calls, await asyncio.gather(*(b.submit([i, i + 100]) for i in range(5)))

    calls, results = asyncio.run(main())
    assert calls == [[x for i in range(5) for x in (i, i + 100)]]
    assert results == [([2 * i, 2 * (i + 100)], "v1") for i in range(5)]


def test_requests_arriving_while_a_batch_runs_form_the_next_batch():
    async def main():
        model = Model()
        model.hold()
        b = batcher(model)
        first = asyncio.create_task(b.submit([0]))
        await settle()
        later = [asyncio.create_task(b.submit([i, i + 100])) for i in range(1, 4)]
        await settle()
        assert model.calls == [[0]]
        model.release()
        return model.calls, await first, await asyncio.gather(*later)

    calls, first, later = asyncio.run(main())
    assert calls == [[0], [1, 101, 2, 102, 3, 103]]
    assert first == ([0], "v1")
    assert later == [([2 * i, 2 * (i + 100)], "v1") for i in range(1, 4)]


@pytest.mark.parametrize(("max_items", "max_bytes"), [(3, 10**6), (64, 3)])
def test_batches_are_capped_in_items_and_in_bytes(max_items, max_bytes):
    async def main():
        model = Model()
        model.hold()
        b = batcher(model, max_items=max_items, max_bytes=max_bytes)
        first = asyncio.create_task(b.submit([0]))
        await settle()
        later = [asyncio.create_task(b.submit([i])) for i in range(1, 8)]
        await settle()
        model.release()
        await asyncio.gather(first, *later)
        return model.calls, [r for r, _ in [first.result(), *(t.result() for t in later)]]

    calls, results = asyncio.run(main())
    assert calls == [[0], [1, 2, 3], [4, 5, 6], [7]]
    assert results == [[2 * i] for i in range(8)]


def test_a_large_request_is_answered_in_pieces_and_does_not_hold_back_a_small_one():
    async def main():
        model = Model()
        model.hold()
        b = batcher(model, max_items=4, share=2)
        large = asyncio.create_task(b.submit(list(range(100, 120))))
        await settle()
        small = asyncio.create_task(b.submit([1, 2, 3]))
        await settle()
        model.release()
        small_result = await small
        assert not large.done()  # the small request was answered while the large one still had items queued
        return model.calls, small_result, await large

    calls, small, large = asyncio.run(main())
    assert calls[0] == [100, 101, 102, 103]
    assert calls[1] == [104, 105, 1, 2]  # round-robin: each waiting request adds at most `share` items per turn
    assert 3 in calls[2]
    assert all(len(c) <= 4 for c in calls)
    assert small[0] == [2, 4, 6]
    assert large[0] == [2 * x for x in range(100, 120)]  # pieces come back in order


def test_with_a_quantum_costly_items_wait_turns_while_cheap_ones_of_other_requests_go():
    async def main():
        model = Model()
        model.hold()
        b = Batcher(model, max_items=4, max_bytes=1000, share=1, size_of=lambda x: x, quantum=100)
        first = asyncio.create_task(b.submit([10]))  # takes the free slot
        await settle()
        costly = asyncio.create_task(b.submit([500, 500]))
        cheap = [asyncio.create_task(b.submit([20 + i])) for i in range(6)]
        await settle()
        model.release()
        await asyncio.gather(first, costly, *cheap)
        return model.calls

    calls = asyncio.run(main())
    assert calls[0] == [10]
    # the 500s wait 5 turns each (100 of credit per turn); the cheap requests go meanwhile, 4 per call
    assert calls[1] == [20, 21, 22, 23] and calls[2] == [24, 25]
    assert calls[3] == [500] and calls[4] == [500]


def test_a_lone_costly_item_goes_at_once_with_a_quantum():
    async def main():
        model = Model()
        b = Batcher(model, max_items=4, max_bytes=1000, share=1, size_of=lambda x: x, quantum=100)
        return await b.submit([900]), model.calls

    (results, _), calls = asyncio.run(main())
    assert results == [1800] and calls == [[900]]


def test_a_request_whose_caller_stopped_waiting_is_dropped():
    async def main():
        model = Model()
        model.hold()
        b = batcher(model, max_items=2)
        first = asyncio.create_task(b.submit([1, 2, 3, 4]))  # 1, 2 run; 3, 4 wait
        await settle()
        gone = asyncio.create_task(b.submit([7, 8]))
        await settle()
        first.cancel()  # e.g. its client disconnected or its deadline passed
        gone.cancel()
        kept = asyncio.create_task(b.submit([5]))
        await settle()
        model.release()
        return model.calls, await kept, first.cancelled(), gone.cancelled()

    calls, kept, first_cancelled, gone_cancelled = asyncio.run(main())
    assert calls == [[1, 2], [5]]  # neither 3, 4 nor 7, 8 reached the model
    assert kept == ([10], "v1") and first_cancelled and gone_cancelled


def test_a_failing_call_fails_its_requests_and_the_batcher_goes_on():
    async def main():
        b = batcher(Model())
        with pytest.raises(ValueError, match="boom"):
            await b.submit(["boom"])
        return await b.submit([3])

    assert asyncio.run(main())[0] == [6]


def test_a_request_answered_by_two_model_versions_is_refused():
    async def main():
        model = Model()
        model.hold()
        b = batcher(model, max_items=2)
        split = asyncio.create_task(b.submit([1, 2, 3]))
        await settle()
        model.version = "v2"  # the model was swapped between the request's two pieces
        model.release()
        with pytest.raises(MixedAnswer):
            await split
        return await b.submit([4])

    assert asyncio.run(main()) == ([8], "v2")


def test_with_two_slots_two_calls_run_at_once_and_the_rest_waits():
    async def main():
        model = Model()
        model.hold()
        b = batcher(model, max_items=2, concurrency=2)
        tasks = [asyncio.create_task(b.submit([i])) for i in range(5)]
        await settle()
        running = [list(c) for c in model.calls]
        model.release()
        return running, [(await t)[0] for t in tasks], model.calls

    running, results, calls = asyncio.run(main())
    assert running == [[0, 1], [2, 3]]  # each free slot took a full batch of what was waiting
    assert calls[2:] == [[4]]
    assert results == [[2 * i] for i in range(5)]


def test_closing_fails_the_waiting_requests_and_refuses_new_ones():
    async def main():
        model = Model()
        model.hold()
        b = batcher(model)
        running = asyncio.create_task(b.submit([1]))
        await settle()
        waiting = asyncio.create_task(b.submit([2]))
        await settle()
        b.close()
        with pytest.raises(BatcherClosed):
            await waiting
        with pytest.raises(BatcherClosed):
            await b.submit([3])
        model.release()
        return await running  # what was in flight finishes

    assert asyncio.run(main()) == ([2], "v1")
