"""Dynamic micro-batching: items from concurrent requests are run through the model together.

A batch opens with the first waiting request and closes when it holds `max_items` items or `wait_s`
seconds have passed, whichever comes first; it then runs in a worker thread while the next one fills.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

# run(items) -> (one result per item, what answered: e.g. the model version)
BatchFunction = Callable[[list[Any]], tuple[Sequence[Any], Any]]


class MicroBatcher:
    """Queue requests' items, call `run` once per micro-batch, hand each request its own results."""

    def __init__(self, run: BatchFunction, max_items: int, wait_s: float,
                 on_batch: Callable[[int], None] | None = None):
        self.run, self.max_items, self.wait_s, self.on_batch = run, max_items, wait_s, on_batch
        self._queue: asyncio.Queue[tuple[list[Any], asyncio.Future]] = asyncio.Queue()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._serve())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def submit(self, items: list[Any]) -> tuple[list[Any], Any]:
        """This request's results, in order, and what answered them."""
        future = asyncio.get_running_loop().create_future()
        await self._queue.put((items, future))
        return await future

    async def _collect(self) -> list[tuple[list[Any], asyncio.Future]]:
        batch = [await self._queue.get()]
        count = len(batch[0][0])
        deadline = asyncio.get_running_loop().time() + self.wait_s
        while count < self.max_items:
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                request = self._queue.get_nowait() if remaining <= 0 else await asyncio.wait_for(self._queue.get(), remaining)
            except (asyncio.QueueEmpty, TimeoutError):
                break
            batch.append(request)
            count += len(request[0])
        return batch

    async def _serve(self) -> None:
        while True:
            batch = await self._collect()
            flat = [item for items, _ in batch for item in items]
            if self.on_batch is not None:
                self.on_batch(len(flat))
            try:
                results, answered_by = await asyncio.to_thread(self.run, flat)
            except Exception as error:  # every waiting request gets the error, the loop goes on
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            start = 0
            for items, future in batch:
                if not future.done():  # a cancelled request (client gone) is skipped
                    future.set_result((list(results[start:start + len(items)]), answered_by))
                start += len(items)
