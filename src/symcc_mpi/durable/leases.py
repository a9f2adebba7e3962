"""Fenced lease tables on a shared directory: work leases (F320) and target-group leases (F311).

Both tables keep one small JSON record per key, sharded by the first u32 of the key's SHA-256
(`SYMCC_STANDALONE_WORK_LEASE_SHARDS`, default 64), each written whole to a temporary file,
fsynced and `os.replace`d (`atomic.write_durable`), so a reader sees an old or a new record,
never a torn one. Every read-modify-write of a record happens under that record's bounded
lock-directory lock (`locks.DirectoryLock`, F320 §2.6): a lock wait past its deadline raises
`LockTimeout` and nothing is broken because it looks old.

Layout of a table directory::

    table.json                  {"schema", "kind": "work"|"target", "shards"}: fixed at creation
    records/<shard>/<key>.json  one record per key (work id, or target id)
    locks/<shard>/<key>.lock/   short update locks, present only while an update runs
    quarantine/                 corrupt records moved aside, never silently dropped

Fencing (F320 §2.2, F311 §5): every claim writes a token unique to that claim; any later change
must present the exact token of the *current* record, compared under the lock. A stale token
(the record was taken over, completed, released or never existed) changes nothing and the
operation returns False/None. Expiry is a permission for others to take over, not a revocation:
until someone does, the holder's token stays current and may heartbeat or commit.

Errors: ordinary refusals are return values. `CorruptRecord` (after quarantining the record),
`LockTimeout` (a `TimeoutError`) and `OSError` from the filesystem are raised. A failed write is
rolled back under the lock before the error propagates, so a failed operation leaves the table
as it was unless the rollback itself fails (then the leftover is a conservative lease that TTL
ends).

Configuration (F320 §6), read by `LeaseConfig.from_env`; one rule for garbage: a variable that is
unset or blank takes its default; a value that does not parse, or is out of range (not finite,
not positive, too many shards), also takes the default and its name is listed in
`LeaseConfig.rejected` so the caller can log it. The shard count is written in `table.json` by
whoever creates the table; later openers adopt it, because two masters hashing one key to two
different shards would lock two different files.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import math
import os
import re
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec

from symcc_mpi.durable.atomic import (
    fsync_directory,
    is_temporary,
    remove_durable,
    write_durable,
)
from symcc_mpi.durable.clock import SYSTEM_CLOCK, Clock
from symcc_mpi.durable.locks import DirectoryLock, break_if_dead, sweep_debris

log = logging.getLogger(__name__)

TABLE_SCHEMA = "symcc-lease-table-v1"
WORK_SCHEMA = "symcc-work-lease-v1"
WORK_PAYLOAD_SCHEMA = "symcc-work-v1"
TARGET_SCHEMA = "symcc-target-lease-v1"

DEFAULT_SHARDS = 64
MAX_SHARDS = 4096
MAX_GROUP = 64  # F311 §3: G(job)[0:64]
DEFAULT_EXECUTION_TIMEOUT = 10.0
DEFAULT_SHUTDOWN_GRACE = 5.0

ENV_TTL = "SYMCC_STANDALONE_WORK_LEASE_TTL"
ENV_LOCK_ACQUIRE_TIMEOUT = "SYMCC_STANDALONE_WORK_LOCK_ACQUIRE_TIMEOUT"
ENV_SHARDS = "SYMCC_STANDALONE_WORK_LEASE_SHARDS"

_KEY = re.compile(r"[0-9a-f]{64}")  # work ids and target ids alike: hex SHA-256
_MAX_NAME = 200


# --- configuration ------------------------------------------------------------------------------


def default_ttl(execution_timeout: float = DEFAULT_EXECUTION_TIMEOUT) -> float:
    """F320 §6: `max(120, 4 * timeout)` seconds."""
    return max(120.0, 4.0 * execution_timeout)


def default_lock_acquire_timeout(shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE) -> float:
    """F320 §6: `min(30, max(1, shutdown_grace / 4))` seconds."""
    return min(30.0, max(1.0, shutdown_grace / 4.0))


def _positive_seconds(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def _shard_count(text: str) -> int | None:
    try:
        value = int(text, 10)
    except ValueError:
        return None
    return value if 1 <= value <= MAX_SHARDS else None


DEFAULT_TTL = default_ttl()
DEFAULT_LOCK_TIMEOUT = default_lock_acquire_timeout()


@dataclass(frozen=True)
class LeaseConfig:
    """Lease-table knobs. Field names match the table constructors: `Table(..., **c.options())`.

    `from_env` rule: unset or blank → default. Otherwise TTL and lock timeout must be a finite
    number of seconds > 0, and the shard count a decimal integer in 1..4096; anything else
    (`"abc"`, `"0"`, `"-3"`, `"nan"`, `"inf"`, `"1.5"` shards) → default, and the variable's name
    and value are recorded in `rejected`.
    """

    ttl: float = field(default_factory=default_ttl)
    lock_timeout: float = field(default_factory=default_lock_acquire_timeout)
    shards: int = DEFAULT_SHARDS
    rejected: tuple[str, ...] = ()

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        execution_timeout: float = DEFAULT_EXECUTION_TIMEOUT,
        shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE,
    ) -> LeaseConfig:
        env = os.environ if env is None else env
        rejected: list[str] = []

        def pick(name: str, parse: Callable[[str], Any], default: Any) -> Any:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            value = parse(raw)
            if value is None:
                rejected.append(f"{name}={raw!r}")
                return default
            return value

        return cls(
            ttl=pick(ENV_TTL, _positive_seconds, default_ttl(execution_timeout)),
            lock_timeout=pick(ENV_LOCK_ACQUIRE_TIMEOUT, _positive_seconds,
                              default_lock_acquire_timeout(shutdown_grace)),
            shards=pick(ENV_SHARDS, _shard_count, DEFAULT_SHARDS),
            rejected=tuple(rejected),
        )

    def options(self) -> dict[str, Any]:
        return {"ttl": self.ttl, "lock_timeout": self.lock_timeout, "shards": self.shards}


# --- errors -------------------------------------------------------------------------------------


class LeaseError(Exception):
    """Base of the lease tables' own errors (lock timeouts stay `TimeoutError`, I/O `OSError`)."""


class TableMismatch(LeaseError):
    """The directory holds another kind of table, or a `table.json` this code cannot read."""


class CorruptRecord(LeaseError):
    """A record did not decode or contradicts its own name; it was moved to `quarantined`.

    Repeating the operation sees the key as absent. `quarantined` is None when even moving it
    aside failed: then the record stays, and every operation on it raises again (fail closed).
    """

    def __init__(self, path: Path, reason: str, quarantined: Path | None):
        self.path = path
        self.reason = reason
        self.quarantined = quarantined
        where = f"moved to {quarantined}" if quarantined else "could not be moved aside"
        super().__init__(f"corrupt lease record {path}: {reason}; {where}")


# --- records ------------------------------------------------------------------------------------


class WorkPayload(msgspec.Struct, frozen=True):
    """F320 §2.2 payload: schema, the input's content hash, and where it came from."""

    schema: str
    hash: str
    origin: Literal["initial", "generated"]


class WorkLease(msgspec.Struct, frozen=True):
    """One work record (F320 §2.2). `status` only moves leased → committing → done."""

    schema: str
    work_id: str
    status: Literal["leased", "committing", "done"]
    owner: str
    token: str
    updated: float  # wall clock, comparable across hosts
    expires: float  # wall clock; meaningful only while `leased` (committing is not stealable)
    attempts: int  # claims so far, takeovers included
    steals: int  # takeovers of an expired lease
    payload: WorkPayload

    def expired(self, now: float) -> bool:
        return self.status == "leased" and now >= self.expires


class TargetLease(msgspec.Struct, frozen=True):
    """One member of a claimed target group (F311 §4 step 4); deleted on release."""

    schema: str
    target: int
    target_id: str
    status: Literal["leased"]
    owner: str
    worker: str
    token: str
    group: tuple[int, ...]
    payload: Any
    updated: float
    expires: float
    attempts: int
    steals: int

    def expired(self, now: float) -> bool:
        return now >= self.expires


@dataclass(frozen=True)
class TargetGroupClaim:
    """A successful group claim: one token for every member of `group` (caller's order)."""

    token: str
    group: tuple[int, ...]
    expires: float
    taken_over: tuple[int, ...] = ()  # members whose expired lease this claim replaced


@dataclass(frozen=True)
class LeaseStatistics:
    """Counters of one table object (this process's view), for logs and the live view."""

    claims: int = 0
    refused: int = 0
    taken_over: int = 0
    heartbeats: int = 0
    stale: int = 0
    commits_begun: int = 0
    completed: int = 0
    abandoned: int = 0
    released: int = 0
    writes: int = 0
    write_failures: int = 0
    rollback_failures: int = 0
    quarantined: int = 0
    lock_waits: int = 0
    lock_wait_seconds: float = 0.0
    dead_locks_cleared: int = 0
    corrupt_paths: tuple[str, ...] = ()


def target_id(target: int) -> str:
    """F311 §3: `SHA256("target:" || decimal(target))`, hex; `target` a positive int."""
    if isinstance(target, bool) or not isinstance(target, int) or target <= 0:
        raise ValueError(f"a target is a positive integer (got {target!r})")
    return hashlib.sha256(f"target:{target}".encode()).hexdigest()


def normalize_group(targets: Iterable[int]) -> tuple[int, ...]:
    """F311 §4 step 1: checked, deduplicated in first-seen order, at most 64 members."""
    seen: dict[int, None] = {}
    for target in targets:
        target_id(target)  # validates
        seen.setdefault(target, None)
    group = tuple(seen)[:MAX_GROUP]
    if not group:
        raise ValueError("a target group needs at least one target")
    return group


def _check_name(what: str, value: str) -> str:
    if not isinstance(value, str) or not value or len(value) > _MAX_NAME:
        raise ValueError(f"{what} must be a non-empty string of at most {_MAX_NAME} characters")
    return value


def _check_seconds(what: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{what} must be a finite number of seconds > 0 (got {value!r})")
    return float(value)


def _new_token(*parts: str) -> str:
    # F311 §5 shape owner:worker:pid:time_ns, plus randomness: unique even if clocks tie.
    return ":".join((*parts, str(os.getpid()), str(time.time_ns()), secrets.token_hex(8)))


# --- the record store both tables stand on ------------------------------------------------------

Writer = Callable[[Path, bytes], None]
Remover = Callable[[Path], bool]


class _Counters:
    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.corrupt: list[str] = []

    def add(self, name: str, amount: float = 1) -> None:
        self.values[name] = self.values.get(name, 0) + amount

    def snapshot(self) -> LeaseStatistics:
        return LeaseStatistics(**self.values, corrupt_paths=tuple(self.corrupt))


class _Store:
    """Sharded records, per-record locks, decode-or-quarantine, write-or-roll-back."""

    def __init__(self, root: Path, *, kind: str, shards: int, lock_timeout: float, clock: Clock,
                 sleep: Callable[[float], object], writer: Writer, remover: Remover,
                 fsync: bool, label: str, counters: _Counters):
        if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
            raise ValueError(f"shards must be an integer in 1..{MAX_SHARDS} (got {shards!r})")
        if not (isinstance(lock_timeout, (int, float)) and lock_timeout >= 0):
            raise ValueError(f"lock_timeout must be a number >= 0 (got {lock_timeout!r})")
        self.root = Path(root)
        self.kind = kind
        self.lock_timeout = float(lock_timeout)
        self.clock = clock
        self.sleep = sleep
        self.writer = writer
        self.remover = remover
        self.fsync = fsync
        self.label = label
        self.counters = counters
        self.shards = self._open(shards)
        digits = len(f"{self.shards - 1:x}")
        names = [f"{shard:0{digits}x}" for shard in range(self.shards)]
        self._record_dirs = [self.root / "records" / name for name in names]
        self._lock_dirs = [os.path.join(self.root, "locks", name) for name in names]

    # -- opening

    def _open(self, shards: int) -> int:
        self.root.mkdir(parents=True, exist_ok=True)
        meta = self.root / "table.json"
        if not meta.exists():
            self._create_meta(meta, shards)
        try:
            raw = json.loads(meta.read_bytes())
            found_schema, found_kind, found = raw["schema"], raw["kind"], raw["shards"]
        except (OSError, ValueError, TypeError, KeyError) as error:
            raise TableMismatch(f"{meta}: unreadable table description ({error})") from None
        if found_schema != TABLE_SCHEMA or found_kind != self.kind:
            raise TableMismatch(f"{meta}: holds a {found_kind!r} table of schema "
                                f"{found_schema!r}, not a {self.kind!r} table of {TABLE_SCHEMA!r}")
        if isinstance(found, bool) or not isinstance(found, int) or not 1 <= found <= MAX_SHARDS:
            raise TableMismatch(f"{meta}: shard count {found!r} out of range")
        digits = len(f"{found - 1:x}")
        created = False
        for tree in ("records", "locks", "quarantine"):
            created |= _mkdir(self.root / tree)
        for shard in range(found):
            name = f"{shard:0{digits}x}"
            created |= _mkdir(self.root / "records" / name)
            created |= _mkdir(self.root / "locks" / name)
        if created and self.fsync:
            for directory in (self.root / "records", self.root / "locks", self.root):
                fsync_directory(directory)
        for shard in range(found):
            self._clear_dead_locks(self.root / "locks" / f"{shard:0{digits}x}")
        return found

    def _clear_dead_locks(self, directory: Path) -> None:
        # A master killed inside an update leaves its lock; clear it now if (and only if) its
        # holder is provably dead (locks.break_if_dead), so reopening leaves nothing behind.
        sweep_debris(directory)
        for name in os.listdir(directory):
            if name.endswith(".lock") and break_if_dead(directory / name):
                self.counters.add("dead_locks_cleared")

    def _create_meta(self, meta: Path, shards: int) -> None:
        # Create-if-absent without a race: a complete file is linked into place, and link fails
        # if another opener got there first; both then read the winner's shard count.
        data = json.dumps({"schema": TABLE_SCHEMA, "kind": self.kind, "shards": shards}).encode()
        staged = self.root / f".tmp-table.json.{os.getpid()}.{secrets.token_hex(4)}"
        try:
            with open(staged, "wb") as handle:
                handle.write(data + b"\n")
                handle.flush()
                if self.fsync:
                    os.fsync(handle.fileno())
            with contextlib.suppress(FileExistsError):
                os.link(staged, meta)
        finally:
            staged.unlink(missing_ok=True)
        if self.fsync:
            fsync_directory(self.root)

    # -- naming

    def shard(self, key: str) -> int:
        return int(key[:8], 16) % self.shards  # F311 §3: first u32 of the id

    def path(self, key: str) -> Path:
        return self._record_dirs[self.shard(key)] / f"{key}.json"

    @contextlib.contextmanager
    def locked(self, keys: Iterable[str]) -> Iterator[None]:
        """Hold the locks of `keys` in the given order; release them in reverse (F311 §4)."""
        with contextlib.ExitStack() as stack:
            for key in keys:
                lock = DirectoryLock(os.path.join(self._lock_dirs[self.shard(key)], key + ".lock"),
                                     timeout=self.lock_timeout, clock=self.clock,
                                     sleep=self.sleep, label=self.label)
                stack.enter_context(lock)
                if lock.waited > 0:
                    self.counters.add("lock_waits")
                    self.counters.add("lock_wait_seconds", lock.waited)
                if lock.cleared:
                    self.counters.add("dead_locks_cleared", lock.cleared)
            yield

    # -- reading

    def load(self, key: str, decode: Callable[[str, bytes], Any]) -> tuple[Any, bytes | None]:
        """Under the key's lock: (record, raw bytes), or (None, None) when absent."""
        path = self.path(key)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None, None
        try:
            return decode(key, raw), raw
        except _Invalid as invalid:
            raise self.quarantine(path, str(invalid)) from None

    def peek(self, key: str, decode: Callable[[str, bytes], Any]) -> Any:
        """Without the lock (replace is atomic): the record or None; corrupt → quarantine+raise."""
        try:
            raw = self.path(key).read_bytes()
        except FileNotFoundError:
            return None
        try:
            return decode(key, raw)
        except _Invalid:
            with self.locked([key]):
                return self.load(key, decode)[0]  # still corrupt under the lock: raises

    def quarantine(self, path: Path, reason: str) -> CorruptRecord:
        destination: Path | None = (self.root / "quarantine"
                                    / f"{path.parent.name}-{path.name}.{time.time_ns()}")
        try:
            os.rename(path, destination)
            if self.fsync:
                fsync_directory(path.parent)
                fsync_directory(destination.parent)
        except OSError:
            destination = None
        self.counters.add("quarantined")
        self.counters.corrupt = (self.counters.corrupt + [str(path)])[-16:]
        error = CorruptRecord(path, reason, destination)
        log.warning("%s", error)
        return error

    def keys(self) -> Iterator[str]:
        """Every key with a record, shard by shard; sweeps dead writers' temporary files."""
        for shard in sorted(os.listdir(self.root / "records")):
            directory = self.root / "records" / shard
            for name in sorted(os.listdir(directory)):
                if is_temporary(Path(name)):
                    self._sweep_temporary(directory / name)
                elif name.endswith(".json") and _KEY.fullmatch(name[: -len(".json")]):
                    yield name[: -len(".json")]

    def _sweep_temporary(self, path: Path) -> None:
        # write_durable names its temporary ".tmp-<record>.<pid>". Writers hold the record's
        # lock, so a temporary seen while we hold that lock belongs to a writer that died.
        stem = path.name[len(".tmp-"):].rsplit(".", 1)[0]
        if not stem.endswith(".json"):
            return
        key = stem[: -len(".json")]
        if not _KEY.fullmatch(key):
            return
        try:
            with self.locked([key]):
                path.unlink(missing_ok=True)
        except (TimeoutError, OSError):
            pass  # junk stays until a later scan; it is never read as a record

    # -- writing

    def put(self, key: str, data: bytes, previous: bytes | None) -> None:
        """Write a record; on failure restore `previous` (None: absent), then re-raise."""
        self.counters.add("writes")
        try:
            self.writer(self.path(key), data)
        except OSError:
            self.counters.add("write_failures")
            self.restore(key, previous)
            raise

    def drop(self, key: str, previous: bytes) -> None:
        """Delete a record; on failure put `previous` back if it is gone, then re-raise."""
        self.counters.add("writes")
        try:
            self.remover(self.path(key))
        except OSError:
            self.counters.add("write_failures")
            if not self.path(key).exists():
                self.restore(key, previous)
            raise

    def restore(self, key: str, previous: bytes | None) -> bool:
        """Best effort, under the lock: make the record `previous` again (None: absent)."""
        try:
            if previous is None:
                self.remover(self.path(key))
            else:
                self.writer(self.path(key), previous)
            return True
        except OSError:
            self.counters.add("rollback_failures")
            log.warning("could not roll back lease record %s; it stays until its TTL ends",
                        self.path(key))
            return False


def _mkdir(path: Path) -> bool:
    try:
        path.mkdir()
        return True
    except FileExistsError:
        return False


class _Invalid(Exception):
    """A record's bytes do not decode to a record consistent with its file name."""


_encoder = msgspec.json.Encoder()
_work_decoder = msgspec.json.Decoder(WorkLease)
_target_decoder = msgspec.json.Decoder(TargetLease)


def _decode_work(key: str, raw: bytes) -> WorkLease:
    try:
        record = _work_decoder.decode(raw)
    except msgspec.DecodeError as error:  # ValidationError is a DecodeError
        raise _Invalid(str(error) or "empty or truncated") from None
    problem = (
        "wrong schema" if record.schema != WORK_SCHEMA
        else "work_id differs from the file name" if record.work_id != key
        else "payload hash differs from the work id" if record.payload.hash != key
        else "wrong payload schema" if record.payload.schema != WORK_PAYLOAD_SCHEMA
        else "empty token or owner" if not (record.token and record.owner)
        else "impossible counters" if not 0 <= record.steals < record.attempts
        else "non-finite time" if not (math.isfinite(record.updated)
                                       and math.isfinite(record.expires))
        else None
    )
    if problem:
        raise _Invalid(problem)
    return record


def _decode_target(key: str, raw: bytes) -> TargetLease:
    try:
        record = _target_decoder.decode(raw)
    except msgspec.DecodeError as error:
        raise _Invalid(str(error) or "empty or truncated") from None
    try:
        identity = target_id(record.target)
    except ValueError:
        identity = None
    problem = (
        "wrong schema" if record.schema != TARGET_SCHEMA
        else "target id differs from the file name or the target"
        if not (record.target_id == key == identity)
        else "target is not in its own group" if record.target not in record.group
        else "empty token or owner" if not (record.token and record.owner)
        else "impossible counters" if not 0 <= record.steals < record.attempts
        else "non-finite time" if not (math.isfinite(record.updated)
                                       and math.isfinite(record.expires))
        else None
    )
    if problem:
        raise _Invalid(problem)
    return record


def _encode(record: msgspec.Struct) -> bytes:
    return _encoder.encode(record) + b"\n"


_DELETE = object()


def _default_io(writer: Writer | None, remover: Remover | None, fsync: bool):
    return (writer or functools.partial(write_durable, fsync=fsync),
            remover or functools.partial(remove_durable, fsync=fsync))


# --- F320: work leases --------------------------------------------------------------------------


class FencedWorkLeaseTable:
    """F320 §2.2–2.3 work lease table: one record per content hash, leased → committing → done.

    `owner` names this master (F320: job epoch + master rank). `writer(path, bytes)` and
    `remover(path)` default to the durable atomic operations; tests inject faults through them.
    One object per thread: the locks exclude other objects and processes, not concurrent calls
    on the same object's counters.
    """

    def __init__(
        self,
        root: Path,
        owner: str,
        *,
        ttl: float = DEFAULT_TTL,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        shards: int = DEFAULT_SHARDS,
        clock: Clock = SYSTEM_CLOCK,
        sleep: Callable[[float], object] = time.sleep,
        writer: Writer | None = None,
        remover: Remover | None = None,
        fsync: bool = True,
    ):
        self.owner = _check_name("owner", owner)
        self.ttl = _check_seconds("ttl", ttl)
        self.clock = clock
        self._counters = _Counters()
        writer, remover = _default_io(writer, remover, fsync)
        self._store = _Store(Path(root), kind="work", shards=shards, lock_timeout=lock_timeout,
                             clock=clock, sleep=sleep, writer=writer, remover=remover,
                             fsync=fsync, label=owner, counters=self._counters)

    @property
    def root(self) -> Path:
        return self._store.root

    @property
    def shards(self) -> int:
        return self._store.shards

    def path(self, work_id: str) -> Path:
        return self._store.path(_check_work_id(work_id))

    # -- operations

    def claim(self, work_id: str, *,
              origin: Literal["initial", "generated"] = "initial") -> WorkLease | None:
        """Lease `work_id` to this owner with a fresh token, or None if it is held, committing or
        done (F320 §2.3: a done record refuses every later claim). An expired `leased` record is
        taken over (`steals` + 1)."""
        _check_work_id(work_id)
        if origin not in ("initial", "generated"):
            raise ValueError(f"origin must be 'initial' or 'generated' (got {origin!r})")
        return self._claim(work_id, origin, takeover_only=False)

    def recover_expired(self, *, limit: int | None = None) -> list[WorkLease]:
        """F320 §2.3 recovery scan: take over expired `leased` records (never `committing`).

        Racing recoverers are serialised by each record's lock, so exactly one new token wins per
        record. Corrupt records met on the way are quarantined and logged, not raised.
        """
        won: list[WorkLease] = []
        for key in self._store.keys():
            if limit is not None and len(won) >= limit:
                break
            try:
                seen = self._store.peek(key, _decode_work)
                if seen is None or not seen.expired(self.clock.time()):
                    continue
                record = self._claim(key, seen.payload.origin, takeover_only=True)
            except CorruptRecord:
                continue
            if record is not None:
                won.append(record)
        return won

    def heartbeat(self, work_id: str, token: str) -> bool:
        """Extend the lease of the exact current token (leased or committing); False if stale."""
        def decide(old: WorkLease | None, now: float):
            if not self._current(old, token) or old.status == "done":
                return False, None
            self._counters.add("heartbeats")
            return True, msgspec.structs.replace(old, updated=now, expires=now + self.ttl)
        return self._mutate(work_id, decide)

    def begin_commit(self, work_id: str, token: str) -> bool:
        """leased → committing for the exact current token: from now on no TTL takeover (F321).

        True also if it is already committing under `token` (safe to repeat); False otherwise.
        """
        def decide(old: WorkLease | None, now: float):
            if not self._current(old, token) or old.status == "done":
                return False, None
            if old.status == "committing":
                return True, None
            self._counters.add("commits_begun")
            return True, msgspec.structs.replace(old, status="committing", updated=now)
        return self._mutate(work_id, decide)

    def complete(self, work_id: str, token: str) -> bool:
        """committing → done for the exact current token; True also if already done by it."""
        def decide(old: WorkLease | None, now: float):
            if not self._current(old, token) or old.status == "leased":
                return False, None
            if old.status == "done":
                return True, None
            self._counters.add("completed")
            return True, msgspec.structs.replace(old, status="done", updated=now)
        return self._mutate(work_id, decide)

    def abandon(self, work_id: str, token: str) -> bool:
        """Give up a pre-commit lease (F320 §2.3, e.g. the corpus file is missing): the record is
        deleted, so no one heartbeats it and a later claim starts afresh. False for a stale token
        or a record already committing or done."""
        def decide(old: WorkLease | None, now: float):
            if not self._current(old, token) or old.status != "leased":
                return False, None
            self._counters.add("abandoned")
            return True, _DELETE
        return self._mutate(work_id, decide)

    def read(self, work_id: str) -> WorkLease | None:
        """The current record (no lock needed: records are replaced whole)."""
        return self._store.peek(_check_work_id(work_id), _decode_work)

    def records(self) -> Iterator[WorkLease]:
        """Every readable record; corrupt ones are quarantined and logged on the way."""
        for key in self._store.keys():
            with contextlib.suppress(CorruptRecord):
                record = self._store.peek(key, _decode_work)
                if record is not None:
                    yield record

    def statistics(self) -> LeaseStatistics:
        return self._counters.snapshot()

    # -- machinery

    def _current(self, old: WorkLease | None, token: str) -> bool:
        if old is not None and old.token == token:
            return True
        self._counters.add("stale")
        return False

    def _claim(self, work_id: str, origin: str, *, takeover_only: bool) -> WorkLease | None:
        def decide(old: WorkLease | None, now: float):
            if old is None:
                if takeover_only:
                    return None, None
                attempts, steals = 1, 0
                payload = WorkPayload(WORK_PAYLOAD_SCHEMA, work_id, origin)
            elif old.expired(now):
                attempts, steals, payload = old.attempts + 1, old.steals + 1, old.payload
            else:
                self._counters.add("refused")
                return None, None
            record = WorkLease(WORK_SCHEMA, work_id, "leased", self.owner,
                               _new_token(self.owner), now, now + self.ttl, attempts, steals,
                               payload)
            return record, record
        record = self._mutate(work_id, decide)
        if record is not None:
            self._counters.add("claims")
            # attempts > 1 only through a takeover: abandon deletes, so a fresh claim starts at 1
            self._counters.add("taken_over", int(record.attempts > 1))
        return record

    def _mutate(self, work_id: str, decide: Callable[[WorkLease | None, float], tuple]) -> Any:
        _check_work_id(work_id)
        with self._store.locked([work_id]):
            old, raw = self._store.load(work_id, _decode_work)
            result, new = decide(old, self.clock.time())
            if new is _DELETE:
                self._store.drop(work_id, raw)
            elif new is not None:
                self._store.put(work_id, _encode(new), raw)
            return result

    def __repr__(self) -> str:
        return f"FencedWorkLeaseTable({str(self.root)!r}, owner={self.owner!r})"


def _check_work_id(work_id: str) -> str:
    if not isinstance(work_id, str) or not _KEY.fullmatch(work_id):
        raise ValueError(f"a work id is a lowercase hex SHA-256 (got {work_id!r})")
    return work_id


# --- F311: target-group leases ------------------------------------------------------------------


class FencedTargetLeaseTable:
    """F311 §3–§5 target lease table: all-or-nothing group claims keyed by `target_id`.

    Records are efficiency leases, not result fences (F311 §5): the exact work lease's
    `begin_commit` still decides whether a result counts. One object per thread, as for work.
    """

    def __init__(
        self,
        root: Path,
        owner: str,
        *,
        ttl: float = DEFAULT_TTL,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        shards: int = DEFAULT_SHARDS,
        clock: Clock = SYSTEM_CLOCK,
        sleep: Callable[[float], object] = time.sleep,
        writer: Writer | None = None,
        remover: Remover | None = None,
        fsync: bool = True,
    ):
        self.owner = _check_name("owner", owner)
        self.ttl = _check_seconds("ttl", ttl)
        self.clock = clock
        self._counters = _Counters()
        writer, remover = _default_io(writer, remover, fsync)
        self._store = _Store(Path(root), kind="target", shards=shards, lock_timeout=lock_timeout,
                             clock=clock, sleep=sleep, writer=writer, remover=remover,
                             fsync=fsync, label=owner, counters=self._counters)

    @property
    def root(self) -> Path:
        return self._store.root

    @property
    def shards(self) -> int:
        return self._store.shards

    def path(self, target: int) -> Path:
        return self._store.path(target_id(target))

    def claim_group(self, targets: Iterable[int], *, worker: str = "",
                    payload: Any = None) -> TargetGroupClaim | None:
        """F311 §4: claim every member with one token, or none of them.

        Locks are taken in target-id order (no deadlock between crossing groups), all records are
        read, and the whole group is refused (None) if any member holds an unexpired lease.
        Otherwise every member is written; if a write fails, what was written is restored or
        removed while the locks are still held, and the `OSError` propagates.
        """
        group = normalize_group(targets)
        if not isinstance(worker, str) or len(worker) > _MAX_NAME:
            raise ValueError(f"worker must be a string of at most {_MAX_NAME} characters")
        try:
            _encoder.encode(payload)
        except (TypeError, msgspec.EncodeError) as error:
            raise ValueError(f"payload must be JSON-encodable: {error}") from None
        ids = {target: target_id(target) for target in group}
        order = sorted(group, key=ids.__getitem__)
        with self._store.locked(ids[t] for t in order):
            now = self.clock.time()
            old = self._load_all(order, ids)
            if any(rec is not None and not rec.expired(now) for rec, _ in old.values()):
                self._counters.add("refused")
                return None
            token = _new_token(self.owner, worker)
            expires = now + self.ttl
            written: list[int] = []
            for target in order:
                rec, _ = old[target]
                new = TargetLease(
                    TARGET_SCHEMA, target, ids[target], "leased", self.owner, worker, token,
                    group, payload, now, expires,
                    attempts=1 if rec is None else rec.attempts + 1,
                    steals=0 if rec is None else rec.steals + 1)
                try:
                    self._store.writer(self._store.path(ids[target]), _encode(new))
                    self._counters.add("writes")
                except OSError:
                    self._counters.add("writes")
                    self._counters.add("write_failures")
                    # F311 §4 step 5: undo in reverse while still holding every lock; the
                    # failing member too, since its replace may have happened.
                    for undo in reversed([*written, target]):
                        self._store.restore(ids[undo], old[undo][1])
                    raise
                written.append(target)
            taken_over = tuple(t for t in group if old[t][0] is not None)
            self._counters.add("claims")
            self._counters.add("taken_over", len(taken_over))
            return TargetGroupClaim(token, group, expires, taken_over)

    def heartbeat(self, targets: Iterable[int], token: str) -> bool:
        """Extend every member, only if every member's current token is exactly `token`."""
        group = normalize_group(targets)
        ids = {target: target_id(target) for target in group}
        order = sorted(group, key=ids.__getitem__)
        with self._store.locked(ids[t] for t in order):
            now = self.clock.time()
            old = self._load_all(order, ids)
            if not all(rec is not None and rec.token == token for rec, _ in old.values()):
                self._counters.add("stale")
                return False
            for target in order:
                rec, raw = old[target]
                # Extending some members before a failure is harmless: all still carry `token`.
                self._store.put(ids[target], _encode(msgspec.structs.replace(
                    rec, updated=now, expires=now + self.ttl)), raw)
            self._counters.add("heartbeats")
            return True

    def release(self, targets: Iterable[int], token: str) -> int:
        """Delete the members whose current token is exactly `token`; return how many.

        F311 §5: after a takeover the old token deletes nothing of the new owner's, while what
        still carries it (a partial leftover) is cleaned. A failed delete is raised after the
        other members were tried; TTL ends whatever stays.
        """
        group = normalize_group(targets)
        ids = {target: target_id(target) for target in group}
        order = sorted(group, key=ids.__getitem__)
        released = 0
        failure: OSError | None = None
        with self._store.locked(ids[t] for t in order):
            old = self._load_all(order, ids)
            for target in order:
                rec, raw = old[target]
                if rec is None or rec.token != token:
                    self._counters.add("stale")
                    continue
                try:
                    self._store.drop(ids[target], raw)
                    released += 1
                except OSError as error:
                    failure = failure or error
        self._counters.add("released", released)
        if failure is not None:
            raise failure
        return released

    def read(self, target: int) -> TargetLease | None:
        return self._store.peek(target_id(target), _decode_target)

    def records(self) -> Iterator[TargetLease]:
        """Every readable record; corrupt ones are quarantined and logged on the way."""
        for key in self._store.keys():
            with contextlib.suppress(CorruptRecord):
                record = self._store.peek(key, _decode_target)
                if record is not None:
                    yield record

    def statistics(self) -> LeaseStatistics:
        return self._counters.snapshot()

    def _load_all(self, order: list[int], ids: dict[int, str]) -> dict[int, tuple]:
        # Read every member even after a corrupt one, so each bad record is quarantined now;
        # then report the first. Nothing has been written yet.
        loaded: dict[int, tuple] = {}
        first: CorruptRecord | None = None
        for target in order:
            try:
                loaded[target] = self._store.load(ids[target], _decode_target)
            except CorruptRecord as error:
                first = first or error
        if first is not None:
            raise first
        return loaded

    def __repr__(self) -> str:
        return f"FencedTargetLeaseTable({str(self.root)!r}, owner={self.owner!r})"
