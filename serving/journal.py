"""The prediction log's write-ahead journal: every record is on local disk (written and fsynced) before its answer
leaves, so a prediction a client was given is in the store or in the journal whatever happens to the service.

Records go to segment files of this worker (`<worker>-<n>.journal`: frames of the pickled record's length and its
number of rows, 4-byte little-endian each, then the record), written by one thread that syncs all records waiting at once (group commit: one fsync for
many answers). A segment is deleted once each of its records is settled (written to the store or set aside); one
whose records were not (a store down until shutdown, a full queue, a kill) stays, and the next worker to start
replays it. Each worker holds an exclusive lock on its own segments, so a live worker's segments are never taken.
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import logging
import os
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("serving")
SEGMENT_BYTES = 8 * 2**20  # a segment is closed (and a new one opened) beyond this size
SUFFIX = ".journal"
FRAME = struct.Struct("<II")  # a record's length in bytes and its rows


@dataclass
class Segment:
    """One segment file, locked while open: how many of its records are not settled yet."""

    path: Path
    fd: int
    records: int = 0
    settled: int = 0
    closed: bool = False

    @property
    def done(self) -> bool:
        return self.closed and self.settled >= self.records


@dataclass
class Pending:
    """A record on its way to disk: `durable` is done once it is there, `segment` is where it went."""

    payload: bytes
    rows: int
    durable: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    segment: Segment | None = None


class Journal:
    """Segments of `worker` in `folder`; `append` returns a future done once the record is on disk."""

    def __init__(self, folder: Path, worker: str, segment_bytes: int = SEGMENT_BYTES):
        self.folder, self.worker, self.segment_bytes = Path(folder), worker, segment_bytes
        self._sequence = 0
        self._current: Segment | None = None
        self._kept: list[Segment] = []  # closed segments with records not settled yet
        self._pending: list[Pending] = []
        self._condition = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._sync, name="prediction-journal", daemon=True)

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def append(self, payload: bytes, rows: int) -> Pending:
        """Queue `payload` (a pickled record of `rows` rows) for the next group sync; `.durable` is done once it is
        on disk (an OSError in it when the disk refused), `.segment` is where it went."""
        pending = Pending(payload, rows)
        with self._condition:
            if self._closing:
                pending.durable.set_exception(OSError("the journal is closed"))
                return pending
            self._pending.append(pending)
            self._condition.notify()
        return pending

    def settle(self, segment: Segment, count: int = 1) -> None:
        """`count` records of `segment` are in the store (or set aside): a closed segment all settled is deleted."""
        with self._condition:
            segment.settled += count
            if segment.done and segment.path.exists():
                _remove(segment)
                if segment in self._kept:
                    self._kept.remove(segment)

    def close(self) -> None:
        """Sync what is queued and close the current segment; segments with records not settled are kept (and
        unlocked) for the next start to replay."""
        with self._condition:
            self._closing = True
            self._condition.notify()
        if self._thread.is_alive():
            self._thread.join()
        with self._condition:
            if self._current is not None:
                self._close_current()
            for segment in self._kept:
                if segment.path.exists():
                    os.close(segment.fd)
            self._kept = []

    def _sync(self) -> None:
        while True:
            with self._condition:
                while not self._pending and not self._closing:
                    self._condition.wait()
                group, self._pending = self._pending, []
                if not group and self._closing:
                    return
                segment = self._segment()
                segment.records += len(group)
            try:
                os.write(segment.fd, b"".join(FRAME.pack(len(p.payload), p.rows) + p.payload for p in group))
                os.fsync(segment.fd)
            except OSError as error:
                with self._condition:
                    segment.records -= len(group)
                for pending in group:
                    pending.durable.set_exception(error)
                continue
            for pending in group:
                pending.segment = segment
                pending.durable.set_result(None)
            with self._condition:
                if os.fstat(segment.fd).st_size >= self.segment_bytes:
                    self._close_current()

    def _segment(self) -> Segment:
        """The open segment, a new one when there is none. Called under the lock."""
        if self._current is None:
            self._sequence += 1
            path = self.folder / f"{self.worker}-{self._sequence:06d}{SUFFIX}"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._current = Segment(path, fd)
        return self._current

    def _close_current(self) -> None:
        """Called under the lock."""
        self._current.closed = True
        if self._current.done:
            _remove(self._current)
        else:
            self._kept.append(self._current)
        self._current = None


def _remove(segment: Segment) -> None:
    segment.path.unlink(missing_ok=True)
    os.close(segment.fd)


def orphaned(folder: Path) -> list[Segment]:
    """The segments in `folder` that no live worker holds, each now locked by this process (closed, all of its
    records unsettled), oldest first."""
    found = []
    for path in sorted(Path(folder).glob(f"*{SUFFIX}"), key=lambda p: (p.stat().st_mtime, p.name)):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a live worker's
            os.close(fd)
            continue
        if not path.exists():  # settled and deleted while this process waited for the lock
            os.close(fd)
            continue
        found.append(Segment(path, fd, closed=True))
    return found


def read_records(segment: Segment) -> list[tuple[bytes, int]]:
    """The pickled records of `segment` with their rows; a frame cut short by a crash while it was written is left
    out."""
    data = Path(segment.path).read_bytes()
    records, offset = [], 0
    while offset + FRAME.size <= len(data):
        length, rows = FRAME.unpack_from(data, offset)
        start = offset + FRAME.size
        if start + length > len(data):
            break
        records.append((data[start:start + length], rows))
        offset = start + length
    if offset < len(data):
        log.warning("prediction journal: %s ends in a record cut short; the records before it are replayed",
                    segment.path.name)
    return records
