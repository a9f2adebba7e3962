"""A master's done journal, for the lock holder: its replay, the group commit, compaction.

The done journal is group-committed (`sync`, paced by checkpoint.py): `record_done` only
buffers a record; the commit fsyncs the data of every file published since the last one, then
their directories, then appends the buffered records in one write and fsyncs the journal. A
done line therefore never names an input whose children could still be lost to a crash of the
machine; a crash before the append loses only those lines, and their inputs are analysed again.

Under ULFM the same journal is the work WAL of F443 §3 (wal.py): a dispatch record is written
before its WORK is sent, and a commit record (the result's manifest) before anything of it is
published; the done record follows as above. Those two are written at once but not fsynced
on their own (the group commit's fsync covers them): they exist for a master that dies, whose
page cache survives it. The master that takes over redoes every commit without a done record,
from the manifest and the staged files, and counts every dispatch without either as work in
flight at the failure.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import msgspec

from symcc_mpi.campaign import wal
from symcc_mpi.campaign.wal import CorruptJournal
from symcc_mpi.durable.atomic import fsync_directory, fsync_once
from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.durable.journal import Damage, DamageKind, JournalCorrupt, LineLog
from symcc_mpi.durable.lines import Writer

log = logging.getLogger("symcc_mpi.campaign.done_log")

# The journal is compacted once it reaches this size and twice its size after the last
# compaction (or as the run opened it): each compaction reads it whole, so their cost stays
# proportional to growth.
COMPACT_FLOOR = 4 << 20
_JSON = msgspec.json.Decoder()

CommitProbe = Callable[[str, int], None]
"""Called at each step of the N-th group commit that carries done records (fault injection):
"before-children-sync", "before-done-append", "after-done-fsync"."""


class DoneLog:
    """The done journal at `path` as its owner (the holder of the campaign lock) writes it."""

    def __init__(self, path: Path, quarantine: Path, *, guard: Callable[[], None]):
        self.path = path
        self.quarantine = quarantine
        self._guard = guard  # raises unless this process may repair and append (the lock)
        self._log: LineLog | None = None  # open only once `open` replayed it
        self._pending: list[dict] = []  # recorded, not yet appended (next group commit)
        self._unsynced_files: list[str] = []  # published since the last group commit
        self._unsynced_directories: set[str] = set()
        self.group_commits = 0  # those that carried done records
        self.epoch = 0  # of the work being recorded (tiers/schedule.py)
        self._compacted_size = 0  # of the journal after its last compaction
        self.commit_probe: CommitProbe | None = None

    def open(self, *, writer: Writer | None = None, after=None) -> list[dict]:
        """Replay the journal, cut a torn last line (kept in quarantine/ under the journal's
        name and line number, with a REASONS line) and open it to append. `writer` replaces
        the journal's write step (fault injection); `after`: a snapshot (snapshot.py) that
        covers the journal's first records, which are not read (only those after)."""
        self._guard()  # a reader that repaired would cut a live owner's append in progress
        records: list[dict] = []
        done_log = LineLog(self.path, writer=writer, quarantine_dir=self.quarantine,
                           strict=True)
        apply = lambda record: records.append(wal.check(record))  # noqa: E731
        try:
            if after is not None:
                done_log.open_after(after.journal_size, after.journal_sha256,
                                    after.journal_lines, apply)
            else:
                done_log.load(apply)
        except JournalCorrupt as error:
            raise CorruptJournal(error.damage) from None
        done_log.open_for_append()
        if self._log is not None:
            self._log.close()
        self._log = done_log
        # What a resume found counts as compacted: compacting it in the first rounds would
        # read it whole before the first dispatch (3.7 s at a million executions).
        self._compacted_size = done_log.size
        return records

    @property
    def is_open(self) -> bool:
        return self._log is not None

    def record(self, record: wal.Record) -> None:
        """Buffer a done or part record: appended at the next group commit (`sync`), after
        the results it vouches for are durable."""
        self._pending.append(wal.encode(record))

    def write_now(self, record: wal.WorkRecord) -> None:
        """Write a work record now, unsynced: it precedes the action it announces for any
        process that reads it later. In an epoch past the first it carries the epoch's
        number."""
        if self._log is None:
            self.open()
        if self.epoch and not isinstance(record, wal.Epoch):
            record = msgspec.structs.replace(record, epoch=self.epoch)
        self._log.extend((wal.encode(record),), sync=False)

    def begin_epoch(self, epoch: int) -> None:
        """Epoch `epoch` begins (tiers/): on record, synced, before any of its work."""
        self.sync()
        if self._log is None:
            self.open()
        self._log.extend((wal.encode(wal.Epoch(epoch=epoch,
                                               time=round(SYSTEM_CLOCK.time(), 3))),))
        self.epoch = epoch

    def published(self, path: str) -> None:
        """A file just appeared under its final name: its bytes and its directory entry are
        made durable at the next group commit, before any done record that vouches for it."""
        self._unsynced_files.append(path)
        self._unsynced_directories.add(os.path.dirname(path))

    def sync(self) -> None:
        """Group commit: the published files' data, then their directories, then the done
        records since the last commit in one append and one fsync. A crash before the append
        loses those records, never their children: those inputs are analysed again."""
        if not self._pending and not self._unsynced_files:
            return
        carries_records = bool(self._pending)
        if carries_records:
            self.group_commits += 1
            self._probe("before-children-sync")
        synced: set[tuple[int, int]] = set()  # a queue/ entry is a hard link: one inode
        for path in self._unsynced_files:
            fsync_once(path, synced)
        for directory in self._unsynced_directories:
            fsync_directory(directory)
        self._unsynced_files.clear()
        self._unsynced_directories.clear()
        if not carries_records:
            return
        self._probe("before-done-append")
        if self._log is None:
            self.open()
        self._log.extend(self._pending)  # raises with the journal as it was
        self._pending.clear()
        self._probe("after-done-fsync")

    def _probe(self, step: str) -> None:
        if self.commit_probe is not None:
            self.commit_probe(step, self.group_commits)

    def compact_if_due(self) -> int:
        """Drop the work records of the work that went cleanly (dispatched once, committed,
        done) from the journal, once it has doubled since the last compaction (and holds
        COMPACT_FLOOR at least): the journal then grows by what a resume needs, about a done
        record per execution, whatever the work records cost. Everything a resume, a
        takeover or `verify` reads is kept: done and part records, every record of work in
        flight or dispatched more than once, the take-backs that declare why, the epochs.
        Returns the bytes dropped."""
        journal = self._log
        if journal is None or journal.size < max(COMPACT_FLOOR, 2 * self._compacted_size):
            return 0
        raw = journal.path.read_bytes()
        if len(raw) != journal.size:
            raise JournalCorrupt(Damage(journal.path, 0, DamageKind.CORRUPT_LINE,
                                        f"{len(raw)} bytes where this campaign wrote "
                                        f"{journal.size}", None))
        lines = raw.splitlines(keepends=True)
        drop = wal.settled_work_lines([_JSON.decode(line[9:]) for line in lines])
        kept = b"".join(line for number, line in enumerate(lines) if number not in drop)
        journal.replace_contents(kept)
        self._compacted_size = len(kept)
        log.info("compacted %s: %d work records of settled work dropped, %d -> %d bytes",
                 self.path, len(drop), len(raw), len(kept))
        return len(raw) - len(kept)

    def identity(self) -> tuple[int, int, str]:
        """The journal's size, records and SHA-256 ("" when this owner cannot know it without
        reading the file: it opened it after a snapshot and has not rewritten it since)."""
        if self._log is None:
            self.open()
        return self._log.size, self._log.lines, self._log.content_digest

    def close(self) -> tuple[int, int, str] | None:
        """Close the journal; its size, records and SHA-256 when it holds exactly what this
        owner wrote (a snapshot may then cover it), else None (said in the log)."""
        done_log, self._log = self._log, None
        if done_log is None:
            return None
        try:
            changed = done_log.changed_behind_our_back()
            if changed:
                log.error("%s changed under the campaign holding its lock: %s", self.path,
                          changed)
                return None
            log.info("%s: %d records, %d bytes, sha256 %s, as this campaign wrote it",
                     self.path, done_log.lines, done_log.size, done_log.content_digest)
            return done_log.size, done_log.lines, done_log.content_digest
        finally:
            done_log.close()

