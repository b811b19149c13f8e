"""What the prediction log and shadow mode cost (not a test): throughput at 32 concurrent clients with the log
off, on, and on with SERVING_ROLLOUT=shadow, side by side, for each loaded model family.

    .venv/bin/python bench/logging_overhead.py                    # SQLite store in a temp folder
    .venv/bin/python bench/logging_overhead.py --store postgresql://user@host/db --rounds 5

Three services run at once on the project's registry (MLFLOW_TRACKING_URI and SERVING_VERIFY_KEY name another):
SERVING_PREDICTION_LOG=false, =true (writing to `--store`, by default a fresh SQLite file, never the project's own
store), and =true with SERVING_ROLLOUT=shadow (the `challenger` alias runs beside every answer and is logged too; a
family whose challenger is its champion's version has nothing to shadow, and the notes say so). The load goes to
one at a time, rotating which comes first in each round, and each mode's median over the rounds is compared:
throughput, and the CPU time the service (with its featurisation workers) spends per request. Then, apart from
any HTTP load, the CPU time the log itself spends per prediction (request path, sender thread and writer process)
is measured from this process, the figure a busy machine disturbs least.
Sensor requests carry `units` and `times` as a fleet would send them. Results: bench/results/logging_overhead.json
(or `--name`.json) and the .md beside it, with the rows the logged service wrote and dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import psutil
from sqlalchemy import func, select

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.results_files import machine, write_results  # noqa: E402
from bench.serving import FALLBACK_SMILES, Kind, drive, free_port  # noqa: E402
from contract.card import ModelCard  # noqa: E402
from contract.prediction_store import engine_for, predictions  # noqa: E402
from serving.families.sensor import SensorItems  # noqa: E402
from serving.family import family_class  # noqa: E402
from serving.loading import LoadedModel  # noqa: E402
from serving.log_rows import rows_of  # noqa: E402
from serving.journal import Journal  # noqa: E402
from serving.log_writer import LINGER_S, StoreWriter  # noqa: E402
from serving.metrics import ServiceMetrics  # noqa: E402
from serving.prediction_log import PredictionLog  # noqa: E402
from serving.settings import ServingSettings  # noqa: E402

MODES = ("off", "on", "shadow")
GROUP = 50  # predictions per transaction in the in-process measurement: about half a second at 100 requests/s


@contextlib.contextmanager
def logged(mode: str, store: str) -> Iterator[tuple[str, psutil.Process]]:
    """`python -m serving` with the prediction log off, on (writing to `store`), or on in shadow mode: its URL
    and process."""
    port = free_port()
    env = {**os.environ, "SERVING_PORT": str(port), "SERVING_PREDICTION_LOG": str(mode != "off").lower(),
           "SERVING_PREDICTION_STORE": store, "SERVING_ROLLOUT": "shadow" if mode == "shadow" else "off"}
    process = subprocess.Popen([sys.executable, "-m", "serving"], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/ready").status_code == 200:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the {mode} service did not become ready (exit status {process.poll()}): is there "
                                   f"a registry? (MLFLOW_TRACKING_URI, SERVING_VERIFY_KEY)")
            time.sleep(0.2)
        yield url, psutil.Process(process.pid)
    finally:
        process.terminate()
        process.wait(timeout=30)


def cpu_seconds(process: psutil.Process) -> float:
    """CPU time used so far by the service and its featurisation workers."""
    total = 0.0
    for each in [process, *process.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = each.cpu_times()
            total += times.user + times.system
    return total


def bodies(model: dict) -> list[dict]:
    """16 one-item bodies: a random sensor window (T, C), or one of bench/serving.py's fallback SMILES."""
    if model["family"] == "sensor":
        rng = np.random.default_rng(0)
        return [{"windows": np.round(rng.normal(size=(1, model["window"], len(model["channels"]))), 3).tolist()}
                for _ in range(16)]
    return [{"smiles": [smiles]} for smiles in FALLBACK_SMILES[:16]]


def fleet_bodies(model: dict) -> list[dict]:
    """The one-item bodies; sensor windows also name their unit and time, as a fleet sends them."""
    return [{**body, "units": [f"unit-{i % 8}"], "times": [float(i)]} if model["family"] == "sensor" else body
            for i, body in enumerate(bodies(model))]


def load(url: str, path: str, payloads: list[dict], clients: int, seconds: float, headers: dict) -> dict:
    """bench/serving.py's keep-alive load generator: `clients` clients posting `payloads` in turn for `seconds`.
    Returns requests, errors, throughput_rps (answered ones) and p99_ms."""
    encoded = [json.dumps(payload).encode() for payload in payloads]
    raw = "".join(f"{key}: {value}\r\n" for key, value in headers.items()).encode()
    kind = Kind("load", path, lambda n: encoded[n % len(encoded)], 1)
    result = asyncio.run(drive(url, [[kind]] * clients, seconds, raw))["load"]
    return {"requests": result["requests"], "errors": result["errors"], "throughput_rps": result["items_per_s"],
            "p99_ms": result["p99_ms"]}


def log_cpu_ms(model: dict, count: int, scratch: str, journal: bool = True) -> float:
    """CPU milliseconds the log spends per one-item prediction, measured apart from any HTTP load: the request path
    and sender thread in this process plus the writer process (SQLite store), `count` predictions written GROUP
    per transaction, with the write-ahead journal or without. The writer's start-up is not counted."""
    card = ModelCard.model_construct(family=model["family"], channels=model.get("channels"))
    served = LoadedModel(model["family"], model["name"], model["version"], model["alias"], "", card, None)
    writer = StoreWriter(engine_for(f"sqlite:///{scratch}/{model['family']}-cpu.db"), rows_of, capacity_rows=10 * GROUP,
                         retention_days=1, max_rows=10 * count, prune_every_s=3600, metrics=ServiceMetrics(),
                         journal=Journal(Path(scratch) / f"{model['family']}-cpu.journal", "bench") if journal else None)
    log = PredictionLog(writer)
    log.start()
    payloads = bodies(model)
    windows = [np.array(body["windows"], dtype=np.float32) for body in payloads] if model["family"] == "sensor" else []

    family = family_class(model["family"])(ServingSettings(prediction_store=f"sqlite:///{scratch}/units.db"),
                                           ServiceMetrics())

    loop = asyncio.new_event_loop()

    def record(i: int) -> None:
        """One prediction's record, waited for until it is in the journal (as an answer waits)."""
        if model["family"] == "sensor":
            answers = [{"failure_probability": 0.25, "alert": False, "uncertainty": 0.01}]
            items = SensorItems(windows[i % len(windows)], [f"unit-{i % 8}"], [float(i)])
            loop.run_until_complete(log.record(family, items, answers, served))
        else:
            smiles = payloads[i % len(payloads)]["smiles"][0]
            loop.run_until_complete(log.record(family, [smiles], [{"smiles": smiles, "canonical_smiles": smiles,
                                                                   "value": 1.0, "uncertainty": 0.1}], served))

    record(-1)
    writer.flush(timeout_s=60)  # the writer process has started and written once
    writer_process = psutil.Process(writer._process.pid)
    start, writer_start = time.process_time(), sum(writer_process.cpu_times()[:2])
    for i in range(count):
        record(i)
        if (i + 1) % GROUP == 0:
            writer.flush(timeout_s=60)
    writer.flush(timeout_s=60)
    used = time.process_time() - start + sum(writer_process.cpu_times()[:2]) - writer_start
    log.stop(timeout_s=30)
    loop.close()
    return 1000 * used / count


def stored_rows(store: str) -> dict[str, int]:
    """Rows in the store per family and role ("sensor/champion": n), once the writers have had time to write."""
    time.sleep(2 * LINGER_S + 1)
    engine = engine_for(store)
    query = select(predictions.c.family, predictions.c.role, func.count()).group_by(predictions.c.family,
                                                                                     predictions.c.role)
    with engine.connect() as connection:
        counts = {f"{family}/{role}": count for family, role, count in connection.execute(query)}
    engine.dispose()
    return counts


def markdown(report: dict) -> str:
    lines = [f"# Prediction log overhead ({report['when']})", "",
             f"{report['machine']}; models: {report.get('models', 'not recorded')}; {report['clients']} clients, "
             f"one item per request, {report['seconds']} s per run, "
             f"{report['rounds']} rounds rotating log off/on/shadow; store: {report['store']}; loopback.", "",
             "| model | version | req/s log off | req/s log on | throughput cost | req/s shadow | shadow cost | "
             "service CPU ms/request off | on | shadow | CPU cost on | shadow | p99 ms off | on | shadow | "
             "req/s runs off | on | shadow |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in report["summary"]:
        lines.append(f"| {row['family']} | {row['version']} | {row['off_rps']} | {row['on_rps']} | {row['cost_percent']} % "
                     f"| {row['shadow_rps']} | {row['shadow_cost_percent']} % | {row['off_cpu_ms']} | {row['on_cpu_ms']} "
                     f"| {row['shadow_cpu_ms']} | {row['cpu_cost_percent']} % | {row['shadow_cpu_cost_percent']} % "
                     f"| {row['off_p99_ms']} | {row['on_p99_ms']} | {row['shadow_p99_ms']} | {row['off_runs']} "
                     f"| {row['on_runs']} | {row['shadow_runs']} |")
    lines += ["", "Measured apart from the HTTP load (request path, sender thread and writer process, SQLite, "
              f"{GROUP} predictions per transaction):", "",
              "| model | log CPU ms per prediction | share of the service's CPU per request (log off) | of which "
              "the journal, ms | share |", "|---|---|---|---|---|"]
    lines += [f"| {row['family']} | {row['log_cpu_ms_in_process']} | {row['log_cpu_share_percent']} % | "
              f"{row.get('journal_cpu_ms_in_process', '-')} | {row.get('journal_cpu_share_percent', '-')} % |"
              for row in report["summary"]]
    lines += ["", f"Rows in the stores by family and role (every answered item has a champion row; in shadow mode "
              f"the shadow rows show how many of them the challenger ran): {report['stored_rows']}", "",
              *[f"- {note}" for note in report["notes"]]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each run")
    parser.add_argument("--rounds", type=int, default=3, help="runs per mode and family")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--in-process", type=int, default=2000,
                        help="predictions logged in the in-process CPU measurement, per family")
    parser.add_argument("--store", help="SQLAlchemy URL of the store the logged service writes "
                                        "(default: a SQLite file in a temp folder)")
    parser.add_argument("--models", help="what the registry holds, for the results (default: the project's "
                                         "champions, or the registry of MLFLOW_TRACKING_URI)")
    parser.add_argument("--name", default="logging_overhead", help="results file name in bench/results, without "
                                                                   "extension")
    args = parser.parse_args()
    headers = {"Authorization": f"Bearer {os.environ['SERVING_API_KEY']}"} if os.environ.get("SERVING_API_KEY") else {}
    scratch = tempfile.mkdtemp(prefix="logging-overhead-")  # the stores written here, removed at the end
    store = args.store or f"sqlite:///{scratch}/predictions.db"

    runs: list[dict] = []
    shadow_store = f"sqlite:///{scratch}/shadow.db" if args.store is None else store
    with logged("off", store) as off, logged("on", store) as on, logged("shadow", shadow_store) as shadow:
        services = {"off": off, "on": on, "shadow": shadow}
        info = httpx.get(f"{on[0]}/v1/models", headers=headers).json()
        notes = [f"{family}: not benchmarked, {problem}" for family, problem in info["problems"].items()]
        shadowed = {m["family"]: m["version"] for m in
                    httpx.get(f"{shadow[0]}/v1/models", headers=headers).json()["rollout"]["challengers"]}
        notes += [f"{model['family']}: shadow runs challenger version {shadowed[model['family']]}"
                  if model["family"] in shadowed else
                  f"{model['family']}: no challenger apart from the champion, the shadow row measures no shadow call"
                  for model in info["models"]]
        for model in info["models"]:
            payloads, path = fleet_bodies(model), f"/v1/{model['family']}/predict"
            for url, _ in services.values():
                load(url, path, payloads, 2, 1.0, headers)  # warm-up
            for round_ in range(args.rounds):
                for mode in MODES[round_ % len(MODES):] + MODES[:round_ % len(MODES)]:
                    url, process = services[mode]
                    before = cpu_seconds(process)
                    result = load(url, path, payloads, args.clients, args.seconds, headers)
                    cpu_ms = 1000 * (cpu_seconds(process) - before) / max(result["requests"], 1)
                    runs.append({"family": model["family"], "version": model["version"], "mode": mode,
                                 "round": round_, **result, "service_cpu_ms_per_request": round(cpu_ms, 3)})
                    print(json.dumps(runs[-1]))
        counts = {"on": stored_rows(store), "shadow": stored_rows(shadow_store)} if shadow_store != store else \
            {"on and shadow": stored_rows(store)}
        in_process, journal_share = {}, {}
        for model in info["models"]:  # with and without the journal, alternating: the median of each
            cpu_runs = {with_journal: [] for with_journal in (True, False)}
            for _ in range(3):
                for with_journal in cpu_runs:
                    cpu_runs[with_journal].append(log_cpu_ms(model, args.in_process, scratch, with_journal))
            in_process[model["family"]] = statistics.median(cpu_runs[True])
            journal_share[model["family"]] = in_process[model["family"]] - statistics.median(cpu_runs[False])
    shutil.rmtree(scratch)

    summary = []
    for model in info["models"]:
        mine = {mode: [r for r in runs if r["family"] == model["family"] and r["mode"] == mode] for mode in MODES}
        median = {key: {mode: statistics.median(r[key] for r in mine[mode]) for mode in MODES}
                  for key in ("throughput_rps", "p99_ms", "service_cpu_ms_per_request")}
        rps, cpu = median["throughput_rps"], median["service_cpu_ms_per_request"]
        summary.append({"family": model["family"], "version": model["version"],
                        "off_rps": round(rps["off"], 1), "on_rps": round(rps["on"], 1),
                        "cost_percent": round(100 * (1 - rps["on"] / rps["off"]), 1),
                        "off_cpu_ms": round(cpu["off"], 3), "on_cpu_ms": round(cpu["on"], 3),
                        "cpu_cost_percent": round(100 * (cpu["on"] / cpu["off"] - 1), 1),
                        "log_cpu_ms_in_process": round(in_process[model["family"]], 3),
                        "log_cpu_share_percent": round(100 * in_process[model["family"]] / cpu["off"], 1),
                        "journal_cpu_ms_in_process": round(journal_share[model["family"]], 3),
                        "journal_cpu_share_percent": round(100 * journal_share[model["family"]] / cpu["off"], 1),
                        "shadow_rps": round(rps["shadow"], 1),
                        "shadow_cost_percent": round(100 * (1 - rps["shadow"] / rps["off"]), 1),
                        "shadow_cpu_ms": round(cpu["shadow"], 3),
                        "shadow_cpu_cost_percent": round(100 * (cpu["shadow"] / cpu["off"] - 1), 1),
                        **{f"{mode}_p99_ms": median["p99_ms"][mode] for mode in MODES},
                        **{f"{mode}_runs": ", ".join(str(r["throughput_rps"]) for r in mine[mode]) for mode in MODES}})
    shown_store = "SQLite in a temp folder" if args.store is None else store.split("://")[0]  # no credentials
    models = args.models or ("the registry of MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI")
                             else "the project's champions")
    report = {"script": "bench/logging_overhead.py", "models": models, "when": time.strftime("%Y-%m-%d %H:%M"),
              "seconds": args.seconds, "rounds": args.rounds,
              "clients": args.clients, "store": shown_store,
              "machine": machine(),
              "summary": summary, "stored_rows": counts, "runs": runs,
              "notes": notes + ["target: logging and shadow mode each cost at most 10 % of throughput (vs log off)"]}
    write_results(args.name, report, markdown)


if __name__ == "__main__":
    main()
