"""The alias audit log (contract/audit.py): appended records chain by sha256, so an edited, removed or reordered
line is named; concurrent writers never interleave; where the log lives."""

from __future__ import annotations

import threading

import pytest

from contract.audit import AUDIT_LOG_VARIABLE, GENESIS, AuditLogError, append_move, audit_log_path, read_moves


def move(to: str, **extra) -> dict:
    return {"at": "2026-12-01T08:00:00+00:00", "by": "make rollback (dev@host)", "model": "sensor-failure-detector",
            "alias": "champion", "from": "1", "to": to, "why": "a test", **extra}


@pytest.fixture
def log(tmp_path):
    path = tmp_path / "mlflow" / "alias_moves.jsonl"
    for version in ("2", "3", "4"):
        append_move(path, move(version))
    return path


def test_records_are_appended_in_order_each_chained_to_the_one_before(log):
    records = read_moves(log)
    assert [r["to"] for r in records] == ["2", "3", "4"]
    assert records[0]["prev"] == GENESIS
    assert [r["prev"] for r in records[1:]] == [r["sha256"] for r in records[:-1]]
    sha = append_move(log, move("5"))
    assert read_moves(log)[-1]["sha256"] == sha and read_moves(log)[:3] == records


@pytest.mark.parametrize("tamper, line", [
    (lambda lines: [lines[0], lines[1].replace(b'"to":"3"', b'"to":"9"'), lines[2]], 3),  # edited
    (lambda lines: [lines[0], lines[2]], 2),  # removed
    (lambda lines: [lines[1], lines[0], lines[2]], 1),  # reordered
])
def test_an_edited_removed_or_reordered_line_breaks_the_chain_where_it_shows(log, tamper, line):
    log.write_bytes(b"\n".join(tamper(log.read_bytes().splitlines())) + b"\n")
    with pytest.raises(AuditLogError, match=f"line {line}:"):
        read_moves(log)


def test_a_line_that_is_not_a_record_is_named(log):
    with open(log, "ab") as handle:
        handle.write(b"not json\n")
    with pytest.raises(AuditLogError, match="line 4: not a JSON record"):
        read_moves(log)


def test_concurrent_writers_keep_one_unbroken_chain(tmp_path):
    path = tmp_path / "alias_moves.jsonl"
    threads = [threading.Thread(target=lambda i=i: [append_move(path, move(f"{i}.{k}")) for k in range(20)])
               for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(read_moves(path)) == 80


def test_the_log_lives_beside_a_sqlite_registry_unless_the_variable_names_it(tmp_path, monkeypatch):
    monkeypatch.delenv(AUDIT_LOG_VARIABLE, raising=False)
    assert audit_log_path(f"sqlite:///{tmp_path}/mlflow/mlflow.db") == tmp_path / "mlflow" / "alias_moves.jsonl"
    assert audit_log_path("http://mlflow.example.com") is None
    monkeypatch.setenv(AUDIT_LOG_VARIABLE, str(tmp_path / "audit.jsonl"))
    assert audit_log_path("http://mlflow.example.com") == tmp_path / "audit.jsonl"
    assert read_moves(tmp_path / "audit.jsonl") == []
