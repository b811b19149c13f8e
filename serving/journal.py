"""The prediction log's write-ahead journal: every record is written to a local file before its answer leaves, so a
prediction a client was given is in the store or in the journal whatever happens to the service (killed outright
too: the operating system keeps what was written). With `sync_to_disk` each group is also synced to the disk, so
that a power cut loses nothing either, at a cost in throughput; the store itself (SQLite in WAL mode, synchronous
NORMAL) makes the same trade by default.

Records go to segment files of this worker (`<worker>-<n>.journal`: frames of the pickled record's length and its
number of rows, 4-byte little-endian each, then the record), written as they come (with `sync_to_disk`: in groups,
one write and one fdatasync for the answers of one turn of the event loop). A segment is deleted once each of its
records is settled (written to the store or set aside); one whose records were not (a store down until shutdown, a
full queue, a kill) stays, and the next worker to start replays it. A record the writer could not take at once (its
queue full while the store was down, or its writer process ended) is read back from its `Location` when there is
room again. Each worker holds an exclusive lock on its own segments, so a live worker's segments are never taken.
"""

from __future__ import annotations

import asyncio
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


@dataclass(eq=False)
class Segment:
    """One segment file, locked while open: how many of its records are not settled yet."""

    path: Path
    fd: int
    records: int = 0
    settled: int = 0
    closed: bool = False
    size: int = 0  # bytes written (by this process)

    @property
    def done(self) -> bool:
        return self.closed and self.settled >= self.records


@dataclass(frozen=True, eq=False)
class Location:
    """Where one record lies: its segment, the offset and length of its pickled bytes, and its rows."""

    segment: Segment
    offset: int
    length: int
    rows: int

    def read(self) -> bytes:
        """The record's pickled bytes (its segment is open until each of its records is settled)."""
        return os.pread(self.segment.fd, self.length, self.offset)


@dataclass(eq=False)
class Pending:
    """A record on its way to disk: `durable` is done once it is there (for threads), `synced` too (for the event
    loop: one future shared by the records synced together), `location` is where it went (its `payload` is
    released then)."""

    payload: bytes
    rows: int
    durable: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    synced: asyncio.Future | None = None
    location: Location | None = None


class Journal:
    """Segments of `worker` in `folder`. `append` writes at once; with `sync_to_disk`, on the event loop, it joins the
    group that the loop writes and syncs as soon as the current callback returns (one write and one fdatasync for
    all records appended meanwhile, on the loop's own thread: a thread hand-off waited for the interpreter lock while
    the loop was busy)."""

    def __init__(self, folder: Path, worker: str, sync_to_disk: bool = False, segment_bytes: int = SEGMENT_BYTES):
        self.folder, self.worker, self.segment_bytes = Path(folder), worker, segment_bytes
        self.sync_to_disk = sync_to_disk  # fdatasync each group too (survives a power cut, not only a kill)
        self._sequence = 0
        self._current: Segment | None = None
        self._kept: list[Segment] = []  # closed segments with records not settled yet
        self._waiting: list[Pending] = []
        self._group: asyncio.Future | None = None  # the event loop's next sync
        self._lock = threading.Lock()
        self._closed = False

    def problem(self) -> str | None:
        """Why records cannot be journaled now (the folder cannot be made or written), or None."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            return f"{type(error).__name__}: {error}"[:300]
        return None if os.access(self.folder, os.W_OK) else f"{self.folder} is not writable"

    def append(self, payload: bytes, rows: int) -> Pending:
        """Add `payload` (a pickled record of `rows` rows) to the next group sync."""
        pending = Pending(payload, rows)
        with self._lock:
            if self._closed:
                pending.durable.set_exception(OSError("the journal is closed"))
                return pending
            self._waiting.append(pending)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or not self.sync_to_disk:  # write now: one write call, no wait for the loop's next turn
            self.sync()
            return pending
        if self._group is None or self._group.get_loop() is not loop:
            self._group = loop.create_future()
            loop.call_soon(self.sync)
        pending.synced = self._group
        return pending

    def sync(self) -> None:
        """Write and sync every record waiting, and tell them."""
        with self._lock:
            group, self._waiting = self._waiting, []
            synced, self._group = self._group, None
            error = self._write(group) if group else None
        for pending in group:
            if error is None:
                pending.durable.set_result(None)
            else:
                pending.durable.set_exception(error)
        if synced is not None and not synced.done():
            if error is None:
                synced.set_result(None)
            else:
                synced.set_exception(error)

    def _write(self, group: list[Pending]) -> OSError | None:
        """Append `group` to the open segment and sync it; the error, if the disk refused. Called under the lock."""
        try:
            segment = self._segment()
            data = b"".join(FRAME.pack(len(p.payload), p.rows) + p.payload for p in group)
            written = os.write(segment.fd, data)
            if written != len(data):
                raise OSError(f"{segment.path.name}: wrote {written} of {len(data)} bytes")
            if self.sync_to_disk:
                os.fdatasync(segment.fd)
        except OSError as error:
            return error
        offset = segment.size
        for pending in group:
            pending.location = Location(segment, offset + FRAME.size, len(pending.payload), pending.rows)
            offset += FRAME.size + len(pending.payload)
            pending.payload = b""
        segment.records += len(group)
        segment.size = offset
        if segment.size >= self.segment_bytes:
            self._close_current()
        return None

    def settle(self, location: Location) -> None:
        """The record at `location` is in the store (or set aside): a closed segment all settled is deleted."""
        segment = location.segment
        with self._lock:
            segment.settled += 1
            if segment.done and segment.path.exists():
                _remove(segment)
                if segment in self._kept:
                    self._kept.remove(segment)

    def replay(self) -> list[Location]:
        """Take the segments in the folder that no live worker holds (a stopped worker's, with records it could not
        write) and return where their records lie, oldest first; each segment is deleted once they are settled."""
        found = []
        for segment in orphaned(self.folder):
            records = locations(segment)
            with self._lock:
                if records:
                    self._kept.append(segment)
                else:
                    _remove(segment)
            found += records
        return found

    def close(self) -> None:
        """Sync what waits and close the current segment; segments with records not settled are kept (and
        unlocked) for the next start to replay."""
        self.sync()
        with self._lock:
            self._closed = True
            if self._current is not None:
                self._close_current()
            for segment in self._kept:
                if segment.path.exists():
                    os.close(segment.fd)
            self._kept = []

    def _segment(self) -> Segment:
        """The open segment, a new one when there is none. Called under the lock."""
        if self._current is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._sequence += 1
            path = self.folder / f"{self.worker}-{self._sequence:06d}{SUFFIX}"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
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


def locations(segment: Segment) -> list[Location]:
    """Where each record of `segment` lies, oldest first; a frame cut short by a crash while it was written is left
    out."""
    data = Path(segment.path).read_bytes()
    found, offset = [], 0
    while offset + FRAME.size <= len(data):
        length, rows = FRAME.unpack_from(data, offset)
        start = offset + FRAME.size
        if start + length > len(data):
            break
        found.append(Location(segment, start, length, rows))
        offset = start + length
    if offset < len(data):
        log.warning("prediction journal: %s ends in a record cut short; the records before it are replayed",
                    segment.path.name)
    segment.records = len(found)
    return found
