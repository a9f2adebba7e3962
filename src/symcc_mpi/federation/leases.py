"""The fenced work-lease table of one multi-master job (F320 §2.2–2.3, F321 corrections).

One small JSON record per content digest, sharded by the digest's first u32
(`SYMCC_STANDALONE_WORK_LEASE_SHARDS`, default 64). A record is written whole to a temporary
file and `os.replace`d, so a reader sees an old or a new record, never a torn one. Every
read-modify-write happens under its shard's bounded lock-directory lock (`locks.DirectoryLock`,
F320 §2.6): a wait past its deadline raises `LockTimeout` and no lock is broken for its age.

Why not fsynced: the table lives for one job epoch (`OUT/.standalone-work-<epoch>/`, removed
after the final barrier), and the durable "analysed" set is the masters' done journals. A host
crash ends the job, and the resume starts a new epoch with a new, empty table, so a record lost
in a crash costs nothing that a durable write would have saved. `fsync=True` exists for the
benchmark that measures what leaving it out saves (benchmarks/bench_leases.py).

Why shard locks, not one lock per record: a claim of several digests takes each shard's lock
once for all its digests (`claim_many`), and no operation ever holds two locks, so there is no
lock order to get wrong. Updates hold a lock for one record write (~0.1 ms), so a shard shared
by a few masters is not contended.

Layout::

    table.json                  {"schema", "shards"}: fixed by whoever creates the table
    records/<shard>/<key>.json  one record per digest
    locks/<shard>.lock/         a shard's update lock, present only while an update runs
    quarantine/                 corrupt records moved aside, never silently dropped

Fencing (F320 §2.2): every claim writes a token unique to that claim; any later change must
present the exact token of the *current* record, compared under the lock. A stale token (taken
over, completed, abandoned, never existed) changes nothing and the operation returns False.
Expiry is a permission for others to take over, not a revocation: until someone does, the
holder's token stays current. `committing` never expires (F321): stealing it would let the old
holder and the recoverer apply one result twice.

Errors: refusals are return values. `CorruptRecord` (after quarantining the record),
`LockTimeout` (a `TimeoutError`) and `OSError` are raised. A failed write is rolled back under
the lock before the error propagates; if the rollback fails too, the leftover is a conservative
lease that its TTL ends.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from symcc_mpi.durable.atomic import is_temporary, write_durable
from symcc_mpi.durable.clock import SYSTEM_CLOCK, Clock
from symcc_mpi.durable.locks import DirectoryLock
from symcc_mpi.federation.lease_config import DEFAULT_SHARDS
from symcc_mpi.federation.shards import (
    MAX_SHARDS,
    CorruptRecord,
    InvalidRecord,
    check_seconds,
    open_sharded_table,
    unlink_record,
)
from symcc_mpi.federation.work_leases import (
    DIGEST,
    WORK_PAYLOAD_SCHEMA,
    WORK_SCHEMA,
    Origin,
    WorkLease,
    WorkPayload,
    check_digest,
    decode_lease,
    encode_lease,
)

log = logging.getLogger(__name__)

TABLE_SCHEMA = "symcc-work-lease-table-v1"
_MAX_NAME = 200
@dataclass(frozen=True)
class TableStatistics:
    """Counters of one table object (this process's view of what it did)."""

    claims: int = 0
    refused: int = 0  # claims refused: held, committing or done
    taken_over: int = 0  # claims that replaced an expired lease
    heartbeats: int = 0
    stale: int = 0  # operations refused for a token that is not the current one
    commits_begun: int = 0
    completed: int = 0
    abandoned: int = 0
    adopted: int = 0  # a dead predecessor's leases a successor took (adopt)
    writes: int = 0
    write_failures: int = 0
    rollback_failures: int = 0
    quarantined: int = 0
    lock_waits: int = 0
    lock_wait_seconds: float = 0.0
    dead_locks_cleared: int = 0
    corrupt_paths: tuple[str, ...] = ()  # the last 16 quarantined


def _new_token(owner: str) -> str:
    # owner:pid:time_ns plus randomness: unique even if two claims read the same clock.
    return f"{owner}:{os.getpid()}:{SYSTEM_CLOCK.time_ns()}:{secrets.token_hex(8)}"


Writer = Callable[[Path, bytes], None]
Remover = Callable[[Path], None]

_DELETE = object()


# --- the table ----------------------------------------------------------------------------------


class FencedWorkLeaseTable:
    """F320 §2.2–2.3: one record per digest, leased → committing → done, fenced by tokens.

    `owner` names this master (F320: job epoch + master rank). `writer(path, bytes)` and
    `remover(path)` default to the atomic operations; tests inject faults through them. One
    object per thread: the locks exclude other objects and processes, not concurrent calls on
    one object's counters.
    """

    def __init__(
        self,
        root: Path,
        owner: str,
        *,
        ttl: float,
        lock_timeout: float,
        shards: int = DEFAULT_SHARDS,
        clock: Clock = SYSTEM_CLOCK,
        sleep: Callable[[float], object] = SYSTEM_CLOCK.sleep,
        writer: Writer | None = None,
        remover: Remover | None = None,
        fsync: bool = False,
    ):
        if not isinstance(owner, str) or not owner or len(owner) > _MAX_NAME:
            raise ValueError(f"owner must be a non-empty string of at most {_MAX_NAME} characters")
        if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
            raise ValueError(f"shards must be an integer in 1..{MAX_SHARDS} (got {shards!r})")
        if not (isinstance(lock_timeout, (int, float)) and lock_timeout >= 0):
            raise ValueError(f"lock_timeout must be a number >= 0 (got {lock_timeout!r})")
        self.owner = owner
        self.ttl = check_seconds("ttl", ttl)
        self.lock_timeout = float(lock_timeout)
        self.clock = clock
        self._sleep = sleep
        self._fsync = fsync
        self._write = writer or functools.partial(write_durable, fsync=fsync)
        self._remove = remover or functools.partial(unlink_record, fsync=fsync)
        self._counts: dict[str, Any] = {}
        self._corrupt: list[str] = []
        self._seen_done: set[str] = set()  # done is final: recovery scans skip these
        self.root = Path(root)
        self.shards = self._open(shards)
        digits = len(f"{self.shards - 1:x}")
        names = [f"{shard:0{digits}x}" for shard in range(self.shards)]
        self._record_dirs = [self.root / "records" / name for name in names]
        self._lock_paths = [self.root / "locks" / f"{name}.lock" for name in names]

    # -- operations

    def claim(self, digest: str, *, origin: Origin = "generated") -> WorkLease | None:
        """Lease `digest` to this owner with a fresh token, or None if it is held, committing or
        done (a done record refuses every later claim). An expired `leased` record is taken
        over (`steals` + 1)."""
        return self.claim_many([digest], origin=origin).get(digest)

    def claim_many(self, digests: Iterable[str], *,
                   origin: Origin = "generated") -> dict[str, WorkLease]:
        """`claim` for each digest, taking each shard's lock once: {digest: lease} of those won.

        A corrupt record met on the way is quarantined and then claimed as absent; the
        quarantine is counted (`statistics().quarantined`) and logged, not raised.
        """
        if origin not in ("initial", "generated"):
            raise ValueError(f"origin must be 'initial' or 'generated' (got {origin!r})")
        wanted = list(dict.fromkeys(check_digest(d) for d in digests))
        return self._claim_grouped(wanted, origin, takeover_only=False)

    def recover_expired(self, *, limit: int | None = None) -> list[WorkLease]:
        """F320 §2.3 recovery scan: take over expired `leased` records (never `committing`)
        of other holders, at most `limit` of them.

        Racing recoverers are serialised by the shard lock, so exactly one new token wins per
        record. Records once seen done are not read again (done is final). Corrupt records
        are quarantined and logged, not raised.
        """
        now = self.clock.time()
        expired: list[str] = []
        for digest in self._digests():
            if limit is not None and len(expired) >= limit:
                break
            if digest in self._seen_done:
                continue
            try:
                seen = self._peek(digest)
            except CorruptRecord:
                continue
            if seen is not None and seen.status == "done":
                self._seen_done.add(digest)
            elif seen is not None and seen.expired(now) and seen.owner != self.owner:
                # Its own leases its holder knows in memory, in flight or about to be: taking
                # one over would dispatch the input a second time.
                expired.append(digest)
        won = self._claim_grouped(expired, None, takeover_only=True)
        return [won[d] for d in expired if d in won]

    def adopt(self, done: Callable[[str], bool]) -> list[WorkLease]:
        """A successor's takeover of its dead predecessor's records: those of this table's
        owner name, which is one master index of one job epoch (job/federated.py). ULFM
        confirmed the predecessor's death, so no token of its can be presented any more,
        and the successor took over its journal: a record of an input the journal holds as
        `done` is completed; any other is leased anew to the successor, whatever its status,
        for the input to be analysed again. (A `committing` record's commit never reached
        the journal; nor may a `done` one's: a commit completes its lease before the group
        commit that makes its done line durable.) Returns the leases taken, in the table's
        order."""
        adopted = []
        for digest in self._digests():
            try:
                seen = self._peek(digest)
            except CorruptRecord:
                continue
            if seen is None or seen.owner != self.owner:
                continue
            def decide(old: WorkLease | None, now: float, finished: bool = done(digest)):
                if old is None or old.owner != self.owner:
                    return None, None  # a claim or takeover of another master's since
                if finished:
                    if old.status == "done":
                        return None, None
                    return None, msgspec.structs.replace(old, status="done", updated=now)
                self._add("adopted")
                record = msgspec.structs.replace(
                    old, status="leased", token=_new_token(self.owner), updated=now,
                    expires=now + self.ttl, attempts=old.attempts + 1)
                return record, record

            lease = self._mutate(digest, decide)
            if lease is not None:
                adopted.append(lease)
        return adopted

    def heartbeat(self, digest: str, token: str) -> bool:
        """Extend the lease of the exact current `leased` token; False if stale or committing
        (a committing record never expires, so there is nothing to extend)."""
        def decide(old: WorkLease | None, now: float):
            if not self._current(old, token) or old.status != "leased":
                return False, None
            self._add("heartbeats")
            return True, msgspec.structs.replace(old, updated=now, expires=now + self.ttl)
        return self._mutate(digest, decide)

    def begin_commit(self, digest: str, token: str) -> bool:
        """leased → committing for the exact current token: from now on no TTL takeover (F321).

        True also if already committing under `token` (safe to repeat); False otherwise.
        """
        def decide(old: WorkLease | None, now: float):
            if not self._current(old, token) or old.status == "done":
                return False, None
            if old.status == "committing":
                return True, None
            self._add("commits_begun")
            return True, msgspec.structs.replace(old, status="committing", updated=now)
        return self._mutate(digest, decide)

    def complete(self, digest: str, token: str) -> bool:
        """committing → done for the exact current token; True also if already done by it."""
        def decide(old: WorkLease | None, now: float):
            if not self._current(old, token) or old.status == "leased":
                return False, None
            if old.status == "done":
                return True, None
            self._add("completed")
            return True, msgspec.structs.replace(old, status="done", updated=now)
        return self._mutate(digest, decide)

    def abandon(self, digest: str, token: str) -> bool:
        """Give up a pre-commit lease (F320 §2.3: the corpus file is missing): the record is
        deleted, so no one heartbeats it and a later claim starts afresh. False for a stale
        token or a record already committing or done."""
        def decide(old: WorkLease | None, now: float):
            if not self._current(old, token) or old.status != "leased":
                return False, None
            self._add("abandoned")
            return True, _DELETE
        return self._mutate(digest, decide)

    def read(self, digest: str) -> WorkLease | None:
        """The current record (no lock needed: records are replaced whole)."""
        return self._peek(check_digest(digest))

    def path(self, digest: str) -> Path:
        return self._record_dirs[self._shard(check_digest(digest))] / f"{digest}.json"

    def statistics(self) -> TableStatistics:
        return TableStatistics(**self._counts, corrupt_paths=tuple(self._corrupt))

    # -- opening

    def _open(self, shards: int) -> int:
        found, cleared = open_sharded_table(self.root, TABLE_SCHEMA, shards, fsync=self._fsync)
        self._add("dead_locks_cleared", cleared)
        return found

    # -- machinery

    def _add(self, name: str, amount: float = 1) -> None:
        self._counts[name] = self._counts.get(name, 0) + amount

    def _shard(self, digest: str) -> int:
        return int(digest[:8], 16) % self.shards

    @contextlib.contextmanager
    def _locked(self, shard: int) -> Iterator[None]:
        lock = DirectoryLock(self._lock_paths[shard], timeout=self.lock_timeout,
                             clock=self.clock, sleep=self._sleep, label=self.owner)
        with lock:
            if lock.waited > 0:
                self._add("lock_waits")
                self._add("lock_wait_seconds", lock.waited)
            if lock.cleared:
                self._add("dead_locks_cleared", lock.cleared)
            yield

    def _load(self, digest: str) -> tuple[WorkLease | None, bytes | None]:
        """Under the shard's lock: (record, raw bytes), or (None, None) when absent."""
        path = self.path(digest)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None, None
        try:
            return decode_lease(digest, raw), raw
        except InvalidRecord as invalid:
            raise self._quarantine(path, str(invalid)) from None

    def _peek(self, digest: str) -> WorkLease | None:
        """Without the lock (replace is atomic); a corrupt record is re-read under the lock
        (a writer may have been mid-way) and quarantined if still corrupt."""
        try:
            raw = self.path(digest).read_bytes()
        except FileNotFoundError:
            return None
        try:
            return decode_lease(digest, raw)
        except InvalidRecord:
            with self._locked(self._shard(digest)):
                return self._load(digest)[0]

    def _quarantine(self, path: Path, reason: str) -> CorruptRecord:
        destination: Path | None = (self.root / "quarantine"
                                    / f"{path.parent.name}-{path.name}.{SYSTEM_CLOCK.time_ns()}")
        try:
            os.rename(path, destination)
        except OSError:
            destination = None
        self._add("quarantined")
        self._corrupt = (self._corrupt + [str(path)])[-16:]
        error = CorruptRecord(path, reason, destination)
        log.warning("%s", error)
        return error

    def _digests(self) -> Iterator[str]:
        """Every digest with a record, shard by shard; sweeps dead writers' temporaries."""
        for shard, directory in enumerate(self._record_dirs):
            names = os.listdir(directory)
            debris = [n for n in names if is_temporary(Path(n))]
            if debris:
                self._sweep_temporaries(shard, directory, debris)
            for name in names:
                if name.endswith(".json") and DIGEST.fullmatch(name[: -len(".json")]):
                    yield name[: -len(".json")]

    def _sweep_temporaries(self, shard: int, directory: Path, names: list[str]) -> None:
        # A writer holds its shard's lock while its temporary exists; one seen while we hold
        # that lock belongs to a writer that died.
        try:
            with self._locked(shard):
                for name in names:
                    (directory / name).unlink(missing_ok=True)
        except (TimeoutError, OSError):
            pass  # junk stays until a later scan; it is never read as a record

    def _current(self, old: WorkLease | None, token: str) -> bool:
        if old is not None and old.token == token:
            return True
        self._add("stale")
        return False

    def _claim_grouped(self, digests: list[str], origin: Origin | None, *,
                       takeover_only: bool) -> dict[str, WorkLease]:
        by_shard: dict[int, list[str]] = {}
        for digest in digests:
            by_shard.setdefault(self._shard(digest), []).append(digest)
        won: dict[str, WorkLease] = {}
        for shard in sorted(by_shard):
            with self._locked(shard):
                now = self.clock.time()
                for digest in by_shard[shard]:
                    record = self._claim_locked(digest, origin, now, takeover_only)
                    if record is not None:
                        won[digest] = record
        return won

    def _claim_locked(self, digest: str, origin: Origin | None, now: float,
                      takeover_only: bool) -> WorkLease | None:
        try:
            old, raw = self._load(digest)
        except CorruptRecord as corrupt:
            if corrupt.quarantined is None:
                return None  # still in place: fail closed for this digest
            old, raw = None, None
        if old is None:
            if takeover_only:
                return None
            attempts, steals = 1, 0
            payload = WorkPayload(WORK_PAYLOAD_SCHEMA, digest, origin or "generated")
        elif old.expired(now):
            attempts, steals, payload = old.attempts + 1, old.steals + 1, old.payload
        else:
            if old.status == "done":
                self._seen_done.add(digest)
            self._add("refused")
            return None
        record = WorkLease(WORK_SCHEMA, digest, "leased", self.owner, _new_token(self.owner),
                           now, now + self.ttl, attempts, steals, payload)
        self._put(digest, encode_lease(record), raw)
        self._add("claims")
        self._add("taken_over", int(old is not None))
        return record

    def _mutate(self, digest: str, decide: Callable[[WorkLease | None, float], tuple]) -> Any:
        check_digest(digest)
        with self._locked(self._shard(digest)):
            old, raw = self._load(digest)
            result, new = decide(old, self.clock.time())
            if new is _DELETE:
                self._drop(digest, raw)
            elif new is not None:
                self._put(digest, encode_lease(new), raw)
            return result

    def _put(self, digest: str, data: bytes, previous: bytes | None) -> None:
        """Write a record; on failure restore `previous` (None: absent), then re-raise."""
        self._add("writes")
        try:
            self._write(self.path(digest), data)
        except OSError:
            self._add("write_failures")
            self._restore(digest, previous)
            raise

    def _drop(self, digest: str, previous: bytes) -> None:
        """Delete a record; on failure put `previous` back if it is gone, then re-raise."""
        self._add("writes")
        try:
            self._remove(self.path(digest))
        except OSError:
            self._add("write_failures")
            if not self.path(digest).exists():
                self._restore(digest, previous)
            raise

    def _restore(self, digest: str, previous: bytes | None) -> None:
        """Best effort, under the lock: make the record `previous` again (None: absent)."""
        try:
            if previous is None:
                self._remove(self.path(digest))
            else:
                self._write(self.path(digest), previous)
        except OSError:
            self._add("rollback_failures")
            log.warning("could not roll back lease record %s; it stays until its TTL ends",
                        self.path(digest))

    def __repr__(self) -> str:
        return f"FencedWorkLeaseTable({str(self.root)!r}, owner={self.owner!r})"
