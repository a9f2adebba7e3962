"""The fenced target-group lease table that several masters share (F311 §3–5, §8–9).

A branch target is a shared resource independent of the seed and the work payload (F311 §1):
two masters solving target 88 from different seeds meet on target 88's one record and one
update lock. A claim covers a whole target group and is all-or-nothing for
cooperating masters: every member's lock is taken, every member is read, and only if none is
held by an unexpired lease is every member written, under one token (F311 §4).

Guarantees, given atomic `mkdir`/`rename` of a directory and atomic same-directory `replace`:
- A claim that returns a token wrote every member; one that returns None wrote nothing; one
  that raises has restored the members it had written (best effort, still under the locks).
  A process killed between two member writes leaves a conservative partial group that no
  caller was told it holds; its TTL ends it (F311 §4: not a cross-file transaction).
- No two unexpired records of different tokens for one target: a target has one record path,
  and every read-decide-write of it runs under its lock.
- Heartbeat and release change only records whose current token is exactly theirs, so a stale
  holder never extends or deletes a newer owner's record (F311 §5: compare-and-match, not a
  monotonic fencing number). Records are deleted on release, never marked done (F311 §7.4).
- No lock is held when a call returns; a lock wait past `lock_timeout` raises `LockTimeout`
  and no lock is ever broken for its age (locks.py; F311 §9, F321).

Why one lock per target, not per shard: a group holds its locks across up to 64 fsynced writes
(70-400 ms for 64 members on the project's machines); per-shard locks would make that group
stall the unrelated claims of every master whose targets share one of its shards (with 64
shards, nearly all of them). Per-target locks are taken in `target_id` order, as F311 §4 step 2
says, so overlapping groups never deadlock. Shards only fan the record files out over
directories (F311 §3).

Why fsynced by default, unlike leases.py's per-epoch table: F311 §4 publishes each record by
temp file, fsync and replace; `fsync=False` is for benchmarks and tests.

Layout::

    table.json                        {"schema", "shards"}: fixed by whoever creates the table
    records/<shard>/<target_id>.json  one record per leased target
    locks/<target_id>.lock/           a target's update lock, present only while an update runs
    quarantine/                       corrupt records moved aside, never silently dropped

Errors: bad arguments raise `ValueError` before any lock is taken; refusals are return
values; `LockTimeout` (a `TimeoutError`), `OSError` and
`TableMismatch` are raised. A corrupt record is quarantined, logged, counted and then read as
absent; if it cannot even be moved aside, the claim of its group is refused (fail closed).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import math
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from symcc_mpi.durable.atomic import TEMPORARY_PREFIX, write_durable
from symcc_mpi.durable.clock import SYSTEM_CLOCK, Clock
from symcc_mpi.durable.locks import DirectoryLock
from symcc_mpi.federation.lease_config import default_lock_acquire_timeout
from symcc_mpi.federation.master_leases import LONGEST_HEARTBEAT_INTERVAL
from symcc_mpi.federation.shards import (
    MAX_SHARDS,
    CorruptRecord,
    InvalidRecord,
    check_seconds,
    decode_record,
    open_sharded_table,
    shard_directories,
    unlink_record,
)
from symcc_mpi.scheduling.splitting import MAX_GROUP

log = logging.getLogger(__name__)

TABLE_SCHEMA = "symcc-target-lease-table-v1"
TARGET_SCHEMA = "symcc-target-lease-v1"
DEFAULT_SHARDS = 64

_MAX_NAME = 200
_TARGET_ID = re.compile(r"[0-9a-f]{64}")


# --- pure functions -----------------------------------------------------------------------------


def target_id(target: int) -> str:
    """F311 §3: hex `SHA-256("target:" || decimal(target))`, the target's name on disk."""
    return hashlib.sha256(b"target:" + str(_check_target(target)).encode()).hexdigest()


def heartbeat_interval(work_ttl: float, target_ttl: float) -> float:
    """F311 §9: a third of the smaller TTL, at most 30 s, so that a master ticking that often
    extends every lease at least twice before either kind can expire."""
    smaller = min(check_seconds("work_ttl", work_ttl), check_seconds("target_ttl", target_ttl))
    return min(smaller / 3.0, LONGEST_HEARTBEAT_INTERVAL)


def _check_target(target: int) -> int:
    if isinstance(target, bool) or not isinstance(target, int):
        raise ValueError(f"a target is an integer (got {target!r})")
    return target


def _normalize(targets: Iterable[int]) -> tuple[int, ...]:
    positive = (target for target in map(_check_target, targets) if target > 0)
    return tuple(dict.fromkeys(positive))[:MAX_GROUP]


# --- records ------------------------------------------------------------------------------------


class TargetLease(msgspec.Struct, frozen=True):
    """One target's record (F311 §4 step 4): it exists only while the target is leased."""

    schema: str
    target: int
    token: str  # owner:worker:pid:time_ns, the same in every member of the group
    owner: str
    worker: int
    group: tuple[int, ...]  # every member, in the claimer's order
    payload: dict[str, Any] | None  # opaque to the table
    claimed: float  # wall clock, comparable across hosts
    expires: float  # wall clock; heartbeats move it
    attempts: int  # claims of this target since its record was last deleted
    steals: int  # of those, takeovers of an expired record

    def expired(self, now: float) -> bool:
        return now >= self.expires


Writer = Callable[[Path, bytes], None]

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(TargetLease)
_token_lock = threading.Lock()
_last_token_ns = 0


def _new_token(owner: str, worker: int) -> str:
    # F311 §5's format. time_ns is made strictly increasing within a process, so two claims
    # that read the same clock tick still get different tokens (the pid separates processes).
    global _last_token_ns
    with _token_lock:
        _last_token_ns = max(SYSTEM_CLOCK.time_ns(), _last_token_ns + 1)
        return f"{owner}:{worker}:{os.getpid()}:{_last_token_ns}"


def _decode(name: str, raw: bytes) -> TargetLease:
    record = decode_record(_decoder, raw)
    problem = (
        "wrong schema" if record.schema != TARGET_SCHEMA
        else "target differs from the file name" if record.target <= 0
        or target_id(record.target) != name
        else "target missing from its own group" if record.target not in record.group
        or _normalize(record.group) != record.group
        else "empty token or owner" if not (record.token and record.owner)
        else "negative worker" if record.worker < 0
        else "impossible counters" if not 0 <= record.steals < record.attempts
        else "non-finite time" if not (math.isfinite(record.claimed)
                                       and math.isfinite(record.expires))
        else None
    )
    if problem:
        raise InvalidRecord(problem)
    return record


@dataclass(frozen=True)
class TargetTableStatistics:
    claims: int
    conflicts: int
    steals: int
    releases: int
    heartbeats: int
    write_failures: int
    rollback_failures: int
    quarantined: int
    leased: int | None = None  # records on disk (None: not scanned)
    expired: int | None = None


class FencedTargetLeaseTable:
    """F311 §4–5: the shared target-group table in `directory` (`OUT/.target_lease_table/`).

    `owner` names this master. `write(path, bytes)` publishes a record (default: temp file,
    fsync, replace); tests inject failures through it. `sleep` is how a lock waiter naps
    (tests pass `ManualClock.advance`). One object per thread: the locks exclude other objects
    and processes, not concurrent calls on one object's counters.
    """

    def __init__(
        self,
        directory: Path,
        *,
        owner: str,
        ttl: float,
        shards: int = DEFAULT_SHARDS,
        lock_timeout: float = default_lock_acquire_timeout(),
        clock: Clock = SYSTEM_CLOCK,
        fsync: bool = True,
        sleep: Callable[[float], object] = SYSTEM_CLOCK.sleep,
        write: Writer | None = None,
    ):
        if not isinstance(owner, str) or not owner or len(owner) > _MAX_NAME:
            raise ValueError(f"owner must be a non-empty string of at most {_MAX_NAME} characters")
        if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
            raise ValueError(f"shards must be an integer in 1..{MAX_SHARDS} (got {shards!r})")
        if isinstance(lock_timeout, bool) or not (isinstance(lock_timeout, (int, float))
                                                  and lock_timeout >= 0):
            raise ValueError(f"lock_timeout must be a number >= 0 (got {lock_timeout!r})")
        self.owner = owner
        self.ttl = check_seconds("ttl", ttl)
        self.lock_timeout = float(lock_timeout)
        self.clock = clock
        self._sleep = sleep
        self._fsync = fsync
        self._write = write or functools.partial(write_durable, fsync=fsync)
        self._counts = dict.fromkeys(
            ("claims", "conflicts", "steals", "releases", "heartbeats", "write_failures",
             "rollback_failures", "quarantined"), 0)
        self.root = Path(directory)
        self.shards = self._open(shards)

    # -- operations

    def claim_group(self, targets: Iterable[int], *, worker: int,
                    payload: dict[str, Any] | None = None) -> str | None:
        """F311 §4: lease every member of the group under one new token, or none of them.

        Returns the token, or None when any member holds an unexpired lease (then nothing was
        written). An expired member is taken over (`steals` + 1). If a write fails, the
        members already written are restored under the locks and the `OSError` propagates.
        """
        group = self._group(targets)
        if isinstance(worker, bool) or not isinstance(worker, int) or worker < 0:
            raise ValueError(f"worker must be an integer >= 0 (got {worker!r})")
        if payload is not None and not isinstance(payload, dict):
            raise ValueError(f"payload must be a dict or None (got {type(payload).__name__})")
        try:
            _encoder.encode(payload)
        except (TypeError, msgspec.EncodeError) as error:
            raise ValueError(f"payload is not JSON-encodable: {error}") from None
        token = _new_token(self.owner, worker)
        in_lock_order = sorted(group, key=target_id)
        with self._locked_all(in_lock_order):
            now = self.clock.time()
            previous: dict[int, tuple[TargetLease | None, bytes | None]] = {}
            for target in in_lock_order:
                try:
                    previous[target] = self._load(target)
                except CorruptRecord:  # could not be moved aside: unprovably free, so held
                    self._counts["conflicts"] += 1
                    return None
                old = previous[target][0]
                if old is not None and not old.expired(now):
                    self._counts["conflicts"] += 1
                    return None
            written: list[int] = []
            for target in in_lock_order:
                old = previous[target][0]
                record = TargetLease(
                    TARGET_SCHEMA, target, token, self.owner, worker, group, payload,
                    claimed=now, expires=now + self.ttl,
                    attempts=old.attempts + 1 if old else 1, steals=old.steals + 1 if old else 0)
                written.append(target)  # before the write: a failure may follow the replace
                try:
                    self._write(self.path(target), _encoder.encode(record) + b"\n")
                except OSError:
                    self._counts["write_failures"] += 1
                    for done in reversed(written):
                        self._restore(done, previous[done][1])
                    raise
            self._counts["claims"] += 1
            self._counts["steals"] += sum(previous[t][0] is not None for t in group)
            return token

    def heartbeat(self, token: str, targets: Iterable[int]) -> bool:
        """Extend every member whose current record carries exactly `token` to now + TTL.

        Members are compared and extended one lock at a time: each is its own compare-and-match,
        and the group needs no atomicity to be kept alive.

        False if any member no longer does (taken over, released, quarantined): the caller has
        lost the group. An expired record nobody took over is still the holder's (expiry lets
        others take over; it revokes nothing) and is extended.
        """
        kept = True
        for target in sorted(self._group(targets), key=target_id):
            with self._locked(target):
                old, raw = self._load_as_absent(target)
                if old is None or old.token != token:
                    kept = False
                    continue
                renewed = msgspec.structs.replace(old, expires=self.clock.time() + self.ttl)
                try:
                    self._write(self.path(target), _encoder.encode(renewed) + b"\n")
                except OSError:
                    self._counts["write_failures"] += 1
                    self._restore(target, raw)
                    raise
                self._counts["heartbeats"] += 1
        return kept

    def release(self, token: str, targets: Iterable[int]) -> int:
        """Delete the members' records that carry exactly `token`; how many were deleted.

        A stale token deletes nothing of a newer owner's. Releasing twice deletes nothing the
        second time. A failed delete raises; the record then ends with its TTL (F311 §7.4).
        """
        deleted = 0
        for target in sorted(self._group(targets), key=target_id):
            with self._locked(target):
                old, _ = self._load_as_absent(target)
                if old is None or old.token != token:
                    continue
                try:
                    unlink_record(self.path(target), fsync=self._fsync)
                except OSError:
                    self._counts["write_failures"] += 1
                    raise
                deleted += 1
                self._counts["releases"] += 1
        return deleted

    def release_owner(self, owner: str) -> int:
        """Delete every record `owner` holds, whatever its token: a dead master's, by the
        successor that took its place and its name (its expiry, in wall-clock time, may be
        far off after the clock went back). How many were deleted."""
        held = [(record.token, record.target) for record in self._records_on_disk()
                if record.owner == owner]
        return sum(self.release(token, (target,)) for token, target in held)

    def read(self, target: int) -> TargetLease | None:
        """The current record, read without a lock (records are replaced whole)."""
        path = self.path(target)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return _decode(path.stem, raw)
        except InvalidRecord:
            with self._locked(target):  # a writer may have been mid-way: decide under the lock
                return self._load_as_absent(target)[0]

    def path(self, target: int) -> Path:
        name = target_id(target)
        return self._record_dirs[int(name[:8], 16) % self.shards] / f"{name}.json"

    def statistics(self, *, on_disk: bool = True) -> TargetTableStatistics:
        """This object's counters, and with `on_disk` the leased and expired records on disk
        now.

        The disk scan reads without locks and skips undecodable records (a later operation on
        them quarantines them); it sweeps temporaries of dead writers on the way.
        """
        if not on_disk:
            return TargetTableStatistics(**self._counts)
        now = self.clock.time()
        found = {"leased": 0, "expired": 0}
        for record in self._records_on_disk():
            found["expired" if record.expired(now) else "leased"] += 1
        return TargetTableStatistics(**self._counts, **found)

    def _records_on_disk(self) -> Iterator[TargetLease]:
        """Every record, read without locks; undecodable ones skipped (a later operation on
        them quarantines them), temporaries of dead writers swept on the way."""
        for directory in self._record_dirs:
            for name in os.listdir(directory):
                if name.startswith(TEMPORARY_PREFIX):
                    self._sweep_temporary(directory / name)
                    continue
                try:
                    yield _decode(name.removesuffix(".json"), (directory / name).read_bytes())
                except (FileNotFoundError, InvalidRecord):
                    continue

    # -- opening

    def _open(self, shards: int) -> int:
        found, _ = open_sharded_table(self.root, TABLE_SCHEMA, shards, fsync=self._fsync)
        self._record_dirs = shard_directories(self.root, found)
        return found

    # -- machinery

    def _group(self, targets: Iterable[int]) -> tuple[int, ...]:
        group = _normalize(targets)
        if not group:
            raise ValueError("a target group needs at least one positive target")
        return group

    def _lock(self, target: int) -> DirectoryLock:
        return DirectoryLock(self.root / "locks" / f"{target_id(target)}.lock",
                             timeout=self.lock_timeout, clock=self.clock, sleep=self._sleep,
                             label=self.owner)

    @contextlib.contextmanager
    def _locked(self, target: int) -> Iterator[None]:
        with self._lock(target):
            yield

    @contextlib.contextmanager
    def _locked_all(self, in_lock_order: list[int]) -> Iterator[None]:
        # ExitStack releases in reverse order, also when an acquisition times out half-way.
        with contextlib.ExitStack() as held:
            for target in in_lock_order:
                held.enter_context(self._lock(target))
            yield

    def _load(self, target: int) -> tuple[TargetLease | None, bytes | None]:
        """Under the target's lock: (record, raw bytes), or (None, None) when absent.

        A corrupt record is quarantined and read as absent; `CorruptRecord` is raised only when
        it could not be moved aside (then it stays, and its target is never provably free).
        """
        path = self.path(target)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None, None
        try:
            return _decode(path.stem, raw), raw
        except InvalidRecord as invalid:
            corrupt = self._quarantine(path, str(invalid))
        if corrupt.quarantined is None:
            raise corrupt
        return None, None

    def _load_as_absent(self, target: int) -> tuple[TargetLease | None, bytes | None]:
        """`_load` where a record that could not be moved aside counts as nobody's."""
        try:
            return self._load(target)
        except CorruptRecord:
            return None, None

    def _quarantine(self, path: Path, reason: str) -> CorruptRecord:
        destination: Path | None = (self.root / "quarantine"
                                    / f"{path.parent.name}-{path.name}.{SYSTEM_CLOCK.time_ns()}")
        try:
            os.rename(path, destination)
        except OSError:
            destination = None
        self._counts["quarantined"] += 1
        error = CorruptRecord(path, reason, destination)
        log.warning("%s", error)
        return error

    def _restore(self, target: int, previous: bytes | None) -> None:
        """Best effort, under the lock: make the record `previous` again (None: absent)."""
        path = self.path(target)
        try:
            if previous is None:
                unlink_record(path, fsync=self._fsync)
            else:
                self._write(path, previous)
        except OSError:
            self._counts["rollback_failures"] += 1
            log.warning("could not roll back target lease record %s; it stays until its TTL "
                        "ends", path)

    def _sweep_temporary(self, path: Path) -> None:
        # A writer holds its target's lock while its temporary exists (write_durable names it
        # `.tmp-<target_id>.json.<pid>`); one seen under that lock belongs to a dead writer.
        name = path.name.removeprefix(TEMPORARY_PREFIX).partition(".")[0]
        if not _TARGET_ID.fullmatch(name):
            return  # not a record's temporary: never read as a record, left alone
        lock = DirectoryLock(self.root / "locks" / f"{name}.lock", timeout=0, clock=self.clock,
                             label=self.owner)
        with contextlib.suppress(TimeoutError, OSError), lock:
            path.unlink(missing_ok=True)

    def __repr__(self) -> str:
        return f"FencedTargetLeaseTable({str(self.root)!r}, owner={self.owner!r})"
