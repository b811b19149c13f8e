"""A throwaway PostgreSQL cluster for integration tests, started with initdb and pg_ctl from Debian's
`postgresql` package (/usr/lib/postgresql/<version>/bin) on a free loopback port.

initdb refuses to run as root: as root the cluster runs as the `postgres` user (runuser) in a folder of its own
under the system temp folder (pytest's tmp_path is readable by root only). Missing binaries or user skip the
test with the reason, and fail it under CI=true.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

SERVER_USER = "postgres"


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}, and CI=true: CI must have it (.ci/run installs the package)")
    pytest.skip(reason)


def _server_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]) if
                   p.parts[-3].isdigit() else 0)
    return found[-1].parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(command: list, what: str) -> None:
    done = subprocess.run([str(part) for part in command], capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-2000:]}")


@contextlib.contextmanager
def throwaway_cluster(folder: Path) -> Iterator[str]:
    """A running cluster in `folder` (as root: in a temp folder owned by `postgres`); yields its SQLAlchemy URL
    (user `test`, trust authentication, database `postgres`) and stops and removes it afterwards."""
    server_bin = _server_bin()
    if server_bin is None:
        _skip_or_fail("needs PostgreSQL's server binaries under /usr/lib/postgresql/*/bin (Debian package postgresql)")
    as_user: list[str] = []
    if os.geteuid() == 0:
        try:
            account = pwd.getpwnam(SERVER_USER)
        except KeyError:
            _skip_or_fail(f"running as root, which initdb refuses, and there is no `{SERVER_USER}` user to run as")
        if shutil.which("runuser") is None:
            _skip_or_fail("running as root, which initdb refuses, and there is no runuser to switch users")
        folder = Path(tempfile.mkdtemp(prefix="postgres-cluster-"))
        os.chown(folder, account.pw_uid, account.pw_gid)
        as_user = ["runuser", "-u", SERVER_USER, "--"]
    data, port = folder / "data", _free_port()
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"
    try:
        _run([*as_user, server_bin / "initdb", "-D", data, "-U", "test", "--auth=trust", "-E", "UTF8", "--no-sync"],
             "initdb")
        _run([*as_user, server_bin / "pg_ctl", "-D", data, "-l", folder / "server.log", "-w", "-t", "120", "-o",
              options, "start"], "pg_ctl start")
        try:
            yield f"postgresql+psycopg2://test@127.0.0.1:{port}/postgres"
        finally:
            _run([*as_user, server_bin / "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop"], "pg_ctl stop")
    finally:
        if as_user:
            shutil.rmtree(folder, ignore_errors=True)


def set_read_only(admin_url: str, read_only: bool) -> None:
    """Make every new transaction of the cluster's `postgres` database read-only (or writable again), and end its
    other connections, so that their next write meets the change at once."""
    from sqlalchemy import create_engine, text

    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(text("SET default_transaction_read_only = off"))  # this connection's own, to be let in
        connection.execute(text("ALTER DATABASE postgres SET default_transaction_read_only = "
                                f"{'on' if read_only else 'off'}"))
        connection.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                "WHERE pid <> pg_backend_pid() AND datname = 'postgres'"))
    engine.dispose()
