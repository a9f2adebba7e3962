"""The campaign directory: content-addressed corpus, staging, AFL-style queues, done journal.

Layout (DESIGN §4):
    OUT/.symcc-mpi          marker: this directory holds a symcc-mpi campaign
    OUT/corpus/<sha256>     every input the campaign keeps, named by the SHA-256 of its bytes
    OUT/.staging/<token>    one pack of children per dispatch (staging.py), written by the
                            worker, verified child by child and promoted only by the master
    OUT/queue/ crashes/ hangs/   AFL-style names (id:NNNNNN,...), hard links where possible
    OUT/state/done.jsonl    one checksummed line per analysed input: the resume point
                            (durable/journal.py's format; only the lock holder writes it);
                            under ULFM also the work records of F443's WAL (below)
    OUT/state/generations.jsonl  the communicator generations and recoveries (ulfm/)

The done journal is group-committed (`sync_done`, paced by checkpoint.py): `record_done` only
buffers a record; the commit fsyncs the data of every file published since the last one, then
their directories, then appends the buffered records in one write and fsyncs the journal. A
done line therefore never names an input whose children could still be lost to a crash of the
machine; a crash before the append loses only those lines, and their inputs are analysed again.

Under ULFM the same journal is the work WAL of F443 §3: a `dispatch` record (input, token,
generation) is written before its WORK is sent, and a `commit` record (the result's manifest:
what of it is to be published) before anything of it is published; the done record follows
as above. Those two are written at once but not fsynced on their own (the group commit's
fsync covers them): they exist for a master that dies, whose page cache survives it. The
master that takes over redoes every commit without a done record, from the manifest and the
staged files, and counts every dispatch without either as work in flight at the failure.
"""

from __future__ import annotations

import enum
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from symcc_mpi.campaign import snapshot
from symcc_mpi.campaign.report import afl_queue_name, parse_afl_queue_id
from symcc_mpi.durable.atomic import SYSTEM_DISK, fsync_directory, write_durable
from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.durable.journal import Damage, DamageKind, JournalCorrupt, LineLog, Writer, inspect
from symcc_mpi.durable.regular import DIRECTORY_FLAGS
from symcc_mpi.scheduling.frontier import Frontier
from symcc_mpi.scheduling.splitting import parse_work_id, part_id
from symcc_mpi.wire.protocol import SHA256_PATTERN, TOKEN_PATTERN, Finding, ResultField
from symcc_mpi.wire.staging import Pack, PackRejected

MARKER = ".symcc-mpi"
STOP_REQUEST = ".stop-request"
# The run id the launcher gives a job (and writes into the stop requests it makes for it).
RUN_ID_ENV = "SYMCC_MPI_RUN_ID"
LAYOUT_VERSION = 1
DONE_JOURNAL = "done.jsonl"
LEASE_DIRECTORY_PREFIX = ".standalone-work-"  # + the job epoch: a several-master job's leases
MASTER_STATE = "master-{}"  # under state/: master k's own state, for k >= 1 (--masters)
FINDINGS = "findings"  # in a master's state: crashes and hangs it handed to the first master

log = logging.getLogger("symcc_mpi.campaign.corpus")
# The journal is compacted once it reaches this size and twice its size after the last
# compaction: each compaction reads it whole, so their cost stays proportional to growth.
COMPACT_FLOOR = 4 << 20
_JSON = msgspec.json.Decoder()

CommitProbe = Callable[[str, int], None]
"""Called at each step of the N-th group commit that carries done records (fault injection):
"before-children-sync", "before-done-append", "after-done-fsync"."""


class StopRequest(enum.Enum):
    NONE = "none"
    THIS_RUN = "this-run"
    STALE = "stale"  # left by a run that is gone: never stops the next one


def stop_request_verdict(text: str, made: float, run_id: str, run_started: float) -> StopRequest:
    """Whom a stop request is for. The launcher writes the run id it gave the job; a user
    under their own launcher may `touch` an empty one (README), which counts only if it was
    made after this run started. Anything else was left by an earlier run."""
    named = text.strip()
    if named == run_id or (not named and made >= run_started):
        return StopRequest.THIS_RUN
    return StopRequest.STALE


class CampaignError(Exception):
    """The campaign directory cannot be used as asked: one line, exit status 2."""


class CorruptInput(OSError):
    """A corpus file whose bytes are not those its name promises (now quarantined)."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_out_dir(out: Path, *, resume: bool) -> None:
    """Refuse an output directory we must not write into, before anything is launched."""
    if out.exists() and not out.is_dir():
        raise CampaignError(f"output path {out} exists and is not a directory")
    if resume:
        if not (out / MARKER).is_file():
            raise CampaignError(f"--resume: {out} holds no symcc-mpi campaign to resume")
        _probe_writable(out)
        return
    if out.exists():
        if (out / MARKER).exists():
            raise CampaignError(
                f"output directory {out} already holds a campaign: "
                "pass --resume to continue it, or choose another directory"
            )
        if any(out.iterdir()):
            raise CampaignError(
                f"output directory {out} is not empty and holds no symcc-mpi campaign"
            )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CampaignError(f"output directory {out} is not writable: {error.strerror}") from None
    _probe_writable(out)


def _probe_writable(out: Path) -> None:
    try:
        probe = out / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise CampaignError(f"output directory {out} is not writable: {error.strerror}") from None


def master_state(out: Path, master: int) -> Path:
    """Where master `master` keeps its journal, lock and checkpoints: state/ itself for the
    first (a one-master campaign's layout), state/master-k/ for the others."""
    state = out / "state"
    return state if master == 0 else state / MASTER_STATE.format(master)


def done_journals(out: Path) -> list[Path]:
    """Every master's done journal that exists, the first master's first: together they are
    the campaign's "analysed" set, whatever number of masters wrote them."""
    state = out / "state"
    numbered = {}
    for path in state.glob(MASTER_STATE.format("*") + "/" + DONE_JOURNAL):
        number = path.parent.name.rpartition("-")[2]
        if number.isdigit():
            numbered[int(number)] = path
    others = [numbered[number] for number in sorted(numbered)]
    first = state / DONE_JOURNAL
    return ([first] if first.exists() else []) + others


class CampaignDir:
    """A master's view of OUT. Only masters mutate it, each its own state; workers stage."""

    def __init__(self, out: Path, inputs: Frontier | None = None, *, master: int = 0):
        self.out = out
        self.master = master
        # Per-input state lives in the master's compact frontier (AFL queue ids here).
        self.inputs = inputs if inputs is not None else Frontier()
        self.corpus = out / "corpus"
        self.staging = out / ".staging"
        self.queue = out / "queue"
        self.crashes = out / "crashes"
        self.hangs = out / "hangs"
        self.state = master_state(out, master)
        self.quarantine = out / "quarantine"
        self._corpus, self._staging, self._queue = map(str, (self.corpus, self.staging,
                                                             self.queue))
        self.done_journal = self.state / DONE_JOURNAL
        self._lock_handle = None
        self._done_log: LineLog | None = None  # open only in the lock holder
        self._done_pending: list[dict] = []  # recorded, not yet appended (next group commit)
        self._unsynced_files: list[str] = []  # published since the last group commit
        self._unsynced_directories: set[str] = set()
        self.group_commits = 0  # those that carried done records
        self.epoch = 0  # of the work being recorded (tiers/schedule.py)
        self._compacted_size = 0  # of the journal after its last compaction
        self.snapshot_on_close = False  # a lone master's clean close saves one (snapshot.py)
        self.commit_probe: CommitProbe | None = None
        self.crash_hashes: set[str] = set()
        self.hang_hashes: set[str] = set()
        self._next_ids = {"queue": 0, "crashes": 0, "hangs": 0}
        # Each queue/ entry's name by digest, kept when asked for (a hybrid campaign ranks
        # its frontier by them, afl_sync.helper_rank); set before `read_queues`.
        self.keep_queue_names = False
        self.queue_names: dict[str, str] = {}
        # A master other than the first names nothing in queue/, crashes/, hangs/: it hands
        # each finding to the first master (federation.py), which keeps AFL's ids in order.
        self.forward_finding: Callable[[Finding], None] | None = None

    # -- opening -----------------------------------------------------------------------

    def create(self, config_json: dict) -> None:
        for directory in (self.corpus, self.staging, self.queue, self.crashes, self.hangs,
                          self.state):
            directory.mkdir(parents=True, exist_ok=True)
        marker = {"layout": LAYOUT_VERSION, "created": SYSTEM_CLOCK.time(), "config": config_json}
        write_durable(self.out / MARKER, json.dumps(marker, indent=1).encode())

    def lock(self, *, wait: float = 0.0) -> None:
        """One master per campaign directory (flock on a state file). `wait`: seconds to
        wait for a holder that just died to lose it (a master taking over from a dead one:
        on NFS the server frees a dead client's locks only when its lease expires)."""
        self.state.mkdir(parents=True, exist_ok=True)
        handle = open(self.state / "master.lock", "a+")
        deadline = SYSTEM_CLOCK.monotonic() + wait
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as error:
                if error.errno in (errno.EWOULDBLOCK, errno.EACCES) \
                        and SYSTEM_CLOCK.monotonic() < deadline:
                    SYSTEM_CLOCK.sleep(0.2)
                    continue
                handle.close()
                if error.errno in (errno.EWOULDBLOCK, errno.EACCES):
                    raise CampaignError(f"another campaign is running in {self.out}") from None
                raise
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._lock_handle = handle

    def check_not_running(self) -> None:
        """Refuse, before any rank is started, a directory whose master holds the lock (the
        master still takes it for real). Takes and drops the flock; writes nothing."""
        try:
            handle = open(self.state / "master.lock", "rb")
        except FileNotFoundError:
            return  # no master ever locked it
        except OSError as error:
            raise CampaignError(f"cannot read {self.state / 'master.lock'}: "
                                f"{error.strerror}") from None
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                if error.errno in (errno.EWOULDBLOCK, errno.EACCES):
                    raise CampaignError(f"another campaign is running in {self.out}") from None
                raise

    def close(self) -> None:
        # Closed even when the last sync fails (a full disk): a handle left open would be
        # flushed again at exit and the error reported a second time.
        synced = False
        try:
            self.sync_done()
            synced = True
        finally:
            done_log, self._done_log = self._done_log, None
            if done_log is not None:
                changed = done_log.changed_behind_our_back()
                if changed:
                    log.error("%s changed under the campaign holding its lock: %s",
                              self.done_journal, changed)
                else:
                    log.info("%s: %d records, %d bytes, sha256 %s, as this campaign wrote it",
                             self.done_journal, done_log.lines, done_log.size,
                             done_log.content_digest)
                    if self.snapshot_on_close and synced:
                        snapshot.save(self, done_log.size, done_log.lines,
                                      done_log.content_digest)
                done_log.close()
            if self._lock_handle is not None:
                self._lock_handle.close()
                self._lock_handle = None

    # -- reading state back ------------------------------------------------------------

    def corpus_hashes(self) -> set[str]:
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
        return [r for r in records if "kind" not in r], torn

    def inspect_journal(self, path: Path | None = None) -> tuple[list[dict], Damage | None]:
        """Every record of a done journal (done records and work records), read-only: this
        master's, or the one at `path`."""
        records: list[dict] = []
        damage = inspect(path or self.done_journal, lambda record: records.append(
            _checked_record(record)))
        torn = None
        for item in damage:  # only the last line can be torn
            if item.kind is not DamageKind.TORN_TAIL:
                raise _corrupt_done(item)
            torn = item
        return records, torn

    def done_elsewhere(self) -> set[str]:
        """The inputs the other masters' done journals record (--masters), read-only: a torn
        last line is its own master's to repair."""
        done: set[str] = set()
        for path in done_journals(self.out):
            if path != self.done_journal:
                records, _ = self.inspect_journal(path)
                done.update(r["sha256"] for r in records if "kind" not in r)
        return done

    def open_done(self, *, writer: Writer | None = None) -> list[dict]:
        """The done records, as `open_journal` (the work records are left out)."""
        return [r for r in self.open_journal(writer=writer) if "kind" not in r]

    def restore(self, state: snapshot.Snapshot) -> None:
        """What `read_queues` would rebuild, and the frontier's table, from a snapshot."""
        self._next_ids = dict(state.next_ids)
        self.crash_hashes = set(state.crashes)
        self.hang_hashes = set(state.hangs)
        self.queue_names = dict(state.queue_names) if self.keep_queue_names else {}
        self.inputs.restore(state.table)
        self.epoch = state.epoch

    def open_journal(self, *, writer: Writer | None = None,
                     after: snapshot.Snapshot | None = None) -> list[dict]:
        """The lock holder's replay: cut a torn last line (kept in quarantine/ under the
        journal's name and line number, with a REASONS line) and open the journal to append.
        `writer` replaces the journal's write step (fault injection); `after`: a snapshot
        that covers the journal's first records, which are not read (only those after)."""
        if self._lock_handle is None:
            # A reader that repaired would cut a live campaign's append in progress.
            raise CampaignError(f"{self.done_journal}: only the process holding the "
                                "campaign lock may repair or append to the done journal")
        records: list[dict] = []
        done_log = LineLog(self.done_journal, writer=writer, quarantine_dir=self.quarantine,
                           strict=True)
        apply = lambda record: records.append(_checked_record(record))  # noqa: E731
        try:
            if after is not None:
                done_log.open_after(after.journal_size, after.journal_sha256,
                                    after.journal_lines, apply)
            else:
                done_log.load(apply)
        except JournalCorrupt as error:
            raise _corrupt_done(error.damage) from None
        done_log.open_for_append()
        if self._done_log is not None:
            self._done_log.close()
        self._done_log = done_log
        return records

    def done_since(self, moment: float) -> int:
        """How many done records were written at or after `moment` (Unix time)."""
        records, _ = self.inspect_done()
        return sum(1 for record in records if record["time"] >= moment)

    def read_queues(self) -> None:
        """Rebuild hash -> AFL id maps and next ids from queue/, crashes/, hangs/.

        AFL entries are hard links to corpus/ files (or to staged files promoted there), so
        an inode names its digest without reading the bytes; only a copy is hashed.
        """
        by_inode = {}
        with os.scandir(self.corpus) as entries:
            for entry in entries:
                if SHA256_PATTERN.match(entry.name):
                    by_inode[entry.inode()] = entry.name
        for kind, directory in (("queue", self.queue), ("crashes", self.crashes),
                                ("hangs", self.hangs)):
            with os.scandir(directory) as entries:
                named = [(entry, parse_afl_queue_id(entry.name)) for entry in entries]
            for entry, entry_id in named:
                if entry_id is None:
                    continue
                self._next_ids[kind] = max(self._next_ids[kind], entry_id + 1)
                digest = by_inode.get(entry.inode()) or sha256_file(Path(entry.path))
                if kind == "queue":
                    if self.inputs.queue_id(digest) is None:
                        self.inputs.set_queue_id(digest, entry_id)
                        if self.keep_queue_names:
                            self.queue_names[digest] = entry.name
                elif kind == "crashes":
                    self.crash_hashes.add(digest)
                else:
                    self.hang_hashes.add(digest)

    def read_input(self, digest: str) -> bytes:
        """A corpus input's bytes, checked against its name; a mismatch is quarantined."""
        with open(os.path.join(self._corpus, digest), "rb") as handle:
            data = handle.read()
        if sha256_bytes(data) != digest:
            self._quarantine(self.corpus / digest, "corpus file name is not the SHA-256 of "
                             "its bytes")
            raise CorruptInput(f"corpus input {digest[:12]}: bytes do not match their SHA-256 "
                               "(quarantined)")
        return data

    def _quarantine(self, path: Path, reason: str) -> None:
        self.quarantine.mkdir(exist_ok=True)
        target = self.quarantine / f"{path.parent.name}-{path.name}"
        os.replace(path, target)
        with open(self.quarantine / "REASONS", "a") as handle:
            handle.write(f"{target.name}: {reason}\n")

    # -- the master's commit path ------------------------------------------------------

    def add_seed(self, data: bytes, name: str) -> str:
        digest = sha256_bytes(data)
        path = self.corpus / digest
        if not path.exists():
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
        try:
            directory = os.open(self._staging, DIRECTORY_FLAGS)
        except OSError as error:
            raise PackRejected(ResultField.MISSING_FILE,
                               f"{self._staging}: {error.strerror}") from None
        try:
            return Pack(_checked_token(token), dir_fd=directory)
        finally:
            os.close(directory)

    def promote(self, digest: str, data: bytes) -> bool:
        """Publish verified bytes as corpus/<digest>; False if it was already there."""
        target = os.path.join(self._corpus, digest)
        if os.path.exists(target):
            return False
        # Synced at the group commit. Exclusive: another master may publish the same child
        # at the same moment, and only one of them finds it (counts it, queues it).
        if not write_durable(Path(target), data, fsync=False, exclusive=True):
            return False
        self._published(target)
        return True

    def add_to_queue(self, digest: str, parent: str) -> None:
        if self.forward_finding is not None:
            self.forward_finding(Finding("queue", digest, parent))
            return
        self._add_to_queue(digest, sources=self._source_ids(parent))

    def queue_finding(self, digest: str, parent: str) -> bool:
        """Another master kept corpus/<digest>: its queue/ entry, once (the first master)."""
        if self.inputs.queue_id(digest) is not None \
                or not os.path.exists(os.path.join(self._corpus, digest)):
            return False
        self._add_to_queue(digest, sources=self._source_ids(parent))
        return True

    def import_entry(self, digest: str, data: bytes, instance: str, source_id: int, *,
                     new_coverage: bool) -> None:
        """An AFL instance's queue entry, new to the campaign: into corpus/ and queue/ under
        afl-fuzz's own provenance name, `id:N,sync:INSTANCE,src:ID` (afl_sync.py)."""
        self.promote(digest, data)
        self._add_to_queue(digest, sources=(source_id,), op=None, sync=instance,
                           new_coverage=new_coverage)

    def _add_to_queue(self, digest: str, *, sources: tuple[int, ...] = (),
                      orig: str | None = None, op: str | None = "symcc",
                      sync: str | None = None, new_coverage: bool = False) -> None:
        entry_id = self._next_ids["queue"]
        name = afl_queue_name(entry_id, sources, op, orig=orig, sync=sync, new_cov=new_coverage)
        target = os.path.join(self._queue, name)
        _publish_link(os.path.join(self._corpus, digest), target)
        self._take_id("queue")  # only once published: a failed link leaves no gap in the ids
        self._published(target)
        self.inputs.set_queue_id(digest, entry_id)
        if self.keep_queue_names:
            self.queue_names[digest] = name

    def save_finding(self, kind: str, digest: str, parent: str | None,
                     signal: int | None = None, *, data: bytes | None = None) -> bool:
        """Record a crashing or hanging input once; False if it is known already. `data`: the
        verified bytes of a child that is not in corpus/; without it, corpus/<digest>."""
        known = self.crash_hashes if kind == "crashes" else self.hang_hashes
        if digest in known:
            return False
        if self.forward_finding is not None:
            if data is not None:  # durable here first: the message may die with its receiver
                kept = self.state / FINDINGS / kind / digest
                kept.parent.mkdir(parents=True, exist_ok=True)
                write_durable(kept, data, fsync=False)  # synced at the group commit
                self._published(str(kept))
            self.forward_finding(Finding(kind, digest, parent or "", signal, data or b""))
            known.add(digest)
            return True
        name = afl_queue_name(self._next_ids[kind], self._source_ids(parent), sig=signal)
        directory = self.crashes if kind == "crashes" else self.hangs
        target = os.path.join(directory, name)
        if data is None:
            _publish_link(os.path.join(self._corpus, digest), target)
        else:
            write_durable(Path(target), data, fsync=False)  # synced at the group commit
        self._take_id(kind)
        self._published(target)
        known.add(digest)
        return True

    def adopt_findings(self) -> int:
        """The crashes and hangs other masters kept in their state and the first master did
        not name before the job ended (its message lost with it): named now, without their
        parent. Returns how many."""
        adopted = 0
        for kind in ("crashes", "hangs"):
            for path in sorted(self.out.glob(f"state/{MASTER_STATE.format('*')}/{FINDINGS}/"
                                             f"{kind}/*")):
                if SHA256_PATTERN.match(path.name) and path.is_file():
                    adopted += self.save_finding(kind, path.name, None,
                                                 data=path.read_bytes())
        return adopted

    def _source_ids(self, parent: str | None) -> tuple[int, ...]:
        source = self.inputs.queue_id(parent) if parent else None
        return () if source is None else (source,)

    def record_done(self, digest: str, token: str, outcome: str, generation: int = 0,
                    published: list[str] | None = None, tier: int = 1) -> None:
        """The input is analysed and its results are published: its done record is appended
        at the next group commit (`sync_done`), after those results are durable. `published`:
        the children it added to corpus/ (for verify's oracle: none may go missing); `tier`:
        where the input came from (tiers/), and the record carries the epoch it ran in."""
        record = {"sha256": digest, "token": token, "outcome": outcome,
                  "time": round(SYSTEM_CLOCK.time(), 3)}
        if generation:
            record["generation"] = generation
        if published:
            record["published"] = published
        if tier != 1:
            record["tier"] = tier
        if self.epoch:
            record["epoch"] = self.epoch
        self._done_pending.append(record)

    def record_part(self, digest: str, part: int, token: str, outcome: str,
                    published: list[str]) -> None:
        """A part of a split input (splitting.py) is analysed and its results published: on
        record at the next group commit, like a done record, but the input is not done
        until its last part's done record."""
        self._done_pending.append({"kind": "part", "sha256": digest, "part": part,
                                   "token": token, "outcome": outcome,
                                   "published": published})

    def record_work(self, kind: str, **fields) -> None:
        """Write a work record (`dispatch`, `commit`, `recovered`, ...) into the journal now,
        unsynced: it precedes the action it announces for any process that reads it later.
        In an epoch past the first it carries the epoch's number."""
        if self._done_log is None:
            self.open_done()
        if self.epoch:
            fields["epoch"] = self.epoch
        self._done_log.extend(({"kind": kind, **fields},), sync=False)

    def begin_epoch(self, epoch: int) -> None:
        """Epoch `epoch` begins (tiers/): on record, synced, before any of its work."""
        self.sync_done()
        if self._done_log is None:
            self.open_done()
        self._done_log.extend(({"kind": "epoch", "epoch": epoch,
                                "time": round(SYSTEM_CLOCK.time(), 3)},))
        self.epoch = epoch

    def _published(self, path: str) -> None:
        """A file just appeared under its final name: its bytes and its directory entry are
        made durable at the next group commit, before any done record that vouches for it."""
        self._unsynced_files.append(path)
        self._unsynced_directories.add(os.path.dirname(path))

    def sync_done(self) -> None:
        """Group commit: the published files' data, then their directories, then the done
        records since the last commit in one append and one fsync. A crash before the append
        loses those records, never their children: those inputs are analysed again."""
        if not self._done_pending and not self._unsynced_files:
            return
        carries_records = bool(self._done_pending)
        if carries_records:
            self.group_commits += 1
            self._probe("before-children-sync")
        synced: set[tuple[int, int]] = set()  # a queue/ entry is a hard link: one inode
        for path in self._unsynced_files:
            _fsync_file(path, synced)
        for directory in self._unsynced_directories:
            fsync_directory(directory)
        self._unsynced_files.clear()
        self._unsynced_directories.clear()
        if not carries_records:
            return
        self._probe("before-done-append")
        if self._done_log is None:
            self.open_done()
        self._done_log.extend(self._done_pending)  # raises with the journal as it was
        self._done_pending.clear()
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
        journal = self._done_log
        if journal is None or journal.size < max(COMPACT_FLOOR, 2 * self._compacted_size):
            return 0
        raw = journal.path.read_bytes()
        if len(raw) != journal.size:
            raise JournalCorrupt(Damage(journal.path, 0, DamageKind.CORRUPT_LINE,
                                        f"{len(raw)} bytes where this campaign wrote "
                                        f"{journal.size}", None))
        lines = raw.splitlines(keepends=True)
        drop = settled_work_lines([_JSON.decode(line[9:]) for line in lines])
        kept = b"".join(line for number, line in enumerate(lines) if number not in drop)
        journal.replace_contents(kept)
        self._compacted_size = len(kept)
        log.info("compacted %s: %d work records of settled work dropped, %d -> %d bytes",
                 self.done_journal, len(drop), len(raw), len(kept))
        return len(raw) - len(kept)

    def discard_staging(self, token: str) -> None:
        _remove(self.staged_pack(token))

    def leftover_staging(self) -> list[Path]:
        return sorted(self.staging.iterdir()) if self.staging.exists() else []

    def clear_staging(self) -> None:
        """Remove whatever is staged: nobody writes there any more (packs, and the staging
        directories of an older version)."""
        for leftover in self.leftover_staging():
            _remove(str(leftover))

    def request_stop(self, run_id: str) -> None:
        """Ask the master of run `run_id` to stop; the request names the run it is for."""
        (self.out / STOP_REQUEST).write_text(f"{run_id}\n")

    @property
    def stop_request(self) -> Path:
        return self.out / STOP_REQUEST

    def take_stop_request(self, run_id: str, run_started: float) -> StopRequest:
        """Whether a stop was asked of run `run_id`, which started at `run_started` (wall
        clock); a request is removed once read, whichever run it was for."""
        try:
            text = self.stop_request.read_text(errors="replace")
            made = self.stop_request.stat().st_mtime
        except FileNotFoundError:
            return StopRequest.NONE
        verdict = stop_request_verdict(text, made, run_id, run_started)
        self.stop_request.unlink(missing_ok=True)
        return verdict

    @property
    def next_ids(self) -> dict[str, int]:
        return dict(self._next_ids)

    @property
    def queue_entries(self) -> int:
        """queue/ ids run from 0 to this, dense (AFL's sync needs them so)."""
        return self._next_ids["queue"]

    def _take_id(self, kind: str) -> int:
        entry_id = self._next_ids[kind]
        self._next_ids[kind] = entry_id + 1
        return entry_id


WORK_RECORD_FIELDS = {
    "dispatch": {"sha256": str, "token": str, "generation": int},
    "commit": {"sha256": str, "token": str, "generation": int},
    "recovered": {"generation": int, "failed": list, "requeued": list},
    "requeue": {"sha256": str, "reason": str},
    "part": {"sha256": str, "part": int, "token": str, "published": list},
    "epoch": {"epoch": int},
}


@dataclass(frozen=True)
class Epochs:
    """A journal read by epoch (tiers/schedule.py): the epoch in progress, the inputs done
    in it, those done only in earlier ones, and the records of the epoch in progress."""

    epoch: int
    done: set[str]
    done_before: set[str]
    current: list[dict]


def replay_epochs(journal: list[dict], *, epoch: int = 0) -> Epochs:
    """An epoch begins only when no work is in flight: every record of an earlier epoch is
    settled, and what a resume redoes, requeues or counts in flight is in `current`.
    `epoch`: the one in progress when `journal` begins (a snapshot's)."""
    epoch = max((r["epoch"] for r in journal if r.get("kind") == "epoch"), default=epoch)
    current = [r for r in journal if r.get("epoch", 0) == epoch]
    done = {r["sha256"] for r in current if "kind" not in r}
    before = {r["sha256"] for r in journal if "kind" not in r and r.get("epoch", 0) < epoch}
    return Epochs(epoch, done, before - done, current)


def settled_work_lines(journal: list[dict]) -> set[int]:
    """The line numbers of the dispatch and commit records of whole inputs dispatched once
    in their epoch and done there, with no take-back on record: nothing reads them again."""
    open_lines: dict[tuple[int, str], list[int]] = {}
    dispatches: Counter[tuple[int, str]] = Counter()
    declared: set[tuple[int, str]] = set()
    settled: set[int] = set()
    for number, record in enumerate(journal):
        kind, epoch = record.get("kind"), record.get("epoch", 0)
        if kind in ("dispatch", "commit") and record.get("part") is None:
            key = (epoch, record["sha256"])
            open_lines.setdefault(key, []).append(number)
            dispatches[key] += kind == "dispatch"
        elif kind == "requeue":
            declared.add((epoch, record["sha256"]))
        elif kind == "recovered":
            declared.update((epoch, parse_work_id(work)[0]) for work in record["requeued"])
        elif kind is None:
            key = (epoch, record["sha256"])
            lines = open_lines.pop(key, [])
            if dispatches.pop(key, 0) == 1 and key not in declared:
                settled.update(lines)
            declared.discard(key)
    return settled


def work_of(record: dict) -> str:
    """The work id a dispatch, requeue, commit or part record is about (splitting.py)."""
    part = record.get("part")
    return record["sha256"] if part is None else part_id(record["sha256"], part)


def outstanding(journal: list[dict]) -> set[str]:
    """The work (ids: splitting.py) whose last dispatch the journal records as neither
    committed nor taken back."""
    out: set[str] = set()
    for record in journal:
        kind = record.get("kind")
        if kind == "dispatch":
            out.add(work_of(record))
        elif kind == "recovered":
            out.difference_update(record["requeued"])
        elif kind in ("requeue", "part"):
            out.discard(work_of(record))
        elif kind is None:  # the input is done: so are all its parts
            out = {work for work in out if parse_work_id(work)[0] != record["sha256"]}
    return out


def _checked_record(record: dict) -> dict:
    """A done record as `record_done` writes it, or a work record, or ValueError."""
    kind = record.get("kind")
    if kind is not None:
        fields = WORK_RECORD_FIELDS.get(kind)
        if fields is None:
            raise ValueError(f"unknown record kind {kind!r}")
        for name, kind_of in fields.items():
            if not isinstance(record.get(name), kind_of):
                raise ValueError(f"{kind} record: {name} missing or of the wrong type")
        return record
    if not isinstance(record.get("sha256"), str) or not SHA256_PATTERN.match(record["sha256"]):
        raise ValueError("no sha256 of an input")
    if not isinstance(record.get("token"), str) or not isinstance(record.get("outcome"), str) \
            or not isinstance(record.get("time"), (int, float)):
        raise ValueError("token, outcome or time missing or of the wrong type")
    return record


def _corrupt_done(damage: Damage) -> CampaignError:
    return CampaignError(f"corrupt state file {damage.path}, line {damage.line}: "
                         f"{damage.reason}")


def _fsync_file(path: str, synced: set[tuple[int, int]]) -> None:
    """Make a file's data durable unless its inode was synced already in this commit."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return  # quarantined since it was published: nothing left here to vouch for
    try:
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) not in synced:
            SYSTEM_DISK.fsync(fd)
            synced.add((info.st_dev, info.st_ino))
    except OSError as error:
        error.filename = path  # fsync names no file: the stop line must say which
        raise
    finally:
        os.close(fd)


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


def _publish_link(source: Path | str, target: str) -> None:
    """Make `target` appear whole (AFL's sync reads any id: name it sees)."""
    try:
        os.link(source, target)
    except OSError:
        directory, name = os.path.split(target)
        temporary = os.path.join(directory, f".{name}.tmp")
        shutil.copyfile(source, temporary)
        os.replace(temporary, target)
