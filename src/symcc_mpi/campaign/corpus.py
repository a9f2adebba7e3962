"""A master's view of the campaign directory: the corpus, its AFL-style queues, staging.

The content-addressed corpus (`corpus/<sha256>`), the AFL names that point into it (queue/,
crashes/, hangs/: hard links, ids dense and in order), the staged packs workers leave and the
master promotes, and what is set aside in quarantine/. Where each lives: layout.py; the done
journal this view writes into: done_log.py (the group commit) and wal.py (its records).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
from collections.abc import Iterable
from pathlib import Path

from symcc_mpi.campaign import published, snapshot, stop, wal
from symcc_mpi.campaign.done_log import DoneLog
from symcc_mpi.campaign.layout import (
    DONE_JOURNAL,
    LAYOUT_VERSION,
    MARKER,
    MASTER_LOCK,
    CampaignError,
    done_journals,
    layout_of,
    master_state,
    sha256_bytes,
)
from symcc_mpi.campaign.queues import AflQueues
from symcc_mpi.durable.atomic import make_directories, write_durable
from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.durable.journal import Damage, note_reason
from symcc_mpi.durable.lines import Writer
from symcc_mpi.durable.locks import FileLock, FlockHeld, check_unlocked
from symcc_mpi.durable.regular import DIRECTORY_FLAGS, open_regular
from symcc_mpi.scheduling.frontier import Frontier
from symcc_mpi.wire.protocol import SHA256_PATTERN, TOKEN_PATTERN, Finding, ResultField
from symcc_mpi.wire.staging import Pack, PackRejected

log = logging.getLogger("symcc_mpi.campaign.corpus")


class CorruptInput(OSError):
    """A corpus file whose bytes are not those its name promises (now quarantined)."""


MARKER_PREFIX = ".master-"  # mark_staging's files: .master-<index>-<random>


class CampaignDir(AflQueues):
    """A master's view of OUT. Only masters mutate it, each its own state; workers stage."""

    def __init__(self, out: Path, inputs: Frontier | None = None, *, master: int = 0):
        # Per-input state lives in the master's compact frontier (AFL queue ids here).
        super().__init__(out, inputs if inputs is not None else Frontier(),
                         master_state(out, master))
        self.master = master
        self.staging = out / ".staging"
        self._staging = str(self.staging)
        self._staging_fd: int | None = None  # open_staged's
        self._marker: str | None = None  # mark_staging's
        self.done_journal = self.state / DONE_JOURNAL
        self._lock = FileLock(self.state / MASTER_LOCK)
        self.journal = DoneLog(self.done_journal, self.quarantine, guard=self._check_owner)
        self.snapshot_on_close = False  # a lone master's clean close saves one (snapshot.py)
        # Inputs whose corpus file this master found damaged and quarantined (a power failure
        # kept the name, lost the bytes): known, yet published again when a parent yields
        # them again (commit.py).
        self.damaged: set[str] = set()

    # -- opening and closing -------------------------------------------------------------

    def create(self, config_json: dict) -> None:
        for directory in (self.corpus, self.staging, self.queue, self.crashes, self.hangs,
                          self.state):
            make_directories(directory)
        marker = {"layout": LAYOUT_VERSION, "created": SYSTEM_CLOCK.time(), "config": config_json}
        write_durable(self.out / MARKER, json.dumps(marker, indent=1).encode())

    def upgrade_layout(self) -> None:
        """The lock holder, resuming: mark OUT as this version's layout before it appends to
        a journal of an older one (whose records it still reads, wal.check)."""
        if layout_of(self.out) == LAYOUT_VERSION:
            return
        marker = json.loads((self.out / MARKER).read_bytes())
        marker["layout"] = LAYOUT_VERSION
        write_durable(self.out / MARKER, json.dumps(marker, indent=1).encode())

    def lock(self, *, wait: float = 0.0) -> None:
        """One master per campaign directory (durable/locks.py's FileLock on state/master.lock).
        `wait`: seconds to wait for a holder that just died to lose it (a master taking over
        from a dead one: on NFS the server frees a dead client's locks only when its lease
        expires)."""
        try:
            self._lock.acquire(wait=wait)
        except FlockHeld:
            raise CampaignError(f"another campaign is running in {self.out}") from None

    def check_not_running(self) -> None:
        """Refuse, before any rank is started, a directory whose master holds the lock (the
        master still takes it for real). Takes and drops the flock; writes nothing."""
        try:
            check_unlocked(self.state / MASTER_LOCK)
        except FlockHeld:
            raise CampaignError(f"another campaign is running in {self.out}") from None
        except OSError as error:
            raise CampaignError(f"cannot read {self.state / MASTER_LOCK}: "
                                f"{error.strerror}") from None

    def _check_owner(self) -> None:
        if not self._lock.held:
            raise CampaignError(f"{self.done_journal}: only the process holding the "
                                "campaign lock may repair or append to the done journal")

    def close(self) -> None:
        # Closed even when the last sync fails (a full disk): a handle left open would be
        # flushed again at exit and the error reported a second time.
        synced = False
        try:
            self.sync_done()
            synced = True
        finally:
            try:
                whole = self.journal.close()
                if whole is not None and self.snapshot_on_close and synced:
                    self._save_snapshot(whole, in_flight=[], closed=True)
            finally:
                self.publish_log.close()
                self.unmark_staging()
                if self._staging_fd is not None:
                    os.close(self._staging_fd)
                    self._staging_fd = None
                self._lock.release()

    def save_snapshot(self, in_flight: list[str]) -> None:
        """A snapshot of the campaign as it is right after a group commit (snapshot.py), with
        the work `in_flight`; what is published from now on goes to its publish log."""
        self._save_snapshot(self.journal.identity(), in_flight, closed=False)

    def _save_snapshot(self, journal: tuple[int, int, str], in_flight: list[str], *,
                       closed: bool) -> None:
        serial = int.from_bytes(os.urandom(8)) >> 1  # names its publish log
        snapshot.save(self, *journal, publish_serial=serial, in_flight=in_flight,
                      closed=closed)
        self.publish_log.start(serial)  # and the logs of the earlier ones go

    # -- the done journal (done_log.py) ----------------------------------------------------

    @property
    def epoch(self) -> int:
        return self.journal.epoch

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self.journal.epoch = epoch

    @property
    def commit_probe(self):
        return self.journal.commit_probe

    @commit_probe.setter
    def commit_probe(self, probe) -> None:
        self.journal.commit_probe = probe

    def open_journal(self, *, writer: Writer | None = None,
                     after: snapshot.Snapshot | None = None) -> list[dict]:
        """The lock holder's replay of every record (DoneLog.open)."""
        return self.journal.open(writer=writer, after=after)

    def open_done(self, *, writer: Writer | None = None) -> list[dict]:
        """The done records, as `open_journal` (the work records are left out)."""
        return [r for r in self.open_journal(writer=writer) if wal.is_done(r)]

    def read_done(self) -> list[dict]:
        """Replay the done journal read-only (any process, live campaign or not); a torn last
        line is reported and left in place: only the lock holder repairs it (`open_done`)."""
        records, torn = self.inspect_done()
        if torn is not None:
            log.warning("%s", torn)
        return records

    def inspect_done(self) -> tuple[list[dict], Damage | None]:
        """The done records and the torn last line, if any; writes nothing. A bad record
        before the last line is a CampaignError naming the file and line."""
        records, torn = self.inspect_journal()
        return [r for r in records if wal.is_done(r)], torn

    def inspect_journal(self, path: Path | None = None, *,
                        after: tuple[int, int] = (0, 0)) -> tuple[list[dict], Damage | None]:
        """Every record of a done journal (done records and work records), read-only: this
        master's, or the one at `path` (wal.read); `after`: a prefix not read."""
        return wal.read(path or self.done_journal, after=after)

    def findings_to_forward(self) -> list[Finding]:
        """`unnamed_findings` of the children this master's journal says it published: those
        of its done records, and of its commit manifests (a redone commit publishes nothing
        anew). Handed to the first master again when the messages may have died."""
        records, _ = self.inspect_journal()
        parents = {child: record["digest"] for record in records if wal.is_done(record)
                   for child in record.get("published", ())}
        parents.update((child, record["digest"]) for record in records
                       if wal.kind_of(record) is wal.Kind.COMMIT
                       for child, _, status in record.get("publish", ()) if status == "ok")
        return self.unnamed_findings(parents)

    def done_elsewhere(self) -> set[str]:
        """The inputs the other masters' done journals record (--masters), read-only: a torn
        last line is its own master's to repair."""
        done: set[str] = set()
        for path in done_journals(self.out):
            if path != self.done_journal:
                records, _ = self.inspect_journal(path)
                done.update(r["digest"] for r in records if wal.is_done(r))
        return done

    def done_since(self, moment: float) -> int:
        """How many done records were written at or after `moment` (Unix time)."""
        records, _ = self.inspect_done()
        return sum(1 for record in records if record["time"] >= moment)

    def record_done(self, digest: str, token: str, outcome: str, generation: int = 0,
                    published: list[str] | None = None, tier: int = 1) -> None:
        """The input is analysed and its results are published: its done record is appended
        at the next group commit (`sync_done`), after those results are durable. `published`:
        the children it added to corpus/ (for verify's oracle: none may go missing); `tier`:
        where the input came from (tiers/), and the record carries the epoch it ran in."""
        self.journal.record(wal.Done(digest=digest, token=token, outcome=outcome,
                                     time=round(SYSTEM_CLOCK.time(), 3),
                                     generation=generation, published=published or [],
                                     tier=tier, epoch=self.journal.epoch))

    def record_part(self, digest: str, part: int, token: str, outcome: str,
                    published: list[str]) -> None:
        """A part of a split input (splitting.py) is analysed and its results published: on
        record at the next group commit, like a done record, but the input is not done
        until its last part's done record."""
        self.journal.record(wal.Part(digest=digest, part=part, token=token, outcome=outcome,
                                     published=published))

    def record_work(self, record: wal.WorkRecord) -> None:
        """Write a work record (wal.py: dispatch, commit, recovered, requeue) into the
        journal now, unsynced (DoneLog.write_now)."""
        self.journal.write_now(record)

    def begin_epoch(self, epoch: int) -> None:
        """Epoch `epoch` begins (tiers/): on record, synced, before any of its work."""
        self.journal.begin_epoch(epoch)

    def sync_done(self) -> None:
        """The group commit (DoneLog.sync)."""
        self.journal.sync()

    def compact_if_due(self) -> int:
        """DoneLog.compact_if_due: the bytes dropped."""
        return self.journal.compact_if_due()

    def _published(self, path: str) -> None:
        self.journal.published(path)

    def restore(self, state: snapshot.Snapshot) -> list[str]:
        """What `read_queues` would rebuild, and the frontier's table, from a snapshot and
        what its publish log says was published after it (each input joins the frontier).
        Returns the inputs published after it that have no queue/ entry (their master died
        in between): the caller queues them, as `_rebuild_frontier` does."""
        self._next_ids = dict(state.next_ids)
        self.crash_digests = set(state.crashes)
        self.hang_digests = set(state.hangs)
        self.queue_names = dict(state.queue_names) if self.keep_queue_names else {}
        self.inputs.restore(state.table)
        self.epoch = state.epoch
        try:
            entries = published.read(self.state, state.publish_serial)
        except ValueError as error:
            path = self.state / published.LOG_FILE.format(serial=state.publish_serial)
            raise CampaignError(f"corrupt state file {path}: {error}") from None
        directories = {"corpus": self.corpus, "queue": self.queue, "crashes": self.crashes,
                       "hangs": self.hangs}
        since = published.replay(entries, lambda kind, digest, name: os.path.lexists(
            directories[kind] / (name or digest)))
        for kind, publications in since.entries.items():
            for entry_id, digest, name in publications:
                self._next_ids[kind] = max(self._next_ids[kind], entry_id + 1)
                if kind == "queue":
                    self.inputs.set_queue_id(digest, entry_id)
                    if self.keep_queue_names:
                        self.queue_names[digest] = name
                else:
                    (self.crash_digests if kind == "crashes" else self.hang_digests).add(digest)
        added = [digest for digest in since.inputs if self.inputs.add(digest)]
        return [digest for digest in added if self.inputs.queue_id(digest) is None]

    # -- reading state back ----------------------------------------------------------

    def corpus_digests(self) -> set[str]:
        """Every corpus entry named by a SHA-256; files named otherwise are quarantined.

        Bytes are not hashed here (a resume of a large campaign would spend its start-up on
        it): an input's bytes are checked against its name whenever they are loaded to be
        sent, and by `symcc-mpi verify`.
        """
        hashes = set()
        with os.scandir(self.corpus) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue  # an interrupted atomic write
                if SHA256_PATTERN.match(entry.name):
                    hashes.add(entry.name)
                else:
                    self._quarantine(Path(entry.path), "corpus file name is not a SHA-256")
        return hashes

    def read_input(self, digest: str) -> bytes:
        """A corpus input's bytes, checked against its name; a mismatch is quarantined.
        Read with 4 system calls, not open()'s 7 (it asks whether the file is a terminal and
        where it stands): the master reads one per dispatch."""
        fd, status = open_regular(os.path.join(self._corpus, digest))
        try:
            data = os.read(fd, status.st_size)
        finally:
            os.close(fd)
        if sha256_bytes(data) != digest:
            self._quarantine(self.corpus / digest, "corpus file name is not the SHA-256 of "
                             "its bytes")
            self.damaged.add(digest)
            raise CorruptInput(f"corpus input {digest[:12]}: bytes do not match their SHA-256 "
                               "(quarantined)")
        return data

    def _quarantine(self, path: Path, reason: str) -> None:
        make_directories(self.quarantine)
        target = self.quarantine / f"{path.parent.name}-{path.name}"
        os.replace(path, target)
        note_reason(self.quarantine, target.name, reason)

    # -- the master's commit path ------------------------------------------------------

    def add_seed(self, data: bytes, name: str) -> str:
        digest = sha256_bytes(data)
        path = self.corpus / digest
        if not path.exists():
            self.publish_log.intend("corpus", digest)
            write_durable(path, data, fsync=False)
            self._published(str(path))
        if self.inputs.queue_id(digest) is None:
            self._add_to_queue(digest, orig=name)
        return digest

    def staged_pack(self, token: str) -> str:
        # Strings, not Paths, on the master's per-result path: a Path join costs ~25 µs.
        return os.path.join(self._staging, _checked_token(token))

    def open_staged(self, token: str) -> Pack:
        """The staged pack of dispatch `token`, its index read (staging.py): the master reads
        and checks each child it keeps from it, and publishes the bytes it checked, never the
        staged file, which its writer could still change. Raises PackRejected."""
        if self._staging_fd is None:  # opened once: two system calls fewer per RESULT
            try:
                self._staging_fd = os.open(self._staging, DIRECTORY_FLAGS)
            except OSError as error:
                raise PackRejected(ResultField.MISSING_FILE,
                                   f"{self._staging}: {error.strerror}") from None
        return Pack(_checked_token(token), dir_fd=self._staging_fd)

    def promote(self, digest: str, data: bytes) -> bool:
        """Publish verified bytes as corpus/<digest>; False if it was already there."""
        target = os.path.join(self._corpus, digest)
        if os.path.exists(target):
            return False
        # Synced at the group commit. Exclusive: another master may publish the same child
        # at the same moment, and only one of them finds it (counts it, queues it).
        self.publish_log.intend("corpus", digest)
        if not write_durable(Path(target), data, fsync=False, exclusive=True):
            return False
        self._published(target)
        return True

    def sync_at_next_commit(self, digest: str) -> None:
        """corpus/<digest>, published by another, is made durable by this master's next
        group commit too."""
        self._published(os.path.join(self._corpus, digest))

    def import_entry(self, digest: str, data: bytes, instance: str, source_id: int, *,
                     new_coverage: bool) -> None:
        """An AFL instance's queue entry, new to the campaign: into corpus/ and queue/ under
        afl-fuzz's own provenance name, `id:N,sync:INSTANCE,src:ID` (afl_sync.py)."""
        self.promote(digest, data)
        self._add_to_queue(digest, sources=(source_id,), op=None, sync=instance,
                           new_coverage=new_coverage)

    def mark_staging(self) -> str:
        """The name of a file this master makes in OUT/.staging/ and removes at close: a
        worker that sees it shares OUT with its master (ConfigVerdict.staging_marker)."""
        if self._marker is None:
            name = f"{MARKER_PREFIX}{self.master}-{secrets.token_hex(8)}"
            (self.staging / name).touch(exist_ok=False)
            self._marker = name
        return self._marker

    def unmark_staging(self) -> None:
        """No worker of this master's will look for its marker again."""
        if self._marker is not None:
            _remove(os.path.join(self._staging, self._marker))
            self._marker = None

    def discard_staging(self, token: str) -> None:
        _remove(self.staged_pack(token))

    def leftover_staging(self) -> list[Path]:
        return sorted(self.staging.iterdir()) if self.staging.exists() else []

    def clear_staging(self, tokens: Iterable[str] | None = None) -> None:
        """Remove whatever is staged: nobody writes there any more (packs, the markers of
        dead masters, and the staging directories of an older version). With several
        masters, the packs of the dispatches `tokens` alone, and this index's markers: the
        other masters' workers still write theirs."""
        if tokens is not None:
            for token in tokens:
                self.discard_staging(token)
            for marker in self.staging.glob(f"{MARKER_PREFIX}{self.master}-*"):
                if marker.name != self._marker:
                    _remove(str(marker))
            return
        for leftover in self.leftover_staging():
            if leftover.name != self._marker:
                _remove(str(leftover))

    def request_stop(self, run_id: str) -> None:
        """Ask the master of run `run_id` to stop (stop.py)."""
        stop.request_stop(self.out, run_id)

    @property
    def stop_request(self) -> Path:
        return self.out / stop.STOP_REQUEST

    def read_stop_request(self, run_id: str, run_started: float) -> stop.StopRequest:
        """Whether a stop was asked of run `run_id` (stop.py)."""
        return stop.read_stop_request(self.out, run_id, run_started)

    def withdraw_stop_request(self) -> None:
        stop.withdraw_stop_request(self.out)



def _checked_token(token: str) -> str:
    if not TOKEN_PATTERN.match(token):
        raise ValueError(f"bad token {token!r}")
    return token


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except IsADirectoryError:
        shutil.rmtree(path, ignore_errors=True)
    except FileNotFoundError:
        pass
