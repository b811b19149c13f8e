"""Load benchmark of the prediction service (not a test): throughput and p50/p99 latency per scenario, next to
the in-process ONNX Runtime throughput of the same model, and the service's memory over a soak.

    .venv/bin/python bench/serving.py --tiny /tmp/serving-bench          # the tests' tiny models, registry built there
    .venv/bin/python bench/serving.py                                     # the project's registry (after `make run`)
    .venv/bin/python bench/serving.py --only sensor-1x1,sensor-32x1 --soak-seconds 300

The service runs as `python -m serving` in its own process; this process is the load generator (keep-alive
HTTP/1.1 connections on asyncio streams, one per client). Results go to bench/results/serving.json (or
`--name`.json), and the tables of the .md beside it are generated from it. Clients and service share the machine, so on a
small machine the figures are a lower bound; the load average is recorded before and after each row.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the project's `serving` package, not this script of the same name
from bench.results_files import machine, write_results  # noqa: E402
ESOL = ROOT.parent / "shared" / "data" / "esol" / "delaney-processed.csv"
FALLBACK_SMILES = ["CCO", "c1ccccc1O", "CC(=O)Nc1ccc(O)cc1", "CN1C=NC2=C1C(=O)N(C(=O)N2C)C", "ClC(Cl)Cl", "CCN(CC)CC",
                   "CC(C)Cc1ccc(cc1)C(C)C(=O)O", "OC(=O)c1ccccc1OC(C)=O", "c1ccc2ccccc2c1", "CCOC(=O)C"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


@contextlib.contextmanager
def service(url: str | None, env: dict[str, str]) -> Iterator[tuple[str, int | None]]:
    """(base URL, pid) of the service at `url`, or of a `python -m serving` started here for the duration."""
    if url:
        yield url, None
        return
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "serving"], cwd=ROOT, env={**os.environ, **env,
                               "SERVING_PORT": str(port)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/ready").status_code == 200:
                    break
            time.sleep(0.2)
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(timeout=30)


def service_cpu_s(pid: int | None) -> float | None:
    """CPU seconds (user + system) used so far by the service and its worker processes."""
    if pid is None:
        return None
    parent = psutil.Process(pid)
    return sum(sum(p.cpu_times()[:2]) for p in [parent, *parent.children(recursive=True)])


def service_rss_mb(pid: int) -> float:
    """Resident memory of the service and its featurisation workers."""
    parent = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [parent, *parent.children(recursive=True)]) / 2**20


# ---- the load generator: raw keep-alive HTTP/1.1, so the client costs little of the shared CPU ----

@dataclass
class Kind:
    """One kind of request a client sends: its path, bodies to cycle through, and items per request."""

    name: str
    path: str
    bodies: Callable[[int], bytes]  # request number -> JSON body
    items: int


async def _post(reader, writer, path: str, body: bytes, headers: bytes) -> int:
    writer.write(b"POST %s HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
                 % (path.encode(), len(body), headers) + body)
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    await reader.readexactly(length)
    return int(head[9:12])


async def drive(url: str, clients: list[list[Kind]], seconds: float, headers: bytes) -> dict[str, dict]:
    """Each client sends its kinds in turn, back to back, for `seconds`. Per kind: requests, errors, items/s,
    p50/p99 latency (ms)."""
    host, port = url.removeprefix("http://").split(":")
    latencies: dict[str, list[float]] = {k.name: [] for kinds in clients for k in kinds}
    errors = dict.fromkeys(latencies, 0)
    items = dict.fromkeys(latencies, 0)
    stop = time.perf_counter() + seconds

    async def client(kinds: list[Kind], seed: int) -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        n = seed
        try:
            while time.perf_counter() < stop:
                for kind in kinds:
                    body = kind.bodies(n)
                    start = time.perf_counter()
                    status = await _post(reader, writer, kind.path, body, headers)
                    latencies[kind.name].append(time.perf_counter() - start)
                    errors[kind.name] += status != 200
                    items[kind.name] += kind.items if status == 200 else 0
                    n += 1
        finally:
            writer.close()

    began = time.perf_counter()
    await asyncio.gather(*(client(kinds, 1000 * i) for i, kinds in enumerate(clients)))
    elapsed = time.perf_counter() - began
    out = {}
    for name, values in latencies.items():
        ms = np.asarray(values) * 1000
        out[name] = {"requests": len(values), "errors": errors[name], "items_per_s": round(items[name] / elapsed, 1),
                     "p50_ms": round(float(np.percentile(ms, 50)), 2) if len(ms) else None,
                     "p99_ms": round(float(np.percentile(ms, 99)), 2) if len(ms) else None}
    return out


# An empty endpoint on the same server stack: what HTTP, uvicorn and FastAPI cost here, at this moment.
FLOOR_APP = """
import sys, uvicorn
from fastapi import FastAPI, Request, Response
app = FastAPI()
@app.post("/empty")
async def empty(request: Request) -> Response:
    await request.body()
    return Response(b"{}", media_type="application/json")
uvicorn.run(app, port=int(sys.argv[1]), loop="uvloop", http="httptools", access_log=False, log_level="warning")
"""


def floor_rows(seconds: float) -> list[dict]:
    """1 and 32 clients posting a one-window body to an empty FastAPI endpoint."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", FLOOR_APP, str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            with contextlib.suppress(httpx.TransportError):
                httpx.post(f"{url}/empty")
                break
            time.sleep(0.2)
        kind = Kind("empty endpoint", "/empty", lambda n: b'{"windows": [[[0.1, 0.2, 0.3]]]}', 1)
        rows = []
        for clients in (1, 32):
            load_before, cpu_before = load_average(), service_cpu_s(process.pid)
            kinds = asyncio.run(drive(url, [[kind]] * clients, seconds, b""))
            cpu_ms = round(1000 * (service_cpu_s(process.pid) - cpu_before) / kinds[kind.name]["requests"], 2)
            rows.append({"name": f"floor-{clients}x1", "kinds": kinds, "load_before": load_before,
                         "load_after": load_average(), "service_cpu_ms_per_request": cpu_ms,
                         "clients_by_kind": {kind.name: clients}, "items_by_kind": {kind.name: 1}})
        return rows
    finally:
        process.terminate()
        process.wait(timeout=30)


# ---- request bodies ----

def drug_like(path: Path) -> list[str]:
    if not path.exists():
        return FALLBACK_SMILES
    with path.open() as f:
        return [row["smiles"].strip() for row in csv.DictReader(f)]


def large_smiles(rng: random.Random) -> str:
    """A distinct 500-character chain of 196 heavy atoms (120 random C/N/O, then 76 [CH2]): legal, never cached."""
    return "".join(rng.choice("CCNO") for _ in range(120)) + "[CH2]" * 76


def sensor_body(model: dict, windows: int) -> Callable[[int], bytes]:
    rng = np.random.default_rng(0)
    pool = [json.dumps({"windows": np.round(rng.normal(size=(windows, model["window"], len(model["channels"]))), 3)
                        .tolist()}).encode() for _ in range(16)]
    return lambda n: pool[n % len(pool)]


def smiles_body(smiles: list[str], per_request: int) -> Callable[[int], bytes]:
    return lambda n: json.dumps({"smiles": random.Random(n).sample(smiles, per_request)}).encode()


def spellings(smiles: list[str], per_molecule: int = 64) -> list[str]:
    """Up to `per_molecule` distinct random SMILES of each molecule (RDKit's doRandom), shuffled: strings the
    service has never seen (its graph cache is keyed by the string) for molecules drawn from `smiles`."""
    from rdkit import Chem, rdBase

    rdBase.SeedRandomNumberGenerator(0)
    pool: list[str] = []
    for text in smiles:
        molecule = Chem.MolFromSmiles(text)
        if molecule is not None:
            pool += sorted({Chem.MolToSmiles(molecule, doRandom=True, canonical=False) for _ in range(per_molecule)})
    random.Random(0).shuffle(pool)
    return pool


def new_smiles_body(pool: list[str], per_request: int, seed: int) -> Callable[[int], bytes]:
    """Request n takes the next `per_request` strings of `pool` (each client from its own place in it): new to the
    service until the pool wraps around."""
    return lambda n: json.dumps({"smiles": [pool[(seed * 7919 + n * per_request + i) % len(pool)]
                                            for i in range(per_request)]}).encode()


def large_body(count: int) -> Callable[[int], bytes]:
    return lambda n: json.dumps({"smiles": [large_smiles(random.Random(n * 1000 + i)) for i in range(count)]}).encode()


# ---- in-process reference: the same model on ONNX Runtime in this process, one caller ----

def in_process(predict: Callable[[], object], items: int, seconds: float = 2.0) -> float:
    """Items per second of `predict` called back to back (after two warm-up calls)."""
    predict(), predict()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        predict()
        calls += 1
    return round(calls * items / (time.perf_counter() - start), 1)


def scenarios(models: dict[str, dict], smiles: list[str], pool: list[str], predictors: dict) -> dict[str, dict]:
    """name -> clients (each a list of Kinds), the kind reported as the row, and its in-process reference."""
    sensor, molecule = models.get("sensor"), models.get("molecule")
    out = {}
    if sensor:
        windows = {n: np.random.default_rng(1).normal(size=(n, len(sensor["channels"]), sensor["window"]))
                   .astype(np.float32) for n in (1, 64)}
        reference = {n: (lambda n=n: predictors["sensor"].predict(windows[n])) for n in windows}
        for clients, per in ((1, 1), (32, 1), (8, 64)):
            kind = Kind("sensor", "/v1/sensor/predict", sensor_body(sensor, per), per)
            out[f"sensor-{clients}x{per}"] = {"clients": [[kind]] * clients, "per_request": per,
                                              "in_process": (reference[per], per)}
    if molecule:
        sample = random.Random(0).sample(smiles, 8)
        reference = (lambda: predictors["molecule"].predict(sample), 8)
        for clients, per in ((32, 8), (1, 1)):  # molecules new to the service: the headline
            out[f"molecule-{clients}x{per}"] = {
                "clients": [[Kind("molecule", "/v1/molecule/predict", new_smiles_body(pool, per, c), per)]
                            for c in range(clients)], "per_request": per, "in_process": reference if per == 8 else
                (lambda: predictors["molecule"].predict(sample[:1]), 1)}
        kind = Kind("molecule", "/v1/molecule/predict", smiles_body(smiles, 8), 8)
        out["molecule-32x8-cached"] = {"clients": [[kind]] * 32, "per_request": 8, "in_process": reference}
    if sensor and molecule:
        big = Kind("large", "/v1/molecule/predict", large_body(256), 256)
        small = [Kind("molecule", "/v1/molecule/predict", smiles_body(smiles, 1), 1),
                 Kind("sensor", "/v1/sensor/predict", sensor_body(sensor, 1), 1)]
        out["mixed-large+16"] = {"clients": [[big]] + [small] * 16, "per_request": None, "in_process": None}
    return out


def load_predictors(models: dict[str, dict], tracking_uri: str | None, verify_key: str | None) -> dict:
    """The served versions, loaded here from the same registry and verified with the same key as the service
    (the params file's `tracking` and registry names; `tracking_uri` and `verify_key` win when given)."""
    from contract.registry import RegistrySettings
    from serving.served_models import ServedModels

    registry = RegistrySettings.from_params(ROOT / "params.yaml")
    store = ServedModels(tracking_uri or registry.tracking_uri, {f: registry.model_names[f] for f in models},
                       "champion", Path(verify_key or registry.verify_key), prefer_cuda=False)
    store.refresh()
    return {family: store.get(family).predictor for family in models}


def markdown(report: dict) -> str:
    lines = [f"# Serving benchmark ({report['when']})", "",
             f"{report['machine']}; models: {report['models']}; {report['seconds']} s per row; service settings "
             f"{report['service_env'] or 'defaults'}.", "",
             "| row | kind | clients | items/request | requests | errors | items/s | p50 ms | p99 ms "
             "| in-process items/s | service / in-process | service CPU ms/request | load before / after |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        for kind, r in row["kinds"].items():
            ratio = round(r["items_per_s"] / row["in_process"], 2) if row.get("in_process") else ""
            lines.append(f"| {row['name']} | {kind} | {row['clients_by_kind'][kind]} | {row['items_by_kind'][kind]} "
                         f"| {r['requests']} | {r['errors']} | {r['items_per_s']} | {r['p50_ms']} | {r['p99_ms']} "
                         f"| {row.get('in_process') or ''} | {ratio} | {row['service_cpu_ms_per_request']} "
                         f"| {row['load_before']} / {row['load_after']} |")
    if soak := report.get("soak"):
        lines += ["", f"Soak: {soak['seconds']} s at {soak['clients']} clients ({soak['kind']}): service RSS "
                      f"{soak['rss_mb'][0]:.0f} MB at the start of the measured part, {soak['rss_mb'][-1]:.0f} MB at the "
                      f"end, {max(soak['rss_mb']):.0f} MB at most (drift {soak['drift_percent']:+.1f} %); "
                      f"{soak['result']['requests']} requests, {soak['result']['errors']} errors, p99 "
                      f"{soak['result']['p99_ms']} ms."]
    lines += ["", *[f"- {note}" for note in report["notes"]]]
    return "\n".join(lines) + "\n"


def soak(url: str, pid: int, model: dict, seconds: float, headers: bytes) -> dict:
    """32 sensor clients for `seconds`, the service's RSS sampled every 5 s (after a 10 s warm-up)."""
    kind = Kind("sensor", "/v1/sensor/predict", sensor_body(model, 1), 1)
    asyncio.run(drive(url, [[kind]] * 32, 10, headers))
    samples: list[float] = []

    async def run() -> dict:
        async def sample() -> None:
            while True:
                samples.append(round(service_rss_mb(pid), 1))
                await asyncio.sleep(5)

        sampler = asyncio.create_task(sample())
        result = await drive(url, [[kind]] * 32, seconds, headers)
        sampler.cancel()
        samples.append(round(service_rss_mb(pid), 1))
        return result["sensor"]

    result = asyncio.run(run())
    return {"seconds": seconds, "clients": 32, "kind": "sensor, 1 window", "rss_mb": samples,
            "drift_percent": round(100 * (samples[-1] - samples[0]) / samples[0], 1), "result": result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="an already running service (default: start one)")
    parser.add_argument("--tiny", type=Path, help="build (once) and serve the tests' tiny models from a registry here")
    parser.add_argument("--seconds", type=float, default=20.0, help="duration of each row")
    parser.add_argument("--only", help="comma-separated row names (default: all; `floor` for the floor rows)")
    parser.add_argument("--soak-seconds", type=float, default=0, help="RSS soak at 32 clients (0: none)")
    parser.add_argument("--smiles", type=Path, default=ESOL, help="CSV with a `smiles` column: drug-like molecules")
    parser.add_argument("--name", default="serving", help="results file name in bench/results, without extension")
    args = parser.parse_args()
    api_key = os.environ.get("SERVING_API_KEY")
    headers = f"Authorization: Bearer {api_key}\r\n".encode() if api_key else b""
    tracking_uri, models_label = os.environ.get("MLFLOW_TRACKING_URI"), "the project's champions"
    env = {}
    if args.tiny:
        from tests.integration.test_serving_registry import shared_registry

        database = args.tiny / "registry" / "mlflow.db"
        tracking_uri = f"sqlite:///{database}" if database.exists() else shared_registry(args.tiny).uri
        env["SERVING_VERIFY_KEY"] = str(args.tiny / "registry" / "keys" / "signing.pub")
        models_label = "the tests' tiny models (tests/integration/test_serving_registry.py)"
    if tracking_uri:
        env["MLFLOW_TRACKING_URI"] = tracking_uri
    env["SERVING_PREFER_CUDA"] = os.environ.get("SERVING_PREFER_CUDA", "false")
    service_env = {k: v for k, v in os.environ.items() if k.startswith("SERVING_")}
    smiles = drug_like(args.smiles)
    pool = spellings(smiles)
    source = "ESOL" if smiles is not FALLBACK_SMILES else ("the 16 fallback molecules: ../shared/data is missing, so "
                                                           "the pool wraps around and the cache answers part of it")

    with service(args.url, env) as (url, pid):
        info = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {api_key}"} if api_key else {}).json()
        models = {m["family"]: m for m in info["models"]}
        notes = [f"{family}: not benchmarked, {problem}" for family, problem in info["problems"].items()]
        predictors = load_predictors(models, tracking_uri,
                                     env.get("SERVING_VERIFY_KEY") or os.environ.get("SERVING_VERIFY_KEY"))
        rows = []
        for name, scenario in scenarios(models, smiles, pool, predictors).items():
            if args.only and name not in args.only.split(","):
                continue
            if name == "molecule-32x8-cached":  # one pass over the drug-like SMILES fills the graph cache
                for start in range(0, len(smiles), 256):
                    httpx.post(f"{url}/v1/molecule/predict", json={"smiles": smiles[start:start + 256]}, timeout=120,
                               headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
            asyncio.run(drive(url, scenario["clients"][:4], 1.0, headers))  # warm-up
            load_before, cpu_before = load_average(), service_cpu_s(pid)
            kinds = asyncio.run(drive(url, scenario["clients"], args.seconds, headers))
            requests = sum(k["requests"] for k in kinds.values())
            cpu_ms = round(1000 * (service_cpu_s(pid) - cpu_before) / requests, 2) if pid and requests else None
            row = {"name": name, "kinds": kinds, "load_before": load_before, "load_after": load_average(),
                   "service_cpu_ms_per_request": cpu_ms,
                   "clients_by_kind": {k: sum(any(x.name == k for x in c) for c in scenario["clients"]) for k in kinds},
                   "items_by_kind": {k.name: k.items for c in scenario["clients"] for k in c}}
            if scenario["in_process"]:
                row["in_process"] = in_process(*scenario["in_process"])
            rows.append(row)
            print(json.dumps(row), flush=True)
        if not args.only or "floor" in args.only:
            rows += floor_rows(args.seconds)
        soaked = soak(url, pid, models["sensor"], args.soak_seconds, headers) if args.soak_seconds and pid else None
    notes += [
        "clients: keep-alive HTTP/1.1 connections, each sending its next request as soon as the answer arrives",
        "floor rows: an empty FastAPI endpoint on the same uvicorn settings (uvloop, httptools), driven the same way "
        "in the same run: the most any endpoint could do on this machine at that moment",
        "service CPU ms/request: user + system time of the service's processes during the row, per request "
        "(all kinds together); less sensitive to the other jobs on a shared machine than the latencies",
        "in-process: the same registered model version loaded in the benchmark process, one caller, the row's "
        "request size per call (molecules: featurisation included, no cache)",
        f"molecule-32x8 and molecule-1x1 send molecules new to the service: distinct random SMILES (RDKit's "
        f"doRandom) of {len(smiles)} molecules ({len(pool)} strings; {source}), so the graph cache "
        "(SERVING_FEATURE_CACHE_MB, keyed by the string) never answers; molecule-32x8-cached draws from ESOL's "
        "SMILES sent once before the row, which the cache answers; the mixed row's small requests draw from that "
        "cached set; the large request is 256 distinct 500-character SMILES of 196 heavy atoms, new every time",
    ]
    report = {"script": "bench/serving.py", "when": time.strftime("%Y-%m-%d %H:%M"), "seconds": args.seconds,
              "models": models_label,
              "machine": machine(),
              "service_env": service_env, "rows": rows, "soak": soaked, "notes": notes}
    write_results(args.name, report, markdown)


if __name__ == "__main__":
    main()
