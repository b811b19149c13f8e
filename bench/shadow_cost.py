"""What shadow mode costs the champion where it matters (not a test): at an open-loop request rate of half the
champion-only capacity, the champion's latency with the challenger mirrored (SERVING_ROLLOUT=shadow) against without
(off); and, as a figure, the saturated closed-loop throughput of both.

    .venv/bin/python bench/shadow_cost.py                       # the project's registry (after `make run`)
    .venv/bin/python bench/shadow_cost.py --seconds 20 --rounds 3 --shadow-share 0.5

Each family needs a `challenger` alias (a version other than its champion), which shadow mode runs; a family
without one is left out, and the notes say so. Two services run at once (the prediction log on in both); the load
goes to one at a time, rotating which comes first in each round. Open loop: requests are sent on a fixed schedule
over up to 64 keep-alive connections, and each one's latency counts from when it was due, so a service that falls
behind is charged for its queue. The molecule bodies are bench/serving.py's fallback SMILES, which the service
caches after their first request: this measures the model calls, not featurisation. Results:
bench/results/shadow_cost.json, and shadow_cost.md generated from it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.logging_overhead import fleet_bodies, load, logged  # noqa: E402
from bench.results_files import machine, write_results  # noqa: E402
from bench.serving import _post  # noqa: E402

CONNECTIONS = 64
TARGET = 10.0  # percent: shadow on may raise the champion's p99 by at most this much at half capacity


async def open_loop(url: str, path: str, bodies: list[bytes], rate: float, seconds: float, headers: bytes) -> dict:
    """Send `rate` requests per second for `seconds` on a fixed schedule; latency from each request's due time."""
    host, port = url.removeprefix("http://").split(":")
    due: asyncio.Queue = asyncio.Queue()
    latencies, errors = [], 0
    start = time.perf_counter() + 0.2
    total = int(rate * seconds)
    for i in range(total):
        due.put_nowait((i, start + i / rate))

    async def connection() -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while not due.empty():
                i, when = due.get_nowait()
                await asyncio.sleep(max(0.0, when - time.perf_counter()))
                status = await _post(reader, writer, path, bodies[i % len(bodies)], headers)
                latencies.append(time.perf_counter() - when)
                errors += status != 200
        finally:
            writer.close()

    await asyncio.gather(*(connection() for _ in range(CONNECTIONS)))
    ms = np.asarray(latencies) * 1000
    return {"requests": len(ms), "errors": errors, "p50_ms": round(float(np.percentile(ms, 50)), 2),
            "p99_ms": round(float(np.percentile(ms, 99)), 2)}


def markdown(report: dict) -> str:
    lines = [f"# Shadow mode's cost to the champion ({report['when']})", "",
             f"{report['machine']}; the project's registry; SERVING_SHADOW_SHARE={report['shadow_share']}; open loop "
             f"at half the champion-only capacity ({report['clients']} clients, one item per request, closed loop), "
             f"{report['seconds']} s per run, {report['rounds']} rounds; medians over the rounds. Made by "
             "`bench/shadow_cost.py`.", "",
             "| family | champion / challenger | capacity off (req/s) | open-loop rate | p50 ms off | shadow | p99 ms "
             f"off | shadow | p99 increase (target <= {TARGET:g} %) | saturated req/s off | shadow |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in report["families"]:
        lines.append(f"| {row['family']} | v{row['champion']} / v{row['challenger']} | {row['capacity_rps']} | "
                     f"{row['rate_rps']} | {row['off']['p50_ms']} | {row['shadow']['p50_ms']} | {row['off']['p99_ms']} "
                     f"| {row['shadow']['p99_ms']} | {row['p99_increase_percent']} % | {row['saturated_rps']['off']} | "
                     f"{row['saturated_rps']['shadow']} |")
    lines += [""] + [f"- {note}" for note in report["notes"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="duration of each run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=32, help="closed-loop clients for the capacity")
    parser.add_argument("--shadow-share", type=float, default=1.0, help="SERVING_SHADOW_SHARE of the shadow service")
    args = parser.parse_args()
    headers = {"Authorization": f"Bearer {os.environ['SERVING_API_KEY']}"} if os.environ.get("SERVING_API_KEY") else {}
    raw_headers = "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode()
    os.environ["SERVING_SHADOW_SHARE"] = str(args.shadow_share)
    rows, notes = [], []
    with tempfile.TemporaryDirectory(prefix="shadow-cost-") as scratch, \
            logged("on", f"sqlite:///{scratch}/off.db") as off, \
            logged("shadow", f"sqlite:///{scratch}/shadow.db") as on:
        services = {"off": off[0], "shadow": on[0]}
        info = httpx.get(f"{off[0]}/v1/models", headers=headers).json()
        challengers = {m["family"]: m["version"] for m in
                       httpx.get(f"{on[0]}/v1/models", headers=headers).json()["rollout"]["challengers"]}
        for model in info["models"]:
            family = model["family"]
            if family not in challengers:
                notes.append(f"{family}: left out, no challenger apart from the champion")
                continue
            payloads, path = fleet_bodies(model), f"/v1/{family}/predict"
            encoded = [json.dumps(body).encode() for body in payloads]
            for url in services.values():
                load(url, path, payloads, 2, 1.0, headers)  # warm-up
            capacity = statistics.median(load(services["off"], path, payloads, args.clients, args.seconds / 2,
                                              headers)["throughput_rps"] for _ in range(args.rounds))
            rate = round(capacity / 2, 1)
            runs: dict[str, list[dict]] = {"off": [], "shadow": []}
            saturated: dict[str, list[float]] = {"off": [], "shadow": []}
            for round_ in range(args.rounds):
                for mode in (("off", "shadow") if round_ % 2 == 0 else ("shadow", "off")):
                    runs[mode].append(asyncio.run(open_loop(services[mode], path, encoded, rate, args.seconds,
                                                            raw_headers)))
                    saturated[mode].append(load(services[mode], path, payloads, args.clients, args.seconds / 2,
                                                headers)["throughput_rps"])
                    print(family, mode, runs[mode][-1], flush=True)
            summary = {mode: {key: round(statistics.median(r[key] for r in runs[mode]), 2)
                              for key in ("p50_ms", "p99_ms", "errors")} for mode in runs}
            rows.append({"family": family, "champion": model["version"], "challenger": challengers[family],
                         "capacity_rps": round(capacity, 1), "rate_rps": rate, **summary,
                         "p99_increase_percent": round(100 * (summary["shadow"]["p99_ms"] / summary["off"]["p99_ms"]
                                                              - 1), 1),
                         "saturated_rps": {mode: round(statistics.median(v), 1) for mode, v in saturated.items()},
                         "runs": runs})
    report = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": machine(), "seconds": args.seconds,
              "rounds": args.rounds, "clients": args.clients, "shadow_share": args.shadow_share, "families": rows,
              "notes": notes}
    write_results("shadow_cost", report, markdown)


if __name__ == "__main__":
    main()
