"""The alias audit log: every move of a registry alias (by a person with `make rollback`, by the promotion gate,
by the rollout judge), one JSON line each, only ever appended.

A record is {"at" (UTC, ISO 8601), "by" (who or what), "model", "alias", "from" (version or null), "to", "why",
"prev"}: `prev` is the sha256 of the line before it (GENESIS for the first), so a line edited, removed or
reordered breaks the chain from there on and `verify` names it. The registry tag each move also writes
(contract.registry.move_alias) carries the record's own sha256, so lines cut off the end show against the
registry. Writers take an exclusive lock on the file, so the monitor flow and a person never interleave.

Where: AUDIT_LOG_VARIABLE when set, else `alias_moves.jsonl` beside a SQLite MLflow store (the flows and the
service find it from the registry they already use); other stores need the variable.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path

GENESIS = "0" * 64
FILENAME = "alias_moves.jsonl"
AUDIT_LOG_VARIABLE = "ALIAS_AUDIT_LOG"
FIELDS = ("at", "by", "model", "alias", "from", "to", "why", "prev")
SQLITE = "sqlite:///"


class AuditLogError(RuntimeError):
    """The audit log cannot be read, or its chain is broken (the message names the line)."""


def audit_log_path(registry_uri: str) -> Path | None:
    """The audit log of the registry at `registry_uri` (see the module docstring); None when it has none."""
    if os.environ.get(AUDIT_LOG_VARIABLE):
        return Path(os.environ[AUDIT_LOG_VARIABLE])
    if registry_uri.startswith(SQLITE):
        return Path(registry_uri[len(SQLITE):]).parent / FILENAME
    return None


def _line(record: dict) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def _digest(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()


def append_move(path: Path, move: dict) -> str:
    """Append `move` ({at, by, model, alias, from, to, why}) chained to the last line; returns its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as log:
        fcntl.flock(log, fcntl.LOCK_EX)
        log.seek(0)
        lines = log.read().splitlines()
        line = _line({**{key: move[key] for key in FIELDS[:-1]}, "prev": _digest(lines[-1]) if lines else GENESIS})
        log.write(line + b"\n")
        log.flush()
        os.fsync(log.fileno())
    return _digest(line)


def read_moves(path: Path) -> list[dict]:
    """Every record, oldest first, each with its `sha256`, once the whole chain checks out (AuditLogError naming
    the first bad line otherwise). A missing file is an empty log."""
    if not path.is_file():
        return []
    records, previous = [], GENESIS
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        try:
            record = json.loads(line)
        except ValueError:
            raise AuditLogError(f"{path} line {number}: not a JSON record") from None
        if not isinstance(record, dict) or sorted(record) != sorted(FIELDS):
            raise AuditLogError(f"{path} line {number}: expected the fields {', '.join(FIELDS)}")
        if record["prev"] != previous:
            raise AuditLogError(f"{path} line {number}: its `prev` does not match the sha256 of line {number - 1}: "
                                f"a line was edited, removed or reordered")
        if _line(record) != line:
            raise AuditLogError(f"{path} line {number}: not written by this log (its bytes are not canonical)")
        previous = _digest(line)
        records.append({**record, "sha256": previous})
    return records
