"""Faults injected into a live `python -m serving` (two workers) under load from 8 clients, each sending 4 sensor
windows per request and keeping the `prediction_id`s it was given (not a test):

- `kill`: the whole service killed outright (SIGKILL to its process group), then started again on the same store and
  journal: acknowledged predictions missing from the store afterwards.
- `read_only`: the prediction store (a PostgreSQL cluster started here) read-only for `--read-only-s` seconds, then
  writable: acknowledged predictions missing, how long the store took to hold them all, whether the service said
  its log was failing meanwhile and went on without a restart.
- `reload`: the champion alias moved and one worker asked to reload, `--reloads` times: how long the reload took to
  answer, and how long after it was asked any answer still came from the old version.

    .venv/bin/python bench/fault_injection.py                  # all three, 60 s read-only
    .venv/bin/python bench/fault_injection.py --faults reload --reloads 10

The registry is the integration tests' tiny one (real ONNX models, built in a temporary folder): the faults are the
service's, not the models'. Results: bench/results/fault_injection.json, and fault_injection.md generated from it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from mlflow import MlflowClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.results_files import machine, write_results  # noqa: E402
from contract.prediction_store import engine_for, find_predictions  # noqa: E402
from contract.registry import CHAMPION  # noqa: E402
from tests.integration.postgres import set_read_only, throwaway_cluster  # noqa: E402
from tests.integration.test_serving_registry import (  # noqa: E402
    SENSOR_NAME, Registry, build_registry, free_port, sensor_windows, tiny_models,
)

CLIENTS = 8
ADMIN_KEY = "fault-injection"
FAULTS = ("kill", "read_only", "reload")


class Service:
    """`python -m serving` with two workers in a process group of its own (so that it can be killed whole)."""

    def __init__(self, registry: Registry, store: str, folder: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "MLFLOW_TRACKING_URI": registry.uri, "SERVING_VERIFY_KEY": str(registry.verify_key),
                    "SERVING_PORT": str(self.port), "SERVING_PREFER_CUDA": "false", "SERVING_WORKERS": "2",
                    "SERVING_FEATURIZE_WORKERS": "1", "SERVING_POLL_SECONDS": "3600", "SERVING_ADMIN_KEY": ADMIN_KEY,
                    "SERVING_PREDICTION_STORE": store, "SERVING_PREDICTION_JOURNAL": str(folder / "journal")}
        self.log = folder / "service.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as output:
            self.process = subprocess.Popen([sys.executable, "-m", "serving"], cwd=ROOT, env=self.env,
                                            start_new_session=True, stdout=output, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/ready", timeout=5).status_code == 200:
                    return
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"error: the service did not start; see {self.log}")
            time.sleep(0.2)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=60)


class Load:
    """CLIENTS threads sending windows until stopped; `answers` holds (sent, answered, version, ids) per answer."""

    def __init__(self, url: str):
        self.url, self.answers, self.stop = url, [], threading.Event()
        self._pool = concurrent.futures.ThreadPoolExecutor(CLIENTS)
        self._body = {"windows": [w.T.tolist() for w in sensor_windows(4, seed=9)]}

    def __enter__(self) -> "Load":
        self._runs = [self._pool.submit(self._client) for _ in range(CLIENTS)]
        return self

    def __exit__(self, *_) -> None:
        self.stop.set()
        for run in self._runs:
            run.result()
        self._pool.shutdown()

    @property
    def ids(self) -> list[str]:
        return [key for *_, ids in self.answers for key in ids]

    def _client(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as session:
            while not self.stop.is_set():
                sent = time.monotonic()
                try:
                    answer = session.post("/v1/sensor/predict", json=self._body)
                except httpx.TransportError:  # the service is gone
                    return
                if answer.status_code == 200:
                    body = answer.json()
                    self.answers.append((sent, time.monotonic(), body["model"]["version"],
                                         [p["prediction_id"] for p in body["predictions"]]))


def missing_after(store: str, ids: list[str], timeout_s: float) -> tuple[int, float]:
    """(acknowledged ids still missing from the store, seconds until none was) after waiting up to `timeout_s`."""
    engine, start = engine_for(store), time.monotonic()
    try:
        while (missing := len(set(ids) - set(find_predictions(engine, ids)))) and \
                time.monotonic() - start < timeout_s:
            time.sleep(0.25)
        return missing, time.monotonic() - start
    finally:
        engine.dispose()


def kill_fault(registry: Registry, folder: Path, load_s: float) -> dict:
    store = f"sqlite:///{folder / 'predictions.db'}"
    service = Service(registry, store, folder)
    service.start()
    with Load(service.url) as load:
        time.sleep(load_s)
        service.kill()
    service.start()
    try:
        missing, seconds = missing_after(store, load.ids, 120)
    finally:
        service.kill()
    return {"acknowledged": len(load.ids), "missing": missing, "seconds_to_stored": round(seconds, 2)}


def read_only_fault(registry: Registry, folder: Path, read_only_s: float) -> dict:
    with throwaway_cluster(folder / "postgres") as store:
        service = Service(registry, store, folder)
        service.start()
        states: set[str] = set()
        try:
            with Load(service.url) as load:
                time.sleep(2)
                set_read_only(store, True)
                began = len(load.ids)
                until = time.monotonic() + read_only_s
                while time.monotonic() < until:
                    with contextlib.suppress(httpx.TransportError):
                        states.add(httpx.get(f"{service.url}/ready", timeout=5).json()["prediction_log"])
                    time.sleep(0.5)
                during = len(load.ids) - began
                set_read_only(store, False)
                time.sleep(2)
            missing, seconds = missing_after(store, load.ids, 300)
            restarted = service.process.poll() is not None
        finally:
            service.kill()
    return {"read_only_s": read_only_s, "acknowledged": len(load.ids), "acknowledged_while_read_only": during,
            "missing": missing, "seconds_to_stored": round(seconds, 2), "service_restarted": restarted,
            "ready_said": sorted(state.split(":")[0] for state in states)}


def reload_fault(registry: Registry, folder: Path, reloads: int) -> dict:
    service = Service(registry, f"sqlite:///{folder / 'predictions.db'}", folder)
    service.start()
    client, rows = MlflowClient(registry.uri), []
    try:
        with Load(service.url) as load:
            for target in ["1", "2"] * (reloads // 2) + ["1"] * (reloads % 2):
                time.sleep(1)
                client.set_registered_model_alias(SENSOR_NAME, CHAMPION, target)
                asked = time.monotonic()
                answer = httpx.post(f"{service.url}/v1/admin/reload", json={}, timeout=60,
                                    headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json()
                answered = time.monotonic()
                time.sleep(1.5)
                old = [sent - asked for sent, _, version, _ in list(load.answers)
                       if sent >= asked and version != target]
                rows.append({"to_version": target, "answer_s": round(answered - asked, 3), "workers": answer["workers"],
                             "lagging": answer["lagging"], "old_answers_after_ask": len(old),
                             "last_old_answer_sent_after_ask_s": round(max(old), 3) if old else 0.0})
    finally:
        service.kill()
    return {"reloads": rows, "answer_s_median": round(statistics.median(r["answer_s"] for r in rows), 3),
            "answer_s_max": max(r["answer_s"] for r in rows),
            "stale_s_max": max(r["last_old_answer_sent_after_ask_s"] for r in rows)}


def markdown(report: dict) -> str:
    lines = [f"# Faults under load ({report['when']})", "",
             f"A live `python -m serving` (2 workers) on the integration tests' tiny registry, {CLIENTS} clients "
             f"sending 4 sensor windows per request; {report['machine']}. Made by `bench/fault_injection.py`.", ""]
    if "kill" in report:
        kill = report["kill"]
        lines += ["## The whole service killed outright (SIGKILL), then started again", "",
                  f"**{kill['missing']} of {kill['acknowledged']} acknowledged predictions missing** from the store "
                  f"after the restart (all stored {kill['seconds_to_stored']} s after it was ready).", ""]
    if "read_only" in report:
        ro = report["read_only"]
        lines += [f"## The store (PostgreSQL) read-only for {ro['read_only_s']:g} s, then writable", "",
                  f"**{ro['missing']} of {ro['acknowledged']} acknowledged predictions missing** "
                  f"({ro['acknowledged_while_read_only']} of them answered while the store was read-only); all "
                  f"stored {ro['seconds_to_stored']} s after it was writable again, "
                  f"{'after a restart' if ro['service_restarted'] else 'without a restart'}. `/ready` said: "
                  f"{'; '.join(ro['ready_said'])}.", ""]
    if "reload" in report:
        reload = report["reload"]
        lines += ["## Reload asked of one worker (the champion moved each time)", "",
                  f"Answered in {reload['answer_s_median']} s (median), {reload['answer_s_max']} s at most; an answer "
                  f"from the old version came to a request sent at most **{reload['stale_s_max']} s** after the "
                  "reload was asked.", "",
                  "| to version | reload answered (s) | workers | lagging | old answers after the ask | last one sent "
                  "after the ask (s) |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['to_version']} | {r['answer_s']} | {r['workers']} | {', '.join(r['lagging']) or '-'} | "
                  f"{r['old_answers_after_ask']} | {r['last_old_answer_sent_after_ask_s']} |"
                  for r in reload["reloads"]]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fault-injection-") as folder:
        yield Path(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", nargs="+", choices=FAULTS, default=list(FAULTS))
    parser.add_argument("--read-only-s", type=float, default=60.0, help="how long the store stays read-only")
    parser.add_argument("--kill-after-s", type=float, default=5.0, help="load before the service is killed")
    parser.add_argument("--reloads", type=int, default=6)
    args = parser.parse_args()
    report = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": machine(), "clients": CLIENTS}
    with scratch() as folder:
        registry = build_registry(folder / "registry", tiny_models(folder / "models"))
        for fault in args.faults:
            print(f"fault: {fault}", flush=True)
            with scratch() as run:
                report[fault] = {"kill": lambda: kill_fault(registry, run, args.kill_after_s),
                                 "read_only": lambda: read_only_fault(registry, run, args.read_only_s),
                                 "reload": lambda: reload_fault(registry, run, args.reloads)}[fault]()
    write_results("fault_injection", report, markdown)


if __name__ == "__main__":
    main()
