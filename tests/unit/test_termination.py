"""flows/termination.py: a stage stops on SIGTERM even while RDKit holds the GIL, keeps its exit status, and takes
the helper processes it leaves behind with it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil

from tests.conftest import PROJECT_ROOT

# After run_stoppable(): a Python SIGTERM handler as Prefect's flow engine installs, then one RDKit call that holds
# the GIL for tens of seconds (a Bemis-Murcko scaffold of a 3,000-atom chain), during which that handler cannot run.
BUSY_IN_RDKIT = """
import signal, sys
from rdkit import Chem
from rdkit.Chem.Scaffolds.MurckoScaffold import MurckoScaffoldSmiles
from flows.termination import run_stoppable
mol = Chem.MolFromSmiles("C" * 3000)
run_stoppable()
signal.signal(signal.SIGTERM, lambda *_: sys.exit("handler ran"))
print("busy", flush=True)
MurckoScaffoldSmiles(mol=mol)
print("finished", flush=True)
"""
BOUND_S = 20  # a timeout for the test, not a speed check: the stage gives up after STOP_GRACE_S (3 s)


def _start(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], cwd=PROJECT_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_sigterm_stops_a_stage_busy_in_rdkit():
    process = _start(BUSY_IN_RDKIT)
    try:
        assert process.stdout.readline() == "busy\n"
        time.sleep(1)  # inside the RDKit call
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=BOUND_S)
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGTERM
    assert err.strip() == "error: stopped by SIGTERM" and "finished" not in out


def test_the_stage_exit_status_and_output_pass_through():
    process = _start("from flows.termination import run_stoppable; run_stoppable(); print('done'); raise SystemExit(2)")
    out, _ = process.communicate(timeout=BOUND_S)
    assert (process.returncode, out) == (2, "done\n")


def test_a_helper_the_stage_leaves_running_ends_with_it():
    """As Prefect's temporary API server, whose exit handler the stage's os._exit skips."""
    process = _start("import subprocess, sys; from flows.termination import end_child, run_stoppable; run_stoppable(); "
                     "helper = subprocess.Popen(['sleep', '60']); print(helper.pid, flush=True); end_child(0)")
    out, _ = process.communicate(timeout=BOUND_S)
    helper = int(out)
    deadline = time.monotonic() + BOUND_S
    while _alive(helper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.returncode == 0 and not _alive(helper)


def _left_running(*pids: int) -> list[int]:
    """Which of `pids` still run after waiting up to BOUND_S for them to end."""
    deadline = time.monotonic() + BOUND_S
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if _alive(pid)]


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for its parent to be reaped counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_stage_whose_waiting_process_is_killed_outright_ends_with_its_helpers():
    """SIGKILL of the waiting process (as `kill -9` of a pipeline's process group does): the forked stage, in its own
    group, and the helpers it started end too instead of running on."""
    process = _start("import os, subprocess, sys, time; from flows.termination import run_stoppable; run_stoppable(); "
                     "helper = subprocess.Popen(['sleep', '60']); print(os.getpid(), helper.pid, flush=True); "
                     "time.sleep(60)")
    try:
        stage, helper = map(int, process.stdout.readline().split())
        process.kill()
        process.wait(timeout=BOUND_S)
        assert _left_running(stage, helper) == []
    finally:
        process.kill()


def test_a_stage_ends_when_what_started_it_is_killed_outright():
    """The waiting process's parent (dvc, the pipeline) gets SIGKILL: the stage is stopped as by SIGTERM."""
    starter = _start("import subprocess, sys; from tests.unit.test_termination import _start; "
                     "stage = _start('import os, time; from flows.termination import run_stoppable; run_stoppable(); "
                     "print(os.getpid(), flush=True); time.sleep(60)'); "
                     "print(stage.pid, stage.stdout.readline().strip(), flush=True); import time; time.sleep(60)")
    try:
        waiting, stage = map(int, starter.stdout.readline().split())
        starter.kill()
        starter.wait(timeout=BOUND_S)
        assert _left_running(waiting, stage) == []
    finally:
        starter.kill()


def test_a_stage_whose_starter_is_killed_during_its_imports_never_runs(tmp_path):
    """`python -m flows.stages.<stage>` ends with what started it from its first moment: its starter killed while
    it still imports (seconds), it never gets as far as reading its params file (which would fail with a message)."""
    errors = tmp_path / "stage.err"
    starter = _start("import os, subprocess, sys, time; "
                     f"stage = subprocess.Popen([sys.executable, '-m', 'flows.stages.prepare', 'sensor', '--params', "
                     f"'missing.yaml'], cwd={str(tmp_path)!r}, stderr=open({str(errors)!r}, 'w'), "
                     f"env=dict(os.environ, PYTHONPATH={str(PROJECT_ROOT)!r})); "
                     "time.sleep(0.3); print(stage.pid, flush=True); time.sleep(60)")  # the stage is importing
    try:
        stage = int(starter.stdout.readline())
        starter.kill()
        starter.wait(timeout=BOUND_S)
        assert _left_running(stage) == []
        assert errors.read_text() == ""  # ended by the signal during its imports, not by the missing params file
    finally:
        starter.kill()


def test_a_stage_ends_when_the_process_group_that_started_it_is_killed_outright():
    """A pipeline killed whole (SIGKILL to its process group: the starter, the waiting process) while the stage runs
    in its own group: the stage and its helpers end too."""
    starter = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; from tests.unit.test_termination import _start; "
         "stage = _start('import os, subprocess, sys, time; from flows.termination import run_stoppable; "
         "run_stoppable(); helper = subprocess.Popen([sys.executable, \"-c\", \"import time; time.sleep(60)\"]); "
         "print(os.getpid(), helper.pid, flush=True); time.sleep(60)'); "
         "print(stage.pid, stage.stdout.readline().strip(), flush=True); import time; time.sleep(60)"],
        cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        waiting, stage, helper = map(int, starter.stdout.readline().split())
        deadline = time.monotonic() + BOUND_S
        while len(psutil.Process(waiting).children()) < 2:  # the stage and its watcher: both forked
            assert time.monotonic() < deadline, "the waiting process never forked its watcher"
            time.sleep(0.01)
        os.killpg(starter.pid, signal.SIGKILL)
        starter.wait(timeout=BOUND_S)
        assert _left_running(waiting, stage, helper) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(starter.pid, signal.SIGKILL)
