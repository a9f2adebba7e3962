"""The campaign directory: content-addressed corpus, staging, AFL-style queues, done journal.

Layout (DESIGN §4):
    OUT/.symcc-mpi          marker: this directory holds a symcc-mpi campaign
    OUT/corpus/<sha256>     every input the campaign keeps, named by the SHA-256 of its bytes
    OUT/.staging/<token>/   one private directory per dispatch, written by the worker,
                            verified file by file and promoted only by the master
    OUT/queue/ crashes/ hangs/   AFL-style names (id:NNNNNN,...), hard links where possible
    OUT/state/done.jsonl    one fsynced line per analysed input: the resume point
"""

from __future__ import annotations

import enum
import errno
import fcntl
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from .durable.atomic import fsync_directory
from .frontier import Frontier
from .protocol import SHA256_PATTERN, TOKEN_PATTERN
from .report import afl_queue_name, parse_afl_queue_id

MARKER = ".symcc-mpi"
STOP_REQUEST = ".stop-request"
# The run id the launcher gives a job (and writes into the stop requests it makes for it).
RUN_ID_ENV = "SYMCC_MPI_RUN_ID"
LAYOUT_VERSION = 1


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


def write_atomic(path: Path, data: bytes, *, fsync: bool = False) -> None:
    """Write through a temporary file in the same directory, then rename over `path`."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        if fsync:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(temporary, path)


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


class CampaignDir:
    """The master's view of OUT. Only the master (rank 0) mutates it; workers stage."""

    def __init__(self, out: Path, inputs: Frontier | None = None):
        self.out = out
        # Per-input state lives in the master's compact frontier (AFL queue ids here).
        self.inputs = inputs if inputs is not None else Frontier()
        self.corpus = out / "corpus"
        self.staging = out / ".staging"
        self.queue = out / "queue"
        self.crashes = out / "crashes"
        self.hangs = out / "hangs"
        self.state = out / "state"
        self.quarantine = out / "quarantine"
        self._corpus, self._staging, self._queue = map(str, (self.corpus, self.staging,
                                                             self.queue))
        self.done_journal = self.state / "done.jsonl"
        self._lock_handle = None
        self._done_handle = None
        self._done_unsynced = False
        self._published_in: set[Path] = set()  # directories written since the last sync
        self.crash_hashes: set[str] = set()
        self.hang_hashes: set[str] = set()
        self._next_ids = {"queue": 0, "crashes": 0, "hangs": 0}

    # -- opening -----------------------------------------------------------------------

    def create(self, config_json: dict) -> None:
        for directory in (self.corpus, self.staging, self.queue, self.crashes, self.hangs,
                          self.state):
            directory.mkdir(parents=True, exist_ok=True)
        marker = {"layout": LAYOUT_VERSION, "created": time.time(), "config": config_json}
        write_atomic(self.out / MARKER, json.dumps(marker, indent=1).encode(), fsync=True)

    def lock(self) -> None:
        """One master per campaign directory, machine-wide (flock on a state file)."""
        self.state.mkdir(parents=True, exist_ok=True)
        handle = open(self.state / "master.lock", "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
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
        # Closed even when the last sync fails (a full disk): a handle left open would try
        # its flush again at exit and print the error a second time.
        try:
            if self._done_handle is not None:
                try:
                    self.sync_done()
                finally:
                    handle, self._done_handle = self._done_handle, None
                    handle.close()
        finally:
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
        """Replay the done journal; a torn last line (killed mid-append) is not a record."""
        if not self.done_journal.exists():
            return []
        raw = self.done_journal.read_bytes()
        lines = raw.split(b"\n")
        records = []
        for number, line in enumerate(lines, start=1):
            if not line:
                continue
            is_last = number == len(lines)  # no newline after it: the append never finished
            try:
                record = json.loads(line)
                if not SHA256_PATTERN.match(record["sha256"]):
                    raise ValueError("bad sha256")
            except (ValueError, KeyError, TypeError):
                if is_last:
                    self._truncate_torn_tail(len(raw) - len(line))
                    break
                raise CampaignError(
                    f"corrupt state file {self.done_journal}, line {number}: not a done record"
                ) from None
            records.append(record)
        return records

    def _truncate_torn_tail(self, keep: int) -> None:
        torn = self.done_journal.read_bytes()[keep:]
        self.quarantine.mkdir(exist_ok=True)
        (self.quarantine / f"done.jsonl.torn-{int(time.time())}").write_bytes(torn)
        with open(self.done_journal, "r+b") as handle:
            handle.truncate(keep)

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
            write_atomic(path, data)
        if self.inputs.queue_id(digest) is None:
            self._add_to_queue(digest, orig=name)
        return digest

    def staging_dir(self, token: str) -> Path:
        return Path(self._staging_dir(token))

    def _staging_dir(self, token: str) -> str:
        # Strings, not Paths, on the master's per-result path: a Path join costs ~25 µs.
        if not TOKEN_PATTERN.match(token):
            raise ValueError(f"bad token {token!r}")
        return os.path.join(self._staging, token)

    def staged_path(self, token: str, digest: str) -> str:
        return os.path.join(self._staging_dir(token), digest)

    def verify_staged(self, token: str, manifest: list[tuple[str, int]]) -> str | None:
        """Check every announced file is there, named by the SHA-256 of its bytes.

        Returns the reason of the first mismatch, or None when the whole manifest holds.
        """
        directory = self._staging_dir(token)
        for digest, size in manifest:
            path = os.path.join(directory, digest)
            try:
                if os.stat(path).st_size != size:
                    return f"staged {digest[:12]}: size differs from manifest"
                if sha256_file(path) != digest:
                    return f"staged {digest[:12]}: bytes do not match their SHA-256"
            except OSError as error:
                return f"staged {digest[:12]}: {error.strerror}"
        return None

    def promote(self, token: str, digest: str) -> bool:
        """Move one verified staged file into corpus/; False if it was already there."""
        target = os.path.join(self._corpus, digest)
        if os.path.exists(target):
            return False
        os.rename(self.staged_path(token, digest), target)
        self._published_in.add(self.corpus)
        return True

    def add_to_queue(self, digest: str, parent: str) -> None:
        self._add_to_queue(digest, sources=self._source_ids(parent))

    def _add_to_queue(self, digest: str, *, sources: tuple[int, ...] = (),
                      orig: str | None = None) -> None:
        entry_id = self._take_id("queue")
        name = afl_queue_name(entry_id, sources, orig=orig)
        _publish_link(os.path.join(self._corpus, digest), os.path.join(self._queue, name))
        self._published_in.add(self.queue)
        self.inputs.set_queue_id(digest, entry_id)

    def save_finding(self, kind: str, source: Path, digest: str, parent: str | None,
                     signal: int | None = None) -> bool:
        """Record a crashing or hanging input once; False if it is known already."""
        known = self.crash_hashes if kind == "crashes" else self.hang_hashes
        if digest in known:
            return False
        name = afl_queue_name(self._take_id(kind), self._source_ids(parent), sig=signal)
        directory = self.crashes if kind == "crashes" else self.hangs
        _publish_link(source, os.path.join(directory, name))
        self._published_in.add(directory)
        known.add(digest)
        return True

    def _source_ids(self, parent: str | None) -> tuple[int, ...]:
        source = self.inputs.queue_id(parent) if parent else None
        return () if source is None else (source,)

    def record_done(self, digest: str, token: str, outcome: str) -> None:
        """The input is analysed and its results are published; durable at `sync_done`."""
        if self._done_handle is None:
            self._done_handle = open(self.done_journal, "ab")
        line = json.dumps({"sha256": digest, "token": token, "outcome": outcome,
                           "time": round(time.time(), 3)})
        self._done_handle.write(line.encode() + b"\n")
        self._done_unsynced = True

    def sync_done(self) -> None:
        """Group commit (paced by checkpoint.py): one fsync for every record since the last
        one. A crash before it loses those records, never their children: those inputs are
        analysed again. The directories the children went to are made durable first."""
        if self._done_unsynced:
            for directory in self._published_in:
                fsync_directory(directory)
            self._published_in.clear()
            self._done_handle.flush()
            os.fsync(self._done_handle.fileno())
            self._done_unsynced = False

    def discard_staging(self, token: str) -> None:
        shutil.rmtree(self._staging_dir(token), ignore_errors=True)

    def leftover_staging(self) -> list[Path]:
        return sorted(self.staging.iterdir()) if self.staging.exists() else []

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
    def queue_entries(self) -> int:
        """queue/ ids run from 0 to this, dense (AFL's sync needs them so)."""
        return self._next_ids["queue"]

    def _take_id(self, kind: str) -> int:
        entry_id = self._next_ids[kind]
        self._next_ids[kind] = entry_id + 1
        return entry_id


def _publish_link(source: Path | str, target: str) -> None:
    """Make `target` appear whole (AFL's sync reads any id: name it sees)."""
    try:
        os.link(source, target)
    except OSError:
        directory, name = os.path.split(target)
        temporary = os.path.join(directory, f".{name}.tmp")
        shutil.copyfile(source, temporary)
        os.replace(temporary, target)
