"""Durable controller state on SQLite (F443 §5): generations, members, shards, fenced leases.

What it holds (F443 §2, "QueryStore ULFM state"): the communicator generation, its membership
(endpoints in rank order), the shard -> owner assignment, the active leases (each a fence
`(generation, shard, lease)` that the worker echoes), the recovery queue, the recovery plans and
the receipts that advanced the generation. It decides which results may still commit; the work
WAL (`wal.py`) decides which publications must be redone. Neither replaces the other.

The ordinal discipline (F443 §5): every mutation - initialize, dispatch, finish, cancel,
prepare, commit - takes the next `state_ordinal` in the same transaction that applies it, and
records a digest of the request. A call that names an ordinal already used is answered from
that record: the same digest is an idempotent retry (a write whose outcome was unknown, or a
second survivor confirming the first one's recovery plan) and returns the first answer; a
different digest is a fork and is refused. The generation advances by one, and only by a commit
whose receipt matches the pending plan exactly (plan digest, next generation, the survivors).

SQLite runs in WAL journal mode with `synchronous=FULL`: a committed transaction survives a
crash of the process or of the machine, and a process killed mid-transaction leaves the last
committed state (SQLite discards WAL frames after the last valid commit frame). Each mutation is
one `BEGIN IMMEDIATE` transaction, so several processes (ULFM survivors) can share the file;
`batch()` puts several in one transaction, one fsync for all.

A damaged database file (SQLite reports it corrupt or not a database, `quick_check` fails, or
the stored state breaks its own invariants) is moved aside with its -wal and -shm files and
reported as a one-line `QueryStoreCorrupt` naming both paths; it is never deleted.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .atomic import fsync_directory
from .clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
MAX_NAME = 256
# Hot-path ordinals (dispatch, finish, cancel) older than this are forgotten; init, prepare and
# commit are kept for ever. A retry comes within moments of its first attempt.
DEFAULT_HISTORY = 65536
_CORRUPT_CODES = {"SQLITE_CORRUPT", "SQLITE_NOTADB"}

FaultHook = Callable[[str], None]
"""Called with the mutation kind just before it is committed; raising aborts the mutation."""


class Mutation(enum.Enum):
    INIT = "init"
    DISPATCH = "dispatch"
    FINISH = "finish"
    CANCEL = "cancel"
    PREPARE = "prepare"
    COMMIT = "commit"



class QueryStoreError(Exception):
    """Base of the QueryStore errors."""


class QueryStoreCorrupt(QueryStoreError):
    """The database file is damaged; it was moved aside (the message says where)."""


class NotInitialized(QueryStoreError):
    """No generation-0 snapshot has been written yet."""


class Refused(QueryStoreError):
    """The mutation does not apply to the current state; nothing was written."""


class ForkRefused(Refused):
    """The named ordinal already holds a different mutation (F443 §5: a state fork)."""


class OrdinalOutOfOrder(Refused):
    """The named ordinal skips ahead, or is older than the kept history."""


class StaleFence(Refused):
    """The fence is from another generation or names no active lease (F443 §3 step 5)."""


class RecoveryPending(Refused):
    """A recovery plan is pending: leases are frozen until its commit (F443 §4 step 4)."""


class ReceiptMismatch(Refused):
    """The commit's receipt does not match the pending plan exactly."""


@dataclass(frozen=True)
class Fence:
    generation: int
    shard: int
    lease: int  # the ordinal of the dispatch that created the lease: unique, never reused


@dataclass(frozen=True)
class Lease:
    lease: int
    work_id: str
    shard: int
    worker: str
    generation: int
    at: float

    @property
    def fence(self) -> Fence:
        return Fence(self.generation, self.shard, self.lease)


@dataclass(frozen=True)
class QueuedWork:
    work_id: str
    shard: int  # the original shard, taken again by its next dispatch (F443 §6 item 6)
    from_lease: int
    from_generation: int


@dataclass(frozen=True)
class RecoveryPlan:
    generation: int  # the generation being left
    members: tuple[str, ...]
    failed: tuple[str, ...]
    survivors: tuple[str, ...]  # old rank order
    leases: tuple[Lease, ...]  # every lease in flight, healthy workers' too (F443 §4 step 4)
    digest: str

    @classmethod
    def build(cls, generation: int, members: Sequence[str], failed: Iterable[str],
              leases: Sequence[Lease]) -> RecoveryPlan:
        failed_set = set(failed)
        body = {"generation": generation, "members": list(members),
                "failed": sorted(failed_set),
                "survivors": [m for m in members if m not in failed_set],
                "leases": [asdict(lease) for lease in leases]}
        return cls.from_body(body, _digest(body))

    @classmethod
    def from_body(cls, body: dict[str, Any], digest: str) -> RecoveryPlan:
        return cls(body["generation"], tuple(body["members"]), tuple(body["failed"]),
                   tuple(body["survivors"]), tuple(Lease(**item) for item in body["leases"]),
                   digest)

    def body(self) -> dict[str, Any]:
        return {"generation": self.generation, "members": list(self.members),
                "failed": list(self.failed), "survivors": list(self.survivors),
                "leases": [asdict(lease) for lease in self.leases]}


@dataclass(frozen=True)
class Receipt:
    generation: int  # the generation entered
    ordinal: int
    plan_digest: str
    members: tuple[str, ...]  # new rank order: rank 0 is the new master
    shards: tuple[str, ...]  # owner of each shard in the new generation
    post_state_sha256: str  # the snapshot digest right after the commit

    def body(self) -> dict[str, Any]:
        return {**asdict(self), "members": list(self.members), "shards": list(self.shards)}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Receipt:
        return cls(body["generation"], body["ordinal"], body["plan_digest"],
                   tuple(body["members"]), tuple(body["shards"]), body["post_state_sha256"])


@dataclass(frozen=True)
class Snapshot:
    generation: int
    state_ordinal: int
    n_shards: int
    members: tuple[str, ...]
    shards: tuple[str, ...]
    leases: tuple[Lease, ...]
    recovery_queue: tuple[QueuedWork, ...]
    pending_plan: str | None = None

    def digest(self) -> str:
        return _digest(asdict(self))


@dataclass(frozen=True)
class QueryStoreStatistics:
    generation: int
    state_ordinal: int
    active_leases: int
    recovery_queue: int
    receipts: int
    mutations: int
    idempotent_retries: int
    forks_refused: int
    stale_refused: int
    refused: int


@dataclass
class _Step:
    ordinal: int
    digest: str
    repeated: bool
    result: Any = field(default=None)


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def _digest(value: Any) -> str:
    return hashlib.sha256(_canonical(value)).hexdigest()


def _score(label: bytes, key: str, member: str) -> int:
    text = label + b"\0" + key.encode() + b"\0" + member.encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:16], "big")


def shard_owner(shard: int, members: Sequence[str]) -> str:
    """Rendezvous (HRW) owner of a shard: only a departed owner's shards move (F443 §4 step 6)."""
    return max(members, key=lambda m: (_score(b"symcc-shard-owner-v1", str(shard), m), m))


def preferred_shard(work_id: str, n_shards: int) -> int:
    digest = hashlib.sha256(b"symcc-work-shard-v1\0" + work_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % n_shards


def _check_name(kind: str, value: str) -> None:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME:
        raise ValueError(f"{kind} must be a non-empty string of at most {MAX_NAME} characters")


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS members (rank INTEGER PRIMARY KEY, endpoint TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS shards (shard INTEGER PRIMARY KEY, owner TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS leases (
    lease INTEGER PRIMARY KEY, work_id TEXT NOT NULL UNIQUE, shard INTEGER NOT NULL,
    worker TEXT NOT NULL, generation INTEGER NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS recovery_queue (
    work_id TEXT PRIMARY KEY, shard INTEGER NOT NULL, from_lease INTEGER NOT NULL,
    from_generation INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS ordinals (
    ordinal INTEGER PRIMARY KEY, kind TEXT NOT NULL, digest TEXT NOT NULL,
    result TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS plans (
    generation INTEGER PRIMARY KEY, ordinal INTEGER NOT NULL, digest TEXT NOT NULL,
    body TEXT NOT NULL, committed INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS receipts (
    generation INTEGER PRIMARY KEY, ordinal INTEGER NOT NULL, body TEXT NOT NULL);
"""


class QueryStore:
    """One QueryStore file; open it with `QueryStore(path)` (creates it if absent)."""

    def __init__(self, path: Path, *, clock: Clock = SYSTEM_CLOCK, busy_timeout: float = 30.0,
                 history: int = DEFAULT_HISTORY, fault: FaultHook | None = None,
                 quarantine_dir: Path | None = None):
        if history < 1:
            raise ValueError("history must be at least 1")
        self.path = Path(path)
        self.quarantine_dir = quarantine_dir or self.path.parent / "quarantine"
        self._clock = clock
        self._history = history
        self.fault = fault
        self._depth = 0
        self._counts = dict.fromkeys(("mutations", "idempotent_retries", "forks_refused",
                                      "stale_refused", "refused"), 0)
        created = not self.path.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn: sqlite3.Connection | None = None
        problem = None
        try:
            self._conn = sqlite3.connect(self.path, isolation_level=None, timeout=busy_timeout)
            self._configure()
            self._check()
        except sqlite3.DatabaseError as error:
            if getattr(error, "sqlite_errorname", None) not in _CORRUPT_CODES:
                self.close()
                raise
            problem = str(error)
        except _Inconsistent as error:
            problem = str(error)
        except BaseException:
            self.close()
            raise
        if problem is not None:
            raise QueryStoreCorrupt(self._move_aside(problem)) from None
        if created:
            fsync_directory(self.path.parent)

    def _configure(self) -> None:
        conn = self._db
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise QueryStoreError(f"QueryStore {self.path}: journal_mode is {mode}, not wal")
        conn.execute("PRAGMA synchronous=FULL")
        result = conn.execute("PRAGMA quick_check").fetchall()
        if result != [("ok",)]:
            raise _Inconsistent("quick_check: " + "; ".join(str(r[0]) for r in result[:3]))
        with self._transaction():
            # Not executescript: it would COMMIT first, outside our transaction.
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)",
                         (str(SCHEMA_VERSION),))

    def _check(self) -> None:
        """The stored state's own invariants; a violation means the file cannot be trusted."""
        schema = self._meta("schema")
        if schema != str(SCHEMA_VERSION):
            # Another version's store is not a damaged one: refuse it, leave it in place.
            raise QueryStoreError(f"QueryStore {self.path} has schema {schema!r}; this "
                                  f"program reads schema {SCHEMA_VERSION}")
        ordinal = self._meta("state_ordinal")
        if ordinal is None:
            return
        conn = self._db
        top = conn.execute("SELECT max(ordinal) FROM ordinals").fetchone()[0]
        if top != int(ordinal):
            raise _Inconsistent(f"state_ordinal {ordinal} but the last recorded is {top}")
        generation = int(self._meta("generation") or -1)
        receipts = [r[0] for r in conn.execute("SELECT generation FROM receipts ORDER BY 1")]
        if receipts != list(range(1, generation + 1)):
            raise _Inconsistent(f"generation {generation} without one receipt per generation")
        n_shards = int(self._meta("n_shards") or 0)
        shards = conn.execute("SELECT count(*) FROM shards").fetchone()[0]
        members = conn.execute("SELECT count(*) FROM members").fetchone()[0]
        if n_shards < 1 or shards != n_shards or members < 1:
            raise _Inconsistent("shard assignment or membership is incomplete")
        pending = conn.execute("SELECT generation FROM plans WHERE committed = 0").fetchall()
        if pending not in ([], [(generation,)]):
            raise _Inconsistent(f"pending plans {pending} at generation {generation}")
        stray = conn.execute("SELECT count(*) FROM leases WHERE generation != ?",
                             (generation,)).fetchone()[0]
        if stray:
            raise _Inconsistent(f"{stray} active leases from another generation")

    def _move_aside(self, reason: str) -> str:
        self.close()
        self.quarantine_dir.mkdir(parents=True, exist_ok=True)
        stamp = f"{self._clock.time():.6f}"
        target = self.quarantine_dir / f"{self.path.name}.corrupt-{stamp}"
        serial = 0
        while target.exists():
            serial += 1
            target = self.quarantine_dir / f"{self.path.name}.corrupt-{stamp}.{serial}"
        for suffix in ("", "-wal", "-shm"):
            source = Path(f"{self.path}{suffix}")
            if source.exists():
                os.rename(source, f"{target}{suffix}")
        fsync_directory(self.quarantine_dir)
        fsync_directory(self.path.parent)
        message = f"corrupt QueryStore {self.path}: {reason}; moved to {target}"
        log.error("%s", message)
        return message

    # -- plumbing --------------------------------------------------------------------------

    @property
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise QueryStoreError(f"QueryStore {self.path} is closed")
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> QueryStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        conn = self._db
        if self._depth:
            # Inside batch(): a savepoint keeps each mutation all-or-nothing on its own.
            conn.execute("SAVEPOINT mutation")
            try:
                yield
            except BaseException:
                conn.execute("ROLLBACK TO mutation")
                conn.execute("RELEASE mutation")
                raise
            conn.execute("RELEASE mutation")
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Several mutations in one transaction and one fsync: all durable on exit, or none
        if the block raises. A mutation refused inside may be caught there; it wrote nothing."""
        if self._depth:
            yield
            return
        conn = self._db
        conn.execute("BEGIN IMMEDIATE")
        self._depth += 1
        try:
            yield
            if self.fault is not None:
                self.fault("batch")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        finally:
            self._depth -= 1

    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def _set_meta(self, key: str, value: Any) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, str(value)))

    def _refuse(self, error: Refused) -> Refused:
        key = "stale_refused" if isinstance(error, StaleFence) else \
            "forks_refused" if isinstance(error, ForkRefused) else "refused"
        self._counts[key] += 1
        return error

    @contextmanager
    def _mutation(self, kind: Mutation, request: dict[str, Any],
                  ordinal: int | None) -> Iterator[_Step]:
        with self._transaction():
            step = self._sequence(kind, request, ordinal)
            if step.repeated:
                self._counts["idempotent_retries"] += 1
                yield step
                return
            self._set_meta("state_ordinal", step.ordinal)
            yield step
            self._db.execute("INSERT INTO ordinals VALUES (?, ?, ?, ?, ?)",
                             (step.ordinal, kind.value, step.digest,
                              _canonical(step.result).decode(), self._clock.time()))
            if step.ordinal % 256 == 0:
                self._db.execute(
                    "DELETE FROM ordinals WHERE ordinal < ? "
                    "AND kind IN ('dispatch', 'finish', 'cancel')",
                    (step.ordinal - self._history,))
            if self.fault is not None:
                self.fault(kind.value)
        self._counts["mutations"] += 1

    def _sequence(self, kind: Mutation, request: dict[str, Any], ordinal: int | None) -> _Step:
        digest = _digest({"kind": kind.value, **request})
        stored = self._meta("state_ordinal")
        current = -1 if stored is None else int(stored)
        if kind is not Mutation.INIT and current < 0:
            raise NotInitialized(f"QueryStore {self.path} has no generation-0 snapshot")
        if ordinal is None:
            ordinal = current + 1
        if not isinstance(ordinal, int) or ordinal < 0:
            raise ValueError("ordinal must be a non-negative integer")
        if ordinal <= current:
            row = self._db.execute("SELECT digest, result FROM ordinals WHERE ordinal = ?",
                                   (ordinal,)).fetchone()
            if row is None:
                raise self._refuse(OrdinalOutOfOrder(
                    f"ordinal {ordinal} is older than the kept history"))
            if row[0] != digest:
                raise self._refuse(ForkRefused(
                    f"ordinal {ordinal} already holds another {kind.value} or mutation "
                    f"(digest {row[0][:16]}, this one {digest[:16]}): state fork refused"))
            return _Step(ordinal, digest, True, json.loads(row[1]))
        if ordinal != current + 1:
            raise self._refuse(OrdinalOutOfOrder(
                f"ordinal {ordinal} skips ahead of state_ordinal {current}"))
        return _Step(ordinal, digest, False)

    # -- reading ---------------------------------------------------------------------------

    def _state_ints(self) -> tuple[int, int, int]:
        ordinal = self._meta("state_ordinal")
        if ordinal is None:
            raise NotInitialized(f"QueryStore {self.path} has no generation-0 snapshot")
        return int(self._meta("generation")), int(ordinal), int(self._meta("n_shards"))

    @property
    def initialized(self) -> bool:
        return self._meta("state_ordinal") is not None

    @property
    def generation(self) -> int:
        return self._state_ints()[0]

    @property
    def state_ordinal(self) -> int:
        return self._state_ints()[1]

    def members(self) -> tuple[str, ...]:
        return tuple(r[0] for r in self._db.execute(
            "SELECT endpoint FROM members ORDER BY rank"))

    def shards(self) -> tuple[str, ...]:
        return tuple(r[0] for r in self._db.execute("SELECT owner FROM shards ORDER BY shard"))

    def active_leases(self) -> tuple[Lease, ...]:
        return tuple(Lease(*row) for row in self._db.execute(
            "SELECT lease, work_id, shard, worker, generation, at FROM leases ORDER BY lease"))

    def recovery_queue(self) -> tuple[QueuedWork, ...]:
        return tuple(QueuedWork(*row) for row in self._db.execute(
            "SELECT work_id, shard, from_lease, from_generation FROM recovery_queue "
            "ORDER BY from_lease"))

    def pending_plan(self) -> RecoveryPlan | None:
        row = self._db.execute(
            "SELECT body, digest FROM plans WHERE committed = 0").fetchone()
        return None if row is None else RecoveryPlan.from_body(json.loads(row[0]), row[1])

    def receipts(self) -> tuple[Receipt, ...]:
        return tuple(Receipt.from_body(json.loads(row[0])) for row in self._db.execute(
            "SELECT body FROM receipts ORDER BY generation"))

    def snapshot(self) -> Snapshot:
        # One read transaction: a consistent view even while another process writes.
        conn = self._db
        own = not conn.in_transaction
        if own:
            conn.execute("BEGIN")
        try:
            generation, ordinal, n_shards = self._state_ints()
            pending = self.pending_plan()
            return Snapshot(generation, ordinal, n_shards, self.members(), self.shards(),
                            self.active_leases(), self.recovery_queue(),
                            None if pending is None else pending.digest)
        finally:
            if own:
                conn.execute("COMMIT")

    def statistics(self) -> QueryStoreStatistics:
        snap = self.snapshot()
        receipts = self._db.execute("SELECT count(*) FROM receipts").fetchone()[0]
        return QueryStoreStatistics(
            generation=snap.generation, state_ordinal=snap.state_ordinal,
            active_leases=len(snap.leases), recovery_queue=len(snap.recovery_queue),
            receipts=receipts, **self._counts)

    # -- mutations -------------------------------------------------------------------------

    def initialize(self, members: Sequence[str], n_shards: int) -> Snapshot:
        """Write the generation-0 snapshot at state_ordinal 0 (F443 §3 step 2). Repeating it
        with the same members and shards is a no-op; anything else is a fork."""
        members = tuple(members)
        for member in members:
            _check_name("member", member)
        if not members or len(set(members)) != len(members):
            raise ValueError("members must be distinct and at least one")
        if not isinstance(n_shards, int) or n_shards < 1:
            raise ValueError("n_shards must be a positive integer")
        with self._mutation(Mutation.INIT, {"members": list(members), "shards": n_shards},
                            0) as step:
            if not step.repeated:
                self._set_meta("generation", 0)
                self._set_meta("n_shards", n_shards)
                self._write_members(members, n_shards)
                step.result = {"ok": True}
        return self.snapshot()

    def _write_members(self, members: Sequence[str], n_shards: int) -> tuple[str, ...]:
        conn = self._db
        conn.execute("DELETE FROM members")
        conn.executemany("INSERT INTO members VALUES (?, ?)", enumerate(members))
        owners = tuple(shard_owner(shard, members) for shard in range(n_shards))
        conn.execute("DELETE FROM shards")
        conn.executemany("INSERT INTO shards VALUES (?, ?)", enumerate(owners))
        return owners

    def _refuse_if_pending(self) -> None:
        if self._db.execute("SELECT 1 FROM plans WHERE committed = 0").fetchone():
            raise self._refuse(RecoveryPending(
                "a recovery plan is pending: leases are frozen until its commit"))

    def dispatch(self, work_id: str, worker: str, *, shard: int | None = None,
                 ordinal: int | None = None) -> Fence:
        """Persist a lease before the WORK message is sent (F443 §3 step 3). A work waiting
        in the recovery queue takes its original shard back (F443 §4 step 7)."""
        _check_name("work_id", work_id)
        _check_name("worker", worker)
        with self._mutation(Mutation.DISPATCH, {"work": work_id, "worker": worker,
                                                "shard": shard}, ordinal) as step:
            if step.repeated:
                return Fence(**step.result)
            self._refuse_if_pending()
            generation, _, n_shards = self._state_ints()
            if shard is not None and not (isinstance(shard, int) and 0 <= shard < n_shards):
                raise ValueError(f"shard must be in 0..{n_shards - 1}")
            conn = self._db
            if not conn.execute("SELECT 1 FROM members WHERE endpoint = ?",
                                (worker,)).fetchone():
                raise self._refuse(Refused(
                    f"{worker} is not a member of generation {generation}"))
            if conn.execute("SELECT 1 FROM leases WHERE work_id = ?", (work_id,)).fetchone():
                raise self._refuse(Refused(f"work {work_id} already has an active lease"))
            queued = conn.execute("SELECT shard FROM recovery_queue WHERE work_id = ?",
                                  (work_id,)).fetchone()
            if queued is not None:
                shard = queued[0]
                conn.execute("DELETE FROM recovery_queue WHERE work_id = ?", (work_id,))
            elif shard is None:
                shard = preferred_shard(work_id, n_shards)
            conn.execute("INSERT INTO leases VALUES (?, ?, ?, ?, ?, ?)",
                         (step.ordinal, work_id, shard, worker, generation,
                          self._clock.time()))
            fence = Fence(generation, shard, step.ordinal)
            step.result = asdict(fence)
        return fence

    def finish(self, fence: Fence, work_id: str, worker: str, *,
               ordinal: int | None = None) -> int:
        """Complete a lease whose result was accepted; returns the mutation's ordinal."""
        return self._close_lease(Mutation.FINISH, fence, work_id, worker, ordinal)

    def cancel(self, fence: Fence, work_id: str, worker: str, *,
               ordinal: int | None = None) -> int:
        """Drop a lease without a result (F313 compensation, F317 watchdog rollback)."""
        return self._close_lease(Mutation.CANCEL, fence, work_id, worker, ordinal)

    def _close_lease(self, kind: Mutation, fence: Fence, work_id: str, worker: str,
                     ordinal: int | None) -> int:
        request = {"fence": asdict(fence), "work": work_id, "worker": worker}
        with self._mutation(kind, request, ordinal) as step:
            if step.repeated:
                return step.ordinal
            self._refuse_if_pending()
            generation = self._state_ints()[0]
            if fence.generation != generation:
                raise self._refuse(StaleFence(
                    f"fence of generation {fence.generation}; the current one is {generation}"))
            row = self._db.execute(
                "SELECT work_id, shard, worker, generation FROM leases WHERE lease = ?",
                (fence.lease,)).fetchone()
            if row != (work_id, fence.shard, worker, fence.generation):
                raise self._refuse(StaleFence(
                    f"no active lease {fence.lease} of {work_id} on shard {fence.shard} "
                    f"for {worker}"))
            self._db.execute("DELETE FROM leases WHERE lease = ?", (fence.lease,))
            step.result = {"ordinal": step.ordinal}
        return step.ordinal

    def prepare(self, failed: Iterable[str], *, ordinal: int | None = None) -> RecoveryPlan:
        """Persist the recovery plan (F443 §4 step 3): old members, the failed ones, and every
        lease in flight. A survivor that finds the same plan pending gets it back; a different
        plan is a fork and is refused."""
        failed = tuple(sorted(set(failed)))
        for member in failed:
            _check_name("member", member)
        try:
            return self._prepare(failed, ordinal)
        except _Reuse as reuse:
            self._counts["idempotent_retries"] += 1
            return reuse.plan

    def _prepare(self, failed: tuple[str, ...], ordinal: int | None) -> RecoveryPlan:
        with self._mutation(Mutation.PREPARE, {"failed": list(failed)}, ordinal) as step:
            if step.repeated:
                return RecoveryPlan.from_body(step.result["body"], step.result["digest"])
            pending = self.pending_plan()
            if pending is not None:
                if pending.failed == failed:
                    # A slower survivor (F443 §6 item 2): reuse the plan, spend no ordinal.
                    raise _Reuse(pending)
                raise self._refuse(ForkRefused(
                    f"recovery plan {pending.digest[:16]} for failed {list(pending.failed)} "
                    f"is pending; a plan for {list(failed)} would fork it"))
            generation = self._state_ints()[0]
            members = self.members()
            if not failed or not set(failed) <= set(members) or set(failed) == set(members):
                raise self._refuse(Refused(
                    f"failed {list(failed)} must be a non-empty proper subset of the "
                    f"members {list(members)}"))
            plan = RecoveryPlan.build(generation, members, failed, self.active_leases())
            self._db.execute("INSERT INTO plans VALUES (?, ?, ?, ?, 0)",
                             (generation, step.ordinal, plan.digest,
                              _canonical(plan.body()).decode()))
            step.result = {"body": plan.body(), "digest": plan.digest}
        return plan

    def commit(self, *, generation: int, plan_digest: str, members: Sequence[str],
               agreed: bool = True, ordinal: int | None = None) -> Receipt:
        """Advance to `generation` (F443 §4 step 6) with an exact receipt: the pending plan's
        digest, the next generation, and the attested survivors in their new rank order.
        Every lease of the plan goes to the recovery queue; old fences become stale."""
        members = tuple(members)
        request = {"generation": generation, "plan": plan_digest, "members": list(members),
                   "agreed": bool(agreed)}
        with self._mutation(Mutation.COMMIT, request, ordinal) as step:
            if step.repeated:
                return Receipt.from_body(step.result)
            current, _, n_shards = self._state_ints()
            plan = self.pending_plan()
            problem = None
            if plan is None:
                problem = "no recovery plan is pending"
            elif not agreed:
                problem = "the survivors did not agree"
            elif generation != current + 1:
                problem = f"generation {generation} is not {current} + 1"
            elif plan_digest != plan.digest:
                problem = f"plan digest {plan_digest[:16]} is not the pending {plan.digest[:16]}"
            elif len(set(members)) != len(members) or set(members) != set(plan.survivors):
                problem = f"members {list(members)} are not the survivors {list(plan.survivors)}"
            if problem is not None:
                raise self._refuse(ReceiptMismatch(f"commit refused: {problem}"))
            assert plan is not None
            conn = self._db
            conn.executemany(
                "INSERT OR REPLACE INTO recovery_queue VALUES (?, ?, ?, ?)",
                [(lease.work_id, lease.shard, lease.lease, lease.generation)
                 for lease in plan.leases])
            conn.execute("DELETE FROM leases")
            owners = self._write_members(members, n_shards)
            self._set_meta("generation", generation)
            conn.execute("UPDATE plans SET committed = 1 WHERE generation = ?", (current,))
            post = self.snapshot().digest()
            receipt = Receipt(generation, step.ordinal, plan.digest, members, owners, post)
            conn.execute("INSERT INTO receipts VALUES (?, ?, ?)",
                         (generation, step.ordinal, _canonical(receipt.body()).decode()))
            step.result = receipt.body()
        return receipt


class _Inconsistent(Exception):
    """Raised while opening: the stored state breaks its invariants."""


class _Reuse(Exception):
    """Internal: a matching recovery plan is already pending."""

    def __init__(self, plan: RecoveryPlan):
        super().__init__()
        self.plan = plan
