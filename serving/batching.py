"""Adaptive micro-batching with fair shares: items of concurrent requests run through one call together.

No fixed wait: a request that finds a free slot runs at once; requests that arrive while every slot is busy
form the next batch. A batch holds at most `max_items` items and `max_bytes` bytes (one item always fits);
it is filled round-robin, each waiting request adding at most `share` items per round, and requests that got
items move behind those that did not. So a large request is answered in pieces interleaved with the others
and cannot hold a small one back by more than about one batch. Where items differ widely in cost (SMILES of
10 or 500 characters), a `quantum` makes the rounds fair in size rather than in items (deficit round robin):
each round adds `quantum` to a request's credit and an item goes only when the credit covers its size, so a
request of costly items gets one every few batches while cheap ones wait. A request whose caller stops waiting (its
deadline passed, its client went away) is dropped with whatever it had not yet handed to a batch.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# run(parts) -> (one result sequence per part, in order; what answered them: e.g. the model version)
BatchFunction = Callable[[list[Sequence[Any]]], Awaitable[tuple[list[Sequence[Any]], Any]]]


class BatcherClosed(RuntimeError):
    """The batcher no longer takes or finishes work (the service is shutting down)."""


class MixedAnswer(RuntimeError):
    """The parts of one request were answered by different callers (e.g. the model changed in between)."""


@dataclass(eq=False)
class _Request:
    items: Sequence[Any]
    future: asyncio.Future
    taken: int = 0  # items handed to batches so far
    credit: int = 0  # size it may still send (deficit round robin; only with a quantum)
    answered: int = 0  # items with results so far
    results: list[Any] = field(init=False)
    answered_by: Any = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.results = [None] * len(self.items)

    @property
    def waiting(self) -> bool:
        return not self.future.done()


class Batcher:
    """Queue requests' items, call `run` once per batch with at most `concurrency` calls at a time, and hand
    each request its own results in order."""

    def __init__(self, run: BatchFunction, *, max_items: int, max_bytes: int, share: int,
                 size_of: Callable[[Any], int], concurrency: int = 1, quantum: int | None = None,
                 on_batch: Callable[[int], None] | None = None):
        self.run, self.max_items, self.max_bytes, self.share = run, max_items, max_bytes, share
        self.quantum = quantum
        self.size_of, self.concurrency, self.on_batch = size_of, concurrency, on_batch
        self._waiting: deque[_Request] = deque()
        self._running: set[asyncio.Task] = set()
        self._starting = False  # a batch task is scheduled and will collect when it starts
        self._closed = False

    @property
    def queued_items(self) -> int:
        return sum(len(r.items) - r.taken for r in self._waiting if r.waiting)

    async def submit(self, items: Sequence[Any]) -> tuple[list[Any], Any]:
        """This request's results, in order, and what answered them. Cancelling the caller drops the items
        not yet in a batch."""
        if self._closed:
            raise BatcherClosed("the service is shutting down")
        if not len(items):
            return [], None
        request = _Request(items, asyncio.get_running_loop().create_future())
        self._waiting.append(request)
        self._dispatch()
        return await request.future

    def close(self) -> None:
        """Refuse new work and fail every waiting request with BatcherClosed (batches in flight finish)."""
        self._closed = True
        for request in self._waiting:
            if request.waiting:
                request.future.set_exception(BatcherClosed("the service is shutting down"))
        self._waiting.clear()

    async def drain(self) -> None:
        """Wait for the batches in flight."""
        if self._running:
            await asyncio.wait(self._running)

    def _dispatch(self) -> None:
        """Start a batch task if a slot is free; it collects on its first step, so requests submitted in the
        same event-loop turn share it."""
        if self._starting or self._closed or not self._waiting or len(self._running) >= self.concurrency:
            return
        self._starting = True
        task = asyncio.create_task(self._next())
        self._running.add(task)
        task.add_done_callback(self._finished)

    async def _next(self) -> None:
        self._starting = False
        batch = self._collect()
        self._dispatch()  # another free slot takes what is left
        if batch:
            await self._run(batch)

    def _finished(self, task: asyncio.Task) -> None:
        self._running.discard(task)
        self._dispatch()

    def _collect(self) -> list[tuple[_Request, int, int]]:
        """The next batch: (request, start, stop) slices, round-robin over the waiting requests."""
        slices: dict[_Request, list[int]] = {}
        count = size = 0
        full = False
        while not full and count < self.max_items:
            progressed = False
            pending = [r for r in self._waiting if r.waiting and r.taken < len(r.items)]
            for request in pending:
                stop = request.taken
                limit = min(len(request.items), request.taken + self.share, request.taken + self.max_items - count)
                if self.quantum is not None:
                    request.credit += self.quantum
                while stop < limit:
                    item_size = self.size_of(request.items[stop])
                    if self.quantum is not None and item_size > request.credit:
                        break  # its turn comes again when the credit covers the item
                    if count > 0 and size + item_size > self.max_bytes:
                        full = True
                        break
                    size += item_size
                    count += 1
                    stop += 1
                    if self.quantum is not None:
                        request.credit -= item_size
                if stop > request.taken:
                    slices.setdefault(request, [request.taken, stop])[1] = stop
                    request.taken = stop
                    progressed = True
                if full or count >= self.max_items:
                    full = True
                    break
            if not progressed and (count > 0 or not pending):
                break  # (an empty batch takes more rounds: some credit grows to cover its item)
        served = [r for r in self._waiting if r in slices]
        self._waiting = deque([r for r in self._waiting if r.waiting and r.taken < len(r.items) and r not in slices]
                              + [r for r in served if r.taken < len(r.items)])
        return [(request, start, stop) for request, (start, stop) in slices.items()]

    async def _run(self, batch: list[tuple[_Request, int, int]]) -> None:
        if self.on_batch is not None:
            self.on_batch(sum(stop - start for _, start, stop in batch))
        try:
            results, answered_by = await self.run([request.items[start:stop] for request, start, stop in batch])
        except Exception as error:  # every request in the batch gets the error; the others go on
            for request, _, _ in batch:
                if request.waiting:
                    request.future.set_exception(error)
            return
        for (request, start, stop), part in zip(batch, results):
            if not request.waiting:  # cancelled meanwhile (deadline, client gone): its results are dropped
                continue
            request.results[start:stop] = part
            if request.answered and request.answered_by != answered_by:
                request.future.set_exception(MixedAnswer("the model changed while the request was answered; retry"))
                continue
            request.answered += stop - start
            request.answered_by = answered_by
            if request.answered == len(request.items):
                request.future.set_result((request.results, answered_by))
