"""One shard of the work-lease table: an append-only log of records under a byte-range lock.

Each line is a whole record (work_leases.py) and supersedes the digest's earlier lines, so a
shard's state is its last line per digest. Every reader keeps that state in memory and reads
only what was appended since (`refresh`); a change is decided on the state read under the
shard's lock (`locked`) and appended, several changes in one write (`append`).

A writer killed inside a write leaves a torn last line, which no reader takes (a reader takes
complete lines only) and the next holder of the lock cuts off. Lines of a batch before the tear
stand: each was decided under the lock on its own, and its writer acted on none of them (it
died before `append` returned). A complete line that does not decode is counted and skipped
(logged once): the digest keeps its earlier state, as a corrupt record file read as absent did.

The log is never rewritten: it lives as long as its job epoch (`OUT/.standalone-work-<epoch>/`)
and costs about 200 bytes per change, three or four changes per input.
"""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

from symcc_mpi.durable.atomic import SYSTEM_DISK
from symcc_mpi.durable.clock import Clock
from symcc_mpi.durable.range_lock import RangeLock
from symcc_mpi.federation.shards import InvalidRecord
from symcc_mpi.federation.work_leases import WorkLease, decode_lease

log = logging.getLogger(__name__)

_READ_SIZE = 1 << 20
_WARNED: set[tuple[Path, int]] = set()  # the corrupt lines logged

Writer = Callable[[int, bytes], int]


class ShardLog:
    """`path`'s records as this process last read them (`records`), and the means to change
    them. One object per process and shard: the lock excludes other objects, in this process
    too, but not concurrent calls on one object."""

    def __init__(self, path: Path, *, lock_timeout: float, clock: Clock,
                 sleep: Callable[[float], object], writer: Writer | None = None,
                 fsync: bool = False):
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self._close = weakref.finalize(self, os.close, self.fd)  # closed once, at the latest
        self.lock = RangeLock(self.fd, path, timeout=lock_timeout, clock=clock, sleep=sleep)
        self._write = writer or SYSTEM_DISK.write
        self._fsync = fsync
        self.records: dict[str, WorkLease] = {}
        self.offset = 0  # bytes of complete lines read
        self.corrupt = 0  # lines skipped
        self.torn = 0  # torn tails cut off
        self.writes = 0

    def refresh(self) -> bool:
        """Read the lines appended since the last read (no lock: complete lines only); True if
        bytes of an incomplete line follow them."""
        size = _READ_SIZE
        while True:
            chunk = os.pread(self.fd, size, self.offset)
            end = chunk.rfind(b"\n") + 1
            if end == 0 and len(chunk) == size:
                size *= 2  # a line longer than a read (garbage): read on to its end
                continue
            at = self.offset
            for line in chunk[:end].split(b"\n")[:-1]:
                self._apply(line, at)
                at += len(line) + 1
            self.offset += end
            if len(chunk) < size:
                return len(chunk) > end
            size = _READ_SIZE

    @contextlib.contextmanager
    def locked(self) -> Iterator[float]:
        """Hold the shard's lock, the state read up to the log's end; yields the seconds
        waited for the lock. A torn tail is cut off first."""
        with self.lock:
            if self.refresh():
                os.ftruncate(self.fd, self.offset)
                self.torn += 1
                log.warning("%s: cut off the torn last line of a writer that died", self.path)
            yield self.lock.waited

    def append(self, records: list[WorkLease], encode: Callable[[WorkLease], bytes]) -> None:
        """Under `locked`: `records` in one write, then in `records`. On an error the log is
        cut back to what it was, if it can be, and the error raised."""
        data = b"".join(encode(record) for record in records)
        self.writes += 1
        try:
            written = 0
            while written < len(data):
                written += self._write(self.fd, data[written:])
            if self._fsync:
                SYSTEM_DISK.fsync(self.fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, self.offset)  # else the next holder cuts the torn tail
            raise
        for record in records:
            self._set(record)
        self.offset += len(data)

    def close(self) -> None:
        self._close()

    def _apply(self, line: bytes, at: int) -> None:
        try:
            record = decode_lease(line)
        except InvalidRecord as invalid:
            self.corrupt += 1
            if (self.path, at) not in _WARNED:  # once per process, however many read it
                _WARNED.add((self.path, at))
                log.warning("%s: corrupt line at byte %d skipped (%s)", self.path, at, invalid)
            return
        self._set(record)

    def _set(self, record: WorkLease) -> None:
        if record.status == "abandoned":
            self.records.pop(record.digest, None)
        else:
            self.records[record.digest] = record
