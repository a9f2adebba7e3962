"""Publication hints between masters (issue 11 item 3): per-master append-only digest logs.

Each master appends the digests it promotes into the shared corpus to its own log,
`<lease directory>/published/master-<k>.log`, one lowercase hex digest and a newline per line,
with O_APPEND (durable/journal.py's LineLog, writing bare lines) and by that master only.
Every other master tails each log from where it last stopped, so learning of new work costs
O(new bytes) per tick instead of listing the corpus.

A hint is only a hint: the lease table decides who analyses what, and the full corpus rescan
each master makes at start and at PREPARE catches anything a hint missed. So the logs are not
fsynced, a killed writer's torn last line costs at most that hint, and a reader:
- keeps a last line without its newline for the next poll (the writer may be mid-write);
- rejects a line that is not exactly 64 lowercase hex characters, counting it;
- treats a log that does not exist (yet) as empty.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from symcc_mpi.durable.atomic import make_directories
from symcc_mpi.durable.journal import LineLog

PUBLISHED = "published"
DIGEST_LENGTH = 64
READ_CHUNK = 1 << 20  # per log per poll: a burst is read over several ticks, memory bounded

_DIGEST = re.compile(rb"[0-9a-f]{64}")


def log_path(lease_directory: Path, master: int) -> Path:
    return Path(lease_directory) / PUBLISHED / f"master-{master}.log"


class PublicationLog:
    """The writing end: this master's own log."""

    def __init__(self, lease_directory: Path, master: int):
        self.path = log_path(lease_directory, master)
        make_directories(self.path.parent)

    def append(self, digests: Iterable[str]) -> None:
        """Append `digests` in one write (one per line); an invalid digest is a ValueError."""
        lines = []
        for digest in digests:
            if not isinstance(digest, str) or not _DIGEST.fullmatch(digest.encode()):
                raise ValueError(f"a digest is a lowercase hex SHA-256 (got {digest!r})")
            lines.append(digest + "\n")  # LineLog writes them in one write
        if not lines:
            return
        # Opened for each append, not held: the lease directory is removed at the job's end,
        # and on NFS a file held open there would keep it (a silly-renamed .nfs file).
        log = LineLog(self.path, fsync=False, encode=str.encode)
        try:
            log.extend(lines)
        finally:
            log.close()


@dataclass(frozen=True)
class HintStatistics:
    hints: int = 0  # valid digests read
    rejected: int = 0  # lines that were not a digest
    bytes_read: int = 0


@dataclass
class _Tail:
    offset: int = 0  # where the next read starts: the first byte not yet consumed
    skipping: bool = False  # inside an overlong line: discard up to its newline


class HintReader:
    """The reading end: tails the logs of `peers` (the other masters' ranks)."""

    def __init__(self, lease_directory: Path, peers: Sequence[int]):
        self._tails = {log_path(lease_directory, peer): _Tail() for peer in peers}
        self._hints = 0
        self._rejected = 0
        self._bytes = 0

    def poll(self) -> list[str]:
        """The digests appended since the last poll, in log order, log by log."""
        found: list[str] = []
        for path, tail in self._tails.items():
            found += self._read(path, tail)
        return found

    def statistics(self) -> HintStatistics:
        return HintStatistics(self._hints, self._rejected, self._bytes)

    def _read(self, path: Path, tail: _Tail) -> list[str]:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return []
        try:
            data = os.pread(fd, READ_CHUNK, tail.offset)
        finally:
            os.close(fd)
        end = data.rfind(b"\n") + 1  # complete lines only; 0 if there is none
        if end == 0:
            if len(data) > DIGEST_LENGTH:  # no digest line is this long: garbage so far
                self._consume(tail, len(data))
                if not tail.skipping:
                    tail.skipping = True
                    self._rejected += 1
            return []
        self._consume(tail, end)
        lines = data[:end].split(b"\n")[:-1]
        if tail.skipping:
            lines = lines[1:]  # the rest of the overlong line, already counted
            tail.skipping = False
        found = []
        for line in lines:
            if _DIGEST.fullmatch(line):
                found.append(line.decode())
            else:
                self._rejected += 1
        self._hints += len(found)
        return found

    def _consume(self, tail: _Tail, count: int) -> None:
        tail.offset += count
        self._bytes += count
