"""uvicorn's HTTP protocol (httptools) with a deadline for receiving each request: a client that has not sent the
whole request (its headers and its body) within SERVING_REQUEST_READ_TIMEOUT_S of starting it, or of connecting,
gets 408 where no answer has begun, and its connection is closed. uvicorn's own keep-alive timeout covers only the
idle time between requests, and is reset by every byte, so a client trickling a request held a connection forever.

    uvicorn.run(..., http="serving.http_protocol:DeadlineProtocol")
"""

from __future__ import annotations

import asyncio
import functools
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("serving")
_BODY = b'{"detail": "the request did not arrive in time (SERVING_REQUEST_READ_TIMEOUT_S)"}'
TIMED_OUT = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
             b"content-length: %d\r\n\r\n%s" % (len(_BODY), _BODY))


@functools.cache
def read_timeout_s() -> float:
    """SERVING_REQUEST_READ_TIMEOUT_S of this process's environment (each worker reads the same)."""
    from serving.settings import ServingSettings
    return ServingSettings().request_read_timeout_s


class DeadlineProtocol(HttpToolsProtocol):
    """HttpToolsProtocol whose every request must arrive within read_timeout_s()."""

    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None:
            self._arm()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _arm(self) -> None:
        self._deadline = self.loop.call_later(read_timeout_s(), self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        log.info("closed a connection whose request did not arrive within %.0f s (SERVING_REQUEST_READ_TIMEOUT_S)",
                 read_timeout_s())
        if self.cycle is None or not self.cycle.response_started:
            self.transport.write(TIMED_OUT)
        self.transport.close()
