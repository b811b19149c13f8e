"""A client that does not finish sending its request loses its connection: stalled headers or a stalled body get
408 and a close after SERVING_REQUEST_READ_TIMEOUT_S, while complete requests on the same server are answered."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request

from serving import http_protocol
from tests.integration.test_serving_registry import free_port

pytestmark = pytest.mark.integration
READ_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def address():
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("SERVING_REQUEST_READ_TIMEOUT_S", str(READ_TIMEOUT_S))
    http_protocol.read_timeout_s.cache_clear()
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> dict:
        return {"bytes": len(await request.body())}

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning",
                                           http=http_protocol.DeadlineProtocol))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield "127.0.0.1", server.config.port
    server.should_exit = True
    thread.join(timeout=10)
    monkeypatch.undo()
    http_protocol.read_timeout_s.cache_clear()


def stalled(address, sent: bytes) -> bytes:
    """Send `sent`, then nothing: what the server answers before it closes the connection (a socket timeout, well
    beyond the deadline, fails the test when it never does)."""
    with socket.create_connection(address, timeout=10 * READ_TIMEOUT_S) as client:
        client.sendall(sent)
        answer = b""
        while chunk := client.recv(4096):
            answer += chunk
        return answer


@pytest.mark.parametrize("sent", [
    b"",  # connected, never spoke
    b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Le",  # headers cut
    b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a\":",  # body cut
])
def test_a_request_that_stops_arriving_gets_408_and_a_close(address, sent):
    assert stalled(address, sent).startswith(b"HTTP/1.1 408")


def test_complete_requests_are_answered_beside_a_stalled_one(address):
    with socket.create_connection(address) as idle:
        idle.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\n")
        answer = httpx.post(f"http://{address[0]}:{address[1]}/echo", content=b"x" * 1000)
        assert answer.status_code == 200 and answer.json() == {"bytes": 1000}


def test_the_deadline_is_per_request_on_a_kept_alive_connection(address):
    """Two requests on one connection, the second sent after longer than the deadline: both answered."""
    with httpx.Client(base_url=f"http://{address[0]}:{address[1]}") as client:
        assert client.post("/echo", content=b"ab").json() == {"bytes": 2}
        time.sleep(READ_TIMEOUT_S * 1.5)
        assert client.post("/echo", content=b"abc").json() == {"bytes": 3}
