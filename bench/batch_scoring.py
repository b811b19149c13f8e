"""Batch scoring throughput (not a test): `flows/predict.py` with the project's champions (after `make run`) on a
file of molecules new to the model and a fleet's readings, as a user runs it, on the task runner of params.yaml.

    .venv/bin/python bench/batch_scoring.py                     # 5,000 molecules, the simulated fleet (seed 1)
    .venv/bin/python bench/batch_scoring.py --molecules 20000 --units 200

Molecules: distinct random SMILES of ESOL's molecules (bench/serving.py's pool; its 16 fallback molecules without
../shared/data). Readings: the simulator of params.yaml's sensor section with another seed, every unit's full
history, windows at `sensor.data.stride`. Each job's rows per second, and the time 1,000,000 rows would take at that
rate. Results: bench/results/batch_scoring.json, and batch_scoring.md generated from it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.results_files import machine, write_results  # noqa: E402
from bench.serving import ESOL, drug_like, spellings  # noqa: E402

TARGET_MINUTES = {"molecule": 15, "sensor": 3}  # for 1,000,000 rows on 2 cores


def markdown(report: dict) -> str:
    lines = [f"# Batch scoring ({report['when']})", "",
             f"{report['machine']}; the project's champions; `flows/predict.py` on params.yaml's task runner "
             f"({report['task_runner']}); chunks of {report['chunk_rows']} rows. Made by `bench/batch_scoring.py`.",
             "", "| family | model | input | rows | errors | chunks | seconds | rows/s | 1,000,000 rows would take | "
             "target |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in report["jobs"]:
        lines.append(f"| {row['family']} | {row['model_name']} v{row['model_version']} | {row['what']} | "
                     f"{row['rows']} | {row['errors']} | {row['chunks']} | {row['seconds']} | {row['rows_per_s']} | "
                     f"{row['minutes_per_million']} min | <= {TARGET_MINUTES[row['family']]} min |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--molecules", type=int, default=5000)
    parser.add_argument("--units", type=int, default=100, help="simulated units of the fleet")
    parser.add_argument("--chunk-rows", type=int, default=1000)
    args = parser.parse_args()
    os.chdir(ROOT)  # the workspace: params.yaml, its registry, .predict/
    from data.sensors.simulator import simulate_fleet
    from flows.params import load_params
    from flows.predict import predict

    params = load_params("params.yaml")
    simulator = params.sensor.data.simulator.model_copy(update={"n_units": args.units})
    jobs = []
    with tempfile.TemporaryDirectory(prefix="batch-scoring-") as scratch:
        smiles = drug_like(ESOL)
        pool = spellings(smiles)[:args.molecules]
        pd.DataFrame({"smiles": pool}).to_csv(f"{scratch}/molecules.csv", index=False)
        fleet = simulate_fleet(simulator, seed=1).drop(columns=["label"], errors="ignore")
        fleet.to_parquet(f"{scratch}/readings.parquet")
        inputs = {"molecule": (f"{scratch}/molecules.csv", f"{len(pool)} new SMILES of {len(smiles)} molecules"),
                  "sensor": (f"{scratch}/readings.parquet", f"{len(fleet)} readings of {args.units} units")}
        for family, (path, what) in inputs.items():
            started = time.perf_counter()
            summary = predict(family, path, f"{scratch}/{family}.parquet", chunk_rows=args.chunk_rows)
            seconds = time.perf_counter() - started
            rate = summary["rows"] / seconds
            jobs.append({**summary, "what": what, "seconds": round(seconds, 1), "rows_per_s": round(rate, 1),
                         "minutes_per_million": round(1e6 / rate / 60, 1)})
            print(jobs[-1], flush=True)
    report = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": machine(), "chunk_rows": args.chunk_rows,
              "task_runner": params.orchestration.task_runner, "jobs": jobs}
    write_results("batch_scoring", report, markdown)


if __name__ == "__main__":
    main()
