"""Checksummed append-only JSONL journals: the one journal implementation of the package.

`LineLog` is under every append-only log of the campaign: the done journal and F443 work WAL
(`OUT/state/done.jsonl`, campaign/wal.py and campaign/done_log.py), the deferred-work journal
(F317 §4.2, below), the generation log (ulfm/generations.py, appended under a flock by several
processes in turn: `cut_torn_tail` before each append), the masters' publication hints
(federation/hints.py, bare digest lines: `encode`), and quarantine/REASONS (`note_reason`).

Every line is `<crc32 of the JSON, 8 hex> <JSON object>\n`, ASCII only (a log given its own
`encode` writes its own lines: the hints and REASONS, which are read by other means). The
checksum is what tells a torn append (a process killed inside `write`) or a flipped byte from
a real record: JSON alone would accept a line cut exactly at a closing brace.

Filesystem semantics relied on:
- one writer at a time: a `LineLog` is written only by its owner (the holder of the campaign
  lock, campaign/corpus.py), through an O_APPEND descriptor, one `write` per record or group; nobody
  else appends, so records never interleave. A reader that is not the owner uses `inspect`,
  which never writes, so an append in progress is never cut;
- fsync: an append is durable once `os.fsync` of the file returns; a new file's name is made
  durable by an fsync of its directory;
- atomic rename in one directory (atomic.write_durable): a repair rewrites the file as a
  whole, old or new, never a mix;
- close-to-open visibility: a master on another node that takes the campaign over opens the
  file after its writer's fsync and must read every acknowledged record (NFS's close-to-open
  consistency gives this: the fsync puts the bytes on the server, the open revalidates the
  reader's cache; a client cache that is not revalidated on open would not do).

Damage on open is never fatal and never silent. A bad LAST line is an interrupted append: its
bytes are kept in the quarantine directory and the file is truncated before them. A bad line
elsewhere is kept the same way, reported with path and line number, and the journal is rewritten
without it; every other record survives (a `strict` log, whose records may not be dropped,
refuses to open instead, naming the line, and changes nothing). The quarantine copy is made
durable before the live file changes, so a crash during repair cannot lose the bad bytes
(nothing is dropped silently). Only the process that owns the journal (holds its campaign's
lock) opens it this way: anyone else reads it with `inspect`, which reports damage and never
writes, so a reader that sees an append in progress cannot cut it.

Appends may come in groups (`extend`): the records are encoded into one write and one fsync,
which is how a group commit pays one fsync per round instead of one per record. A group is not
atomic against a kill: a writer killed inside the write leaves the records it wrote whole,
then a torn line, so every record must stand on its own (a done record does: the group commit
fsyncs its inputs before the append).

Writes go through an injectable `writer(fd, data)` so tests can make the write step raise. A
failed append is cut back off the file (ftruncate to the last good size) before the error
propagates, so memory and file both stay as they were; if even that fails, the journal becomes
`broken` and refuses further appends rather than appending after a torn fragment.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from symcc_mpi.durable.atomic import (
    SYSTEM_DISK,
    fsync_directory,
    is_temporary,
    make_directories,
    write_durable,
)
from symcc_mpi.durable.clock import SYSTEM_CLOCK, Clock
from symcc_mpi.durable.lines import (
    LineError,
    UnchecksummedLine,
    Writer,
    decode_line,
    encode_line,
    write_all,
)

log = logging.getLogger(__name__)

REASONS = "REASONS"  # in a quarantine directory: one line per file set aside there, and why



# -- damage reports --------------------------------------------------------------------------


class DamageKind(enum.Enum):
    TORN_TAIL = "torn-tail"  # the last line: an append interrupted by a crash
    CORRUPT_LINE = "corrupt-line"  # any other bad line: corruption, reported loudly


@dataclass(frozen=True)
class Damage:
    path: Path
    line: int
    kind: DamageKind
    reason: str
    kept_at: Path | None  # None: found by a read-only `inspect`, left in place

    def __str__(self) -> str:
        where = f"kept at {self.kept_at}" if self.kept_at else "left in place (read-only)"
        return f"{self.path}:{self.line}: {self.kind.value}: {self.reason}; {where}"


class JournalError(Exception):
    """Base of the journal errors."""


class JournalBroken(OSError):
    """A failed append could not be cut back off the file; no further appends are accepted.
    Nothing more can be committed: the campaign stops as when the filesystem refuses writes
    (storage.py)."""

    storage_refused = True


class JournalClosed(JournalError):
    """The journal was closed."""


class JournalCorrupt(JournalError):
    """A strict journal holds a bad record before its last line: nothing was changed."""

    def __init__(self, damage: Damage):
        super().__init__(f"{damage.path}, line {damage.line}: {damage.reason}")
        self.damage = damage


# -- the shared file engine ------------------------------------------------------------------

Apply = Callable[[dict[str, Any]], None]
"""Take one decoded record in; raise ValueError if it does not apply."""


@dataclass(frozen=True)
class _BadLine:
    number: int
    offset: int
    data: bytes
    reason: str
    torn: bool  # the last line, cut short: an append interrupted by a crash (or in progress)


def _scan(raw: bytes, apply: Apply) -> tuple[list[bytes], list[_BadLine]]:
    """Replay every good line of `raw` through `apply`; return the good lines and the bad."""
    good: list[bytes] = []
    bad: list[_BadLine] = []
    offset = number = 0
    while offset < len(raw):
        number += 1
        end = raw.find(b"\n", offset)
        if end == -1:
            # An append writes its line and newline in one call: no newline, no record,
            # even if the bytes before the cut happen to decode.
            bad.append(_BadLine(number, offset, raw[offset:], "interrupted append (no newline)",
                                True))
            break
        line = raw[offset:end + 1]
        try:
            apply(decode_line(line[:-1]))
        except UnchecksummedLine as error:
            bad.append(_BadLine(number, offset, line, str(error), False))
        except LineError as error:
            bad.append(_BadLine(number, offset, line, str(error), end == len(raw) - 1))
        except ValueError as error:
            # Checksummed, so written whole: corruption or a bug, never a torn append.
            bad.append(_BadLine(number, offset, line, f"record does not apply: {error}", False))
        else:
            good.append(line)
        offset = end + 1
    return good, bad


def _kind(bad: _BadLine) -> DamageKind:
    return DamageKind.TORN_TAIL if bad.torn else DamageKind.CORRUPT_LINE


def inspect(path: Path, apply: Apply, *, after: tuple[int, int] = (0, 0)) -> tuple[Damage, ...]:
    """Read-only replay, for processes that do not own the journal: every good record goes
    through `apply`, every bad line is reported (never cut, never quarantined: the file and
    its directory are not written, so a live owner's append in progress stays whole).
    `after`: the size and line count of a prefix not read (a snapshot vouches for it)."""
    size, lines = after
    try:
        with open(path, "rb") as handle:
            handle.seek(size)
            raw = handle.read()
    except FileNotFoundError:
        return ()
    _, bad = _scan(raw, apply)
    return tuple(Damage(Path(path), lines + item.number, _kind(item), item.reason, None)
                 for item in bad)


class LineLog:
    """One append-only checksummed JSONL file, for its owner: load with repair, then append
    (one record or a group)."""

    def __init__(self, path: Path, *, clock: Clock = SYSTEM_CLOCK, fsync: bool = True,
                 writer: Writer | None = None, quarantine_dir: Path | None = None,
                 strict: bool = False, encode: Callable[[Any], bytes] = encode_line,
                 cut_back: bool = True):
        self.path = Path(path)
        self.clock = clock
        self.fsync = fsync
        self.writer = writer or write_all
        self.encode = encode  # a record to its line, newline included
        # False: a failed append is left as it is and the log takes no more appends (its
        # writers take turns under a lock and answer a retry from a record that landed:
        # the generation log; the next writer's `cut_torn_tail` removes a torn one).
        self.cut_back = cut_back
        self.quarantine_dir = quarantine_dir or self.path.parent / "quarantine"
        self.strict = strict  # a corrupt record is refused, never dropped
        self.lines = 0
        self.size = 0
        self.broken: OSError | None = None
        self._fd: int | None = None
        self._closed = False
        # SHA-256 of the bytes this owner believes the file holds: what it loaded, then
        # every append. Compared at close, it shows nobody else wrote (or cut) the file.
        # Opened after a known prefix (`open_after`), it covers what follows the prefix.
        self._content = hashlib.sha256()
        self._prefix: tuple[int, str] | None = None  # (size, sha256) of a prefix not loaded
        self._whole_digest: str | None = None

    # loading

    def load(self, apply: Apply) -> tuple[Damage, ...]:
        """Replay every good line through `apply` (ValueError = the record does not apply),
        quarantine the bad ones and repair the file. Call `open_for_append` next.

        Strict: a bad line before the last raises JournalCorrupt and nothing is written."""
        self._sweep_temporaries()
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            raw = b""
        good, bad = _scan(raw, apply)
        if self.strict:
            for item in bad:
                if not item.torn:
                    raise JournalCorrupt(Damage(self.path, item.number, DamageKind.CORRUPT_LINE,
                                                item.reason, None))
        damage = tuple(self._quarantine(item) for item in bad)
        for report in damage:
            log.warning("journal damage: %s", report)
        kept = b"".join(good)
        if any(report.kind is DamageKind.CORRUPT_LINE for report in damage):
            self._replace(kept)
        elif bad:
            self._truncate(bad[-1].offset)
        self.lines = len(good)
        self._content = hashlib.sha256(kept)
        return damage

    def open_after(self, size: int, digest: str, lines: int, apply: Apply) -> tuple[Damage, ...]:
        """`load`, trusting the first `size` bytes to be the `lines` records whose SHA-256
        is `digest` ("": unknown, not checked at close; a snapshot of the journal vouches
        for them): only what follows is read and replayed, so a resume does not read a
        million records it has in its snapshot.
        ValueError if the file is shorter than that prefix. Call `open_for_append` next."""
        with open(self.path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell() < size:
                raise ValueError(f"{self.path} is shorter than the snapshot says")
            handle.seek(size)
            tail = handle.read()
        good, bad = _scan(tail, apply)
        for item in bad:  # a strict log's, as the done journal is: a torn tail is cut
            if not item.torn:
                raise JournalCorrupt(Damage(self.path, lines + item.number,
                                            DamageKind.CORRUPT_LINE, item.reason, None))
        damage = tuple(self._quarantine(item) for item in bad)
        if bad:
            self._truncate(size + bad[-1].offset)
        self.lines = lines + len(good)
        self._prefix = (size, digest)
        self._content = hashlib.sha256(b"".join(good))
        return damage

    def _sweep_temporaries(self) -> None:
        # A repair killed before its rename leaves `.tmp-<name>.<pid>`: never visible, so
        # removing it loses nothing.
        if not self.path.parent.is_dir():
            return
        for candidate in self.path.parent.glob(f".tmp-{self.path.name}.*"):
            if is_temporary(candidate):
                candidate.unlink(missing_ok=True)

    def _quarantine(self, bad: _BadLine) -> Damage:
        make_directories(self.quarantine_dir)
        stamp = f"{self.clock.time():.6f}"
        serial = 0
        while True:
            target = self.quarantine_dir / f"{self.path.name}.line{bad.number}.{stamp}.{serial}"
            if not target.exists():
                break
            serial += 1
        # Durable before the live file is repaired: the bad bytes must outlive the repair.
        write_durable(target, bad.data, fsync=self.fsync)
        damage = Damage(self.path, bad.number, _kind(bad), bad.reason, target)
        note_reason(self.quarantine_dir, target.name,
                    f"{self.path}, line {bad.number}: {damage.kind.value}: {bad.reason}")
        return damage

    def cut_torn_tail(self) -> Damage | None:
        """Cut the bytes after the last newline (an append its writer died inside) off the
        file, kept in quarantine first as `<name>.torn-at-<offset>`. Only for a log whose
        writers take turns under a lock (the generation log): the caller holds it, so those
        bytes are no append in progress. Reads at most the last MiB; None if nothing was torn."""
        try:
            fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            tail_start = max(0, size - (1 << 20))
            data = os.pread(fd, size - tail_start, tail_start)
            if not data or data.endswith(b"\n"):
                return None
            keep = tail_start + data.rfind(b"\n") + 1
            kept = self.quarantine_dir / f"{self.path.name}.torn-at-{keep}"
            make_directories(self.quarantine_dir)
            write_durable(kept, data[keep - tail_start:], fsync=self.fsync)
            note_reason(self.quarantine_dir, kept.name,
                        f"interrupted append cut from {self.path} at byte {keep}")
            os.ftruncate(fd, keep)
            if self.fsync:
                SYSTEM_DISK.fsync(fd)
        finally:
            os.close(fd)
        return Damage(self.path, 0, DamageKind.TORN_TAIL, "interrupted append (no newline)",
                      kept)

    def _truncate(self, keep: int) -> None:
        with open(self.path, "r+b") as handle:
            handle.truncate(keep)
            if self.fsync:
                SYSTEM_DISK.fsync(handle.fileno())

    def _replace(self, data: bytes) -> None:
        write_durable(self.path, data, fsync=self.fsync)

    def open_for_append(self) -> None:
        make_directories(self.path.parent)
        existed = self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if not existed and self.fsync:
            fsync_directory(self.path.parent)  # the new name must survive with its first line
        if self._fd is not None:
            os.close(self._fd)
        self._fd = fd
        self.size = os.fstat(fd).st_size

    # writing

    def append(self, record: Mapping[str, Any]) -> None:
        """Durably append one record, or raise with the file as it was."""
        self.extend((record,))

    def extend(self, records: Iterable[Mapping[str, Any]], *, sync: bool = True) -> None:
        """Durably append a group of records with one write and one fsync, or raise with the
        file as it was (none of them in it). `sync=False`: one write, no fsync; the next
        synced append makes these durable too (a process's death never loses them, a
        machine's may)."""
        self._check_writable()
        if self._fd is None:
            self.open_for_append()  # an earlier open failed (F317: retry on the next write)
        assert self._fd is not None
        lines = [self.encode(record) for record in records]
        data = b"".join(lines)
        try:
            self.writer(self._fd, data)
            if self.fsync and sync:
                SYSTEM_DISK.fsync(self._fd)
        except OSError as error:
            if self.cut_back:
                self._cut_back()
            else:
                self.broken = error
            if error.filename is None:  # os.write/fsync name no file: say which (one line)
                error.filename = str(self.path)
            raise
        self.size += len(data)
        self.lines += len(lines)
        self._content.update(data)

    def sync(self) -> None:
        """Make every append so far durable (one that was made, and maybe not synced, by a
        writer that died: the generation log's confirmation of another's record)."""
        self._check_writable()
        if self._fd is None:
            self.open_for_append()
        SYSTEM_DISK.fsync(self._fd)

    def replace_contents(self, data: bytes) -> None:
        """Rewrite the whole file as `data`, whole lines of it (its owner's compaction):
        atomically and durably, old or new, never a mix; appends go on after it."""
        self._check_writable()
        write_durable(self.path, data, fsync=self.fsync)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.open_for_append()
        self.lines = data.count(b"\n")
        self._content = hashlib.sha256(data)
        self._prefix = None

    def changed_behind_our_back(self) -> str | None:
        """Why the file is not exactly what this owner wrote, or None if it is."""
        try:
            on_disk = self.path.read_bytes()
        except OSError as error:
            return f"cannot read it back: {error.strerror}"
        if len(on_disk) != self.size:
            return f"it holds {len(on_disk)} bytes, this campaign wrote {self.size}"
        start = 0
        if self._prefix is not None:
            start, digest = self._prefix
            if digest and hashlib.sha256(on_disk[:start]).hexdigest() != digest:
                return "the records before this run's differ from its snapshot's"
        if hashlib.sha256(on_disk[start:]).hexdigest() != self._content.hexdigest():
            return "its bytes differ from those this campaign wrote"
        self._whole_digest = hashlib.sha256(on_disk).hexdigest()
        return None

    @property
    def content_digest(self) -> str:
        """The SHA-256 of what the owner wrote into the file, the prefix it did not read
        included once `changed_behind_our_back` has checked the whole file ("" until then)."""
        if self._prefix is None:
            return self._content.hexdigest()
        return self._whole_digest or ""

    def _cut_back(self) -> None:
        # F313 §3.4: an append failure must leave no trace a later open would replay. A torn
        # fragment left in place would also turn the NEXT good line into a corrupt one.
        try:
            os.ftruncate(self._fd, self.size)
            if self.fsync:
                SYSTEM_DISK.fsync(self._fd)
        except OSError as error:
            self.broken = error
            log.error("journal %s: could not remove a failed append: %s", self.path, error)

    def _check_writable(self) -> None:
        if self._closed:
            raise JournalClosed(f"journal {self.path} is closed")
        if self.broken is not None:
            raise JournalBroken(self.broken.errno, f"journal {self.path} is broken after a "
                                f"failed append could not be removed: {self.broken}")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._closed = True


def text_line(text: str) -> bytes:
    """A line of text as REASONS holds it (encode of a LineLog of text)."""
    return text.encode("utf-8", "surrogateescape") + b"\n"


def note_reason(quarantine_dir: Path, name: str, reason: str) -> None:
    """Say in `quarantine_dir`/REASONS why `name` was set aside there (one line, appended;
    not fsynced: the set-aside file itself is what must survive)."""
    reasons = LineLog(Path(quarantine_dir) / REASONS, fsync=False, encode=text_line)
    try:
        reasons.append(f"{name}: {reason}")
    finally:
        reasons.close()
