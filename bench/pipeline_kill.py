"""`make run` killed outright in every stage (not a test): the pipeline (`python -m flows.pipeline run`, in a process
group of its own as a terminal starts it) is killed with SIGKILL to its group a few seconds into each stage in turn,
then started again; after each kill, every process of the run (the pipeline, DVC, the stage, its trainer, the Prefect
server, and their children, as seen just before the kill) must be gone within 5 s, and the next start must resume.
The last start runs to the end, and `dvc status` must be clean.

    .venv/bin/python bench/pipeline_kill.py                      # a fresh clone of this repository, every stage
    .venv/bin/python bench/pipeline_kill.py --stages sensor_finetune molecule_finetune --after-s 10

The clone is made in a temporary folder (its `.venv` a link to this one's) and removed afterwards; the run uses its
own Prefect home and DVC cache. Results: bench/results/pipeline_kill.json, and pipeline_kill.md generated from it.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.results_files import machine, write_results  # noqa: E402

STAGE_LINE = re.compile(r"Running stage '(\w+)'")
GONE_WITHIN_S = 5.0


def workspace(folder: Path) -> tuple[Path, dict[str, str]]:
    """A clone of this repository's HEAD in `folder` and the environment a user's `make run` would have there."""
    clone = folder / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    (clone / ".venv").symlink_to(ROOT / ".venv")
    env = {**os.environ, "PREFECT_HOME": str(clone / ".prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "MLFLOW_DISABLE_TELEMETRY": "true", "DVC_NO_ANALYTICS": "1", "DO_NOT_TRACK": "1",
           "DVC_SITE_CACHE_DIR": str(clone / ".dvc" / "site-cache")}
    env.pop("PREFECT_API_URL", None)
    return clone, env


def family_of(process: psutil.Popen) -> list[psutil.Process]:
    """The process and everything it started that is still its descendant."""
    try:
        return [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def alive(processes: list[psutil.Process]) -> list[str]:
    left = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{process.pid} {' '.join(process.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            pass
    return left


def run_until(clone: Path, env: dict[str, str], kill_in: set[str], after_s: float, log) -> dict:
    """Start the pipeline; kill it `after_s` into the first stage of `kill_in` that runs. The outcome: the stage
    killed (None: the run ended by itself), its exit code, the processes of the run still alive 5 s after the kill."""
    started = time.monotonic()
    pipeline = psutil.Popen([sys.executable, "-m", "flows.pipeline", "run"], cwd=clone, env=env,
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    stage: list[str] = []
    entered = threading.Event()

    def read() -> None:
        for line in pipeline.stdout:
            log.write(line)
            found = STAGE_LINE.search(line)
            if found and found.group(1) in kill_in and not stage:
                stage.append(found.group(1))
                entered.set()
        entered.set()  # the run ended

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    entered.wait()
    if not stage:
        code = pipeline.wait()
        return {"stage": None, "exit_code": code, "seconds": round(time.monotonic() - started, 1)}
    time.sleep(after_s)
    processes = family_of(pipeline)
    os.killpg(pipeline.pid, signal.SIGKILL)
    pipeline.wait()
    time.sleep(GONE_WITHIN_S)
    left = alive(processes)
    for survivor in left:  # do not let one survivor spoil the next start
        psutil.Process(int(survivor.split()[0])).kill()
    reader.join(timeout=10)
    return {"stage": stage[0], "processes_at_kill": len(processes), "alive_after_5s": left,
            "seconds": round(time.monotonic() - started, 1)}


def stages_of(clone: Path) -> list[str]:
    import yaml

    return list(yaml.safe_load((clone / "dvc.yaml").read_text())["stages"])


def markdown(report: dict) -> str:
    killed = [row for row in report["kills"] if row["stage"]]
    lines = [f"# `make run` killed outright in every stage ({report['when']})", "",
             f"{report['machine']}. Made by `bench/pipeline_kill.py`: the pipeline's process group got SIGKILL "
             f"{report['after_s']:g} s into each stage in turn, then the pipeline was started again.", "",
             f"**Processes of the run alive {GONE_WITHIN_S:g} s after a kill: "
             f"{sum(len(row['alive_after_5s']) for row in killed)}** (over {len(killed)} kills). The last start "
             f"ran to the end with exit code {report['final_exit_code']}; `dvc status` afterwards: "
             f"{'clean' if report['dvc_status_clean'] else report['dvc_status']}.", "",
             "| stage killed | processes of the run at the kill | alive 5 s later | seconds from start to kill |",
             "|---|---|---|---|"]
    lines += [f"| {row['stage']} | {row['processes_at_kill']} | {', '.join(row['alive_after_5s']) or 0} | "
              f"{row['seconds']} |" for row in killed]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", nargs="+", help="stages to kill in (default: every stage of dvc.yaml)")
    parser.add_argument("--after-s", type=float, default=3.0, help="how far into a stage the kill comes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pipeline-kill-") as folder:
        clone, env = workspace(Path(folder))
        pending = set(args.stages or stages_of(clone))
        kills = []
        with open(Path(folder) / "pipeline.log", "w") as log:
            while pending:
                outcome = run_until(clone, env, pending, args.after_s, log)
                kills.append(outcome)
                print(outcome, flush=True)
                if outcome["stage"] is None:
                    break
                pending.discard(outcome["stage"])
            final = kills[-1] if kills and kills[-1]["stage"] is None else run_until(clone, env, set(), 0, log)
        status = subprocess.run([str(clone / ".venv" / "bin" / "dvc"), "status"], cwd=clone, env=env,
                                capture_output=True, text=True).stdout.strip()
    report = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": machine(), "after_s": args.after_s,
              "kills": kills, "stages_never_run": sorted(pending), "final_exit_code": final["exit_code"],
              "dvc_status": status, "dvc_status_clean": "up to date" in status}
    write_results("pipeline_kill", report, markdown)


if __name__ == "__main__":
    main()
