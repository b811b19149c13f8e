"""Reliability report of the prediction service (not a test): schemathesis draws valid and invalid requests for
every route of the service's own OpenAPI schema and sends them to a live `python -m serving`; every answer is
checked: no server error (status >= 500), and a documented status, content type and body.

    .venv/bin/python bench/reliability.py                     # >= 2,000 requests, registry chosen as below
    .venv/bin/python bench/reliability.py --registry tiny --requests 500
    .venv/bin/python bench/reliability.py --url http://127.0.0.1:8000 --admin-key KEY

`--registry project` serves the project's registry (params.yaml, after `make run`); `tiny` builds the integration
tests' registry of tiny real ONNX models in a temporary folder; `auto` (default) takes the project's when its
store exists. Results: bench/results/reliability.json, and reliability.md generated from it.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.errors import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance, response_schema_conformance, status_code_conformance,
)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.results_files import machine, write_results  # noqa: E402
SCHEMA_CHECKS = [status_code_conformance, content_type_conformance, response_schema_conformance]
MODES = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
EXAMPLES_SHOWN = 20


def project_store_exists(params_file: Path) -> bool:
    from contract.registry import RegistrySettings, sqlite_file

    database = sqlite_file(RegistrySettings.from_params(params_file).tracking_uri)
    return database is None or database.is_file()


@contextlib.contextmanager
def registry_env(choice: str) -> Iterator[tuple[str, dict[str, str]]]:
    """(which registry, the environment that points `python -m serving` at it)."""
    if choice == "auto":
        choice = "project" if project_store_exists(ROOT / "params.yaml") else "tiny"
    if choice == "project":
        yield "the project's registry (params.yaml)", {}
        return
    from tests.integration.test_serving_registry import build_registry, tiny_models

    with tempfile.TemporaryDirectory(prefix="reliability-") as scratch:
        registry = build_registry(Path(scratch) / "registry", tiny_models(Path(scratch) / "models"))
        yield "the integration tests' tiny registry", {"MLFLOW_TRACKING_URI": registry.uri,
                                                         "SERVING_VERIFY_KEY": str(registry.verify_key)}


@contextlib.contextmanager
def service(env: dict[str, str], admin_key: str, ready_seconds: float = 120) -> Iterator[str]:
    """A `python -m serving` on a free loopback port with the admin routes enabled, until the block ends."""
    from tests.integration.test_serving_registry import free_port

    port = free_port()
    env = {**os.environ, **env, "SERVING_PORT": str(port), "SERVING_ADMIN_KEY": admin_key,
           "SERVING_PREFER_CUDA": "false", "SERVING_POLL_SECONDS": "3600"}
    process = subprocess.Popen([sys.executable, "-m", "serving"], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_seconds
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/ready").status_code == 200:
                    break
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit(f"error: the service at {url} was not ready within {ready_seconds:g} s")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def sender(operation, mode, examples: int, headers: dict[str, str], records: list[dict], violations: list[dict]):
    """A hypothesis test that sends `examples` requests drawn for `operation` in `mode` and records each answer."""

    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(mode))
    def send(case) -> None:
        response = case.call(headers=headers, timeout=60)
        record = {"route": operation.label, "mode": mode.value, "status": response.status_code}
        try:
            case.validate_response(response, checks=SCHEMA_CHECKS, headers=headers)
        except (AssertionError, FailureGroup) as failure:  # one failed check, or a group of them
            failures = failure.exceptions if isinstance(failure, FailureGroup) else [failure]
            record["violation"] = "; ".join(getattr(f, "title", type(f).__name__) for f in failures)
            violations.append({**record, "request": case.as_curl_command(headers=headers),
                               "answer": response.text[:300], "failure": str(failure)[:2000]})
        records.append(record)

    return send


def fuzz(url: str, total: int, headers: dict[str, str]) -> tuple[list[dict], list[dict]]:
    """At least `total` requests, spread evenly over routes and modes, in rounds with fresh seeds.
    Returns one record per request (route, mode, status, violation if any) and the violations in full."""
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    per_round = max(1, total // (len(operations) * len(MODES)))
    records: list[dict] = []
    violations: list[dict] = []
    for round_number in range(50):
        if len(records) >= total:
            break
        for operation in operations:
            for mode in MODES:
                with contextlib.suppress(Unsatisfiable):  # a route without parameters has no invalid request
                    seed(round_number)(sender(operation, mode, per_round, headers, records, violations))()
    return records, violations


def distinct(violations: list[dict]) -> list[dict]:
    """The first violation of each kind (route, status, failed checks), with how often it occurred."""
    kinds: dict[tuple, dict] = {}
    for violation in violations:
        key = (violation["route"], violation["status"], violation["violation"])
        kinds.setdefault(key, {**violation, "count": 0})["count"] += 1
    return list(kinds.values())


def summary(records: list[dict]) -> list[dict]:
    rows = []
    for route in dict.fromkeys(r["route"] for r in records):
        mine = [r for r in records if r["route"] == route]
        statuses = collections.Counter(str(r["status"]) for r in mine)
        rows.append({"route": route, "requests": len(mine),
                     "statuses": dict(sorted(statuses.items())),
                     "server_errors": sum(r["status"] >= 500 for r in mine),
                     "schema_violations": sum("violation" in r for r in mine)})
    return rows


def markdown(report: dict) -> str:
    lines = [f"# Reliability under fuzzing ({report['when']})", "",
             f"{report['requests']} schemathesis-generated requests (valid and invalid) against a live "
             f"`python -m serving` on {report['registry']}; schemathesis {report['schemathesis']}; "
             f"{report['machine']}.", "",
             f"**Server errors (status >= 500): {report['server_errors']}. Schema violations (undocumented status, "
             f"content type or body): {report['schema_violations']}.**", "",
             "| route | requests | statuses | server errors | schema violations |", "|---|---|---|---|---|"]
    for row in report["routes"]:
        statuses = ", ".join(f"{status}: {count}" for status, count in row["statuses"].items())
        lines.append(f"| `{row['route']}` | {row['requests']} | {statuses} | {row['server_errors']} | "
                     f"{row['schema_violations']} |")
    if report["violations"]:
        lines += ["", "## Violations, one line per kind", ""]
        lines += [f"- `{v['route']}` {v['status']} ({v['count']} times): {v['violation']}; e.g. `{v['request']}`"
                  for v in report["violations"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="at least this many requests")
    parser.add_argument("--registry", choices=["auto", "project", "tiny"], default="auto")
    parser.add_argument("--url", help="an already running service (then give its --admin-key, if any)")
    parser.add_argument("--admin-key", help="the running service's SERVING_ADMIN_KEY")
    args = parser.parse_args()
    headers = {"Authorization": f"Bearer {args.admin_key}"} if args.admin_key else {}
    with contextlib.ExitStack() as stack:
        if args.url:
            registry, url = "the running service's registry", args.url
        else:
            registry, env = stack.enter_context(registry_env(args.registry))
            admin_key = secrets.token_urlsafe(16)
            headers = {"Authorization": f"Bearer {admin_key}"}  # no API key is set: /v1 ignores it
            url = stack.enter_context(service(env, admin_key))
        started = time.perf_counter()
        records, violations = fuzz(url, args.requests, headers)
        seconds = time.perf_counter() - started
    report = {"when": time.strftime("%Y-%m-%d %H:%M"), "registry": registry,
              "schemathesis": schemathesis.__version__, "seconds": round(seconds, 1),
              "machine": machine(),
              "requests": len(records), "server_errors": sum(r["status"] >= 500 for r in records),
              "schema_violations": len(violations), "routes": summary(records),
              "violations": distinct(violations)[:EXAMPLES_SHOWN]}
    write_results("reliability", report, markdown)


if __name__ == "__main__":
    main()
