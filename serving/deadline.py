"""Every prediction has a deadline, and a client that goes away takes its queued work with it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")


class DeadlineExceeded(Exception):
    """The work did not finish within the request timeout; what was still queued has been dropped."""


class ClientGone(Exception):
    """The client disconnected before the answer was ready; its queued work has been dropped."""


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def within_deadline(request: Request, work: Awaitable[T], timeout_s: float) -> T:
    """The result of `work`; cancels it (so the batchers drop its items) when `timeout_s` passes
    (DeadlineExceeded) or the client disconnects (ClientGone)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait((task, watcher), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the handler itself was cancelled (server shutdown)
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    if watcher in done:
        raise ClientGone("the client disconnected")
    raise DeadlineExceeded(f"no answer within {timeout_s:g} s (SERVING_REQUEST_TIMEOUT_S); the request's queued "
                           f"work was dropped, retry later or send fewer items")
