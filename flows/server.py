"""A Prefect API server for the duration of a pipeline run (its SQLite database in PREFECT_HOME).

One server for all stages: each stage process connects in about a second, where Prefect's ephemeral
mode would start a temporary server per process (about ten seconds each).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from contract.lifetime import child_dies_with_parent
from flows._environment import workspace


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_healthy(url: str, process: subprocess.Popen, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"Prefect server exited with status {process.returncode}; see {log}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"Prefect server at {url} not healthy after {timeout:.0f} s; see {log}")


def start_prefect_server(port: int | None = None, ui: bool = False,
                         timeout: float = 120) -> tuple[str, subprocess.Popen]:
    """Start `prefect server start` on 127.0.0.1 in its own session and wait until it is healthy; returns its API URL
    and its process (stop_prefect_server stops it)."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}/api"
    log = Path(os.environ["PREFECT_HOME"]) / "server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port),
               "--analytics-off", "--ui" if ui else "--no-ui"]
    env = {**os.environ, "PREFECT_API_URL": url}
    with open(log, "ab") as sink:
        # its own session: Ctrl-C reaches the caller, which stops the server after what uses it
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=workspace(),
                                   start_new_session=True, preexec_fn=child_dies_with_parent)
    try:
        wait_healthy(url, process, timeout, log)
    except BaseException:
        stop_prefect_server(process)
        raise
    return url, process


def stop_prefect_server(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()


@contextlib.contextmanager
def prefect_server(port: int | None = None, ui: bool = False, timeout: float = 120) -> Iterator[str]:
    """Start `prefect server start` on 127.0.0.1; yields its API URL; stops it on exit."""
    url, process = start_prefect_server(port, ui, timeout)
    try:
        yield url
    finally:
        stop_prefect_server(process)
