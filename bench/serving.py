"""Benchmark of the prediction service on loopback (not a test): throughput and p50/p99 latency under 1, 8
and 32 concurrent clients, one item per request, for each loaded model family.

    .venv/bin/python bench/serving.py                  # starts `python -m serving` on a free port
    .venv/bin/python bench/serving.py --url http://127.0.0.1:8000 --seconds 10

Results go to bench/results/serving.json and bench/results/serving.md. The clients share the machine with
the service, so on a small machine the figures are a lower bound.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SMILES = ["CCO", "c1ccccc1O", "CC(=O)Nc1ccc(O)cc1", "CN1C=NC2=C1C(=O)N(C(=O)N2C)C", "ClC(Cl)Cl", "CCN(CC)CC"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def service(url: str | None, ready_seconds: float) -> Iterator[str]:
    """The service at `url`, or a `python -m serving` started here for the duration."""
    if url:
        yield url
        return
    port = free_port()
    env = {**os.environ, "SERVING_PORT": str(port)}
    process = subprocess.Popen([sys.executable, "-m", "serving"], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_seconds
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/ready").status_code == 200:
                    break
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def bodies(model: dict) -> list[dict]:
    """A few request bodies with one item each."""
    if model["family"] == "molecule":
        return [{"smiles": [s]} for s in SMILES]
    rng = random.Random(0)
    return [{"windows": [[[rng.gauss(0, 1) for _ in model["channels"]] for _ in range(model["window"])]]}
            for _ in range(16)]


async def load(url: str, path: str, payloads: list[dict], clients: int, seconds: float, headers: dict) -> dict:
    """`clients` loops posting back to back for `seconds`; latency of every request."""
    latencies: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async with httpx.AsyncClient(base_url=url, limits=limits, headers=headers, timeout=30) as client:
        async def worker(offset: int) -> None:
            nonlocal errors
            i = offset
            while time.perf_counter() < stop:
                start = time.perf_counter()
                response = await client.post(path, json=payloads[i % len(payloads)])
                latencies.append(time.perf_counter() - start)
                errors += response.status_code != 200
                i += 1

        began = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(clients)))
        elapsed = time.perf_counter() - began
    ms = np.asarray(latencies) * 1000
    return {"clients": clients, "requests": len(latencies), "errors": errors,
            "throughput_rps": round(len(latencies) / elapsed, 1),
            "p50_ms": round(float(np.percentile(ms, 50)), 2), "p99_ms": round(float(np.percentile(ms, 99)), 2)}


def markdown(report: dict) -> str:
    lines = [f"# Serving benchmark ({report['when']})", "",
             f"{report['machine']}; {report['seconds']} s per level; one item per request; loopback.", "",
             "| model | version | provider | clients | requests | errors | req/s | p50 ms | p99 ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for run in report["runs"]:
        lines.append(f"| {run['family']} | {run['version']} | {run['provider']} | {run['clients']} | {run['requests']} "
                     f"| {run['errors']} | {run['throughput_rps']} | {run['p50_ms']} | {run['p99_ms']} |")
    lines += ["", *[f"- {note}" for note in report["notes"]]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="an already running service (default: start one)")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each concurrency level")
    parser.add_argument("--clients", default="1,8,32", help="concurrency levels")
    args = parser.parse_args()
    headers = {"Authorization": f"Bearer {os.environ['SERVING_API_KEY']}"} if os.environ.get("SERVING_API_KEY") else {}

    with service(args.url, ready_seconds=120) as url:
        info = httpx.get(f"{url}/v1/models", headers=headers).json()
        runs, notes = [], [f"{family}: not benchmarked, {problem}" for family, problem in info["problems"].items()]
        for model in info["models"]:
            payloads = bodies(model)
            path = f"/v1/{model['family']}/predict"
            asyncio.run(load(url, path, payloads, 2, 1.0, headers))  # warm-up
            for clients in (int(c) for c in args.clients.split(",")):
                result = asyncio.run(load(url, path, payloads, clients, args.seconds, headers))
                runs.append({"family": model["family"], "version": model["version"], "provider": model["provider"],
                             **result})
                print(json.dumps(runs[-1]))
    report = {"when": time.strftime("%Y-%m-%d %H:%M"), "seconds": args.seconds,
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
              "runs": runs, "notes": notes}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "serving.json").write_text(json.dumps(report, indent=2) + "\n")
    (RESULTS / "serving.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
