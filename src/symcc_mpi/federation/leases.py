"""The fenced work-lease table of one multi-master job (F320 §2.2–2.3, F321 corrections).

One record per content digest, kept in its shard's append-only log (lease_log.py). A job's
table has a shard per master, and a digest lives in its rendezvous owner's (`shard_of`,
ownership.py): a master's claims, fences and completions all go to its own log, whose lock no
one else takes but to take over an expired lease. A change is decided under the shard's lock
(an `fcntl` byte-range lock, F320 §2.6: its wait is bounded, `LockTimeout`, and nothing is
ever broken for its age) on the state read to the log's end, and the changes of one lock round
go out in one write, so that a master writes about once per task:

* claims are grouped (`claim_many`), and a fence may carry the claims of the inputs to be
  dispatched next (`fence(..., claims=)`);
* several results' fences go in one round (`fence`);
* a completion (committing → done) is not written at once but with the shard's next write, or
  by `flush`: nobody else may change a `committing` record, and every other master treats it
  as it treats a `done` one (never claimed, never taken over), so only its holder needs to
  know, and it does;
* heartbeats of many leases go in one round (`heartbeat_many`).

Why not fsynced: the table lives for one job epoch (`OUT/.standalone-work-<epoch>/`, removed
after the job ends), and the durable "analysed" set is the masters' done journals. A host
crash ends the job, and the resume starts a new epoch with a new, empty table. `fsync=True`
exists for the benchmark that measures what leaving it out saves (benchmarks/bench_leases.py).

Fencing (F320 §2.2): every claim writes a token unique to that claim; any later change must
present the exact token of the *current* record, compared under the lock. A stale token (taken
over, completed, abandoned, never existed) changes nothing and the operation says so. Expiry is
a permission for others to take over, not a revocation: until someone does, the holder's token
stays current. `committing` never expires (F321): stealing it would let the old holder and the
recoverer apply one result twice.

Errors: refusals are return values. `LockTimeout` (a `TimeoutError`), `TableMismatch` and
`OSError` are raised; a failed write is cut back off the log (lease_log.py) before the error
propagates, and a completion it carried is kept for the next write.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from symcc_mpi.durable.atomic import make_directories
from symcc_mpi.durable.clock import SYSTEM_CLOCK, Clock
from symcc_mpi.federation.lease_log import ShardLog, Writer
from symcc_mpi.federation.shards import MAX_SHARDS, check_seconds, open_description
from symcc_mpi.federation.work_leases import (
    WORK_PAYLOAD_SCHEMA,
    WORK_SCHEMA,
    Origin,
    WorkLease,
    WorkPayload,
    check_digest,
    encode_lease,
)

log = logging.getLogger(__name__)

TABLE_SCHEMA = "symcc-work-lease-table-v2"
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
    writes: int = 0  # appends to a shard's log: each carries one or more changes
    changes: int = 0  # records written
    write_failures: int = 0
    corrupt_lines: int = 0  # skipped, in every log this object read
    torn_tails: int = 0  # cut off a log by this object: a writer died inside a write
    lock_waits: int = 0
    lock_wait_seconds: float = 0.0


def _new_token() -> str:
    return secrets.token_hex(12)


def _first_u32(shards: int) -> Callable[[str], int]:
    return lambda digest: int(digest[:8], 16) % shards


@dataclass(frozen=True)
class Fenced:
    """What one `fence` did: the digests now `committing` under their holder's token, and the
    claims it won, {digest: lease}."""

    committing: frozenset[str]
    claimed: dict[str, WorkLease]


class FencedWorkLeaseTable:
    """F320 §2.2–2.3: one record per digest, leased → committing → done, fenced by tokens.

    `owner` names this master (F320: job epoch + master index). `shard_of(digest)` picks a
    digest's shard in `range(shards)` (by default its first u32): the table's creator fixes
    the count, and every opener must shard alike. `writer(fd, bytes)` is the log's write;
    tests inject faults through it. One object per thread.
    """

    def __init__(self, root: Path, owner: str, *, ttl: float, lock_timeout: float,
                 shards: int = 64, shard_of: Callable[[str], int] | None = None,
                 clock: Clock = SYSTEM_CLOCK,
                 sleep: Callable[[float], object] = SYSTEM_CLOCK.sleep,
                 writer: Writer | None = None, fsync: bool = False):
        if not isinstance(owner, str) or not owner or len(owner) > _MAX_NAME:
            raise ValueError(f"owner must be a non-empty string of at most {_MAX_NAME} characters")
        if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
            raise ValueError(f"shards must be an integer in 1..{MAX_SHARDS} (got {shards!r})")
        if not (isinstance(lock_timeout, (int, float)) and lock_timeout >= 0):
            raise ValueError(f"lock_timeout must be a number >= 0 (got {lock_timeout!r})")
        self.owner = owner
        self.ttl = check_seconds("ttl", ttl)
        self.clock = clock
        self.root = Path(root)
        self.shards = self._open(shards, fsync)
        self.shard_of = shard_of or _first_u32(self.shards)
        digits = len(f"{self.shards - 1:x}")
        self._logs = [ShardLog(self.root / "logs" / f"{shard:0{digits}x}.log",
                               lock_timeout=float(lock_timeout), clock=clock, sleep=sleep,
                               writer=writer, fsync=fsync) for shard in range(self.shards)]
        self._completions: list[dict[str, WorkLease]] = [{} for _ in range(self.shards)]
        self._counts: dict[str, Any] = {}

    # -- operations

    def claim(self, digest: str, *, origin: Origin = "generated") -> WorkLease | None:
        """Lease `digest` to this owner with a fresh token, or None if it is held, committing or
        done (a done record refuses every later claim). An expired `leased` record is taken
        over (`steals` + 1)."""
        return self.claim_many([digest], origin=origin).get(digest)

    def claim_many(self, digests: Iterable[str], *,
                   origin: Origin = "generated") -> dict[str, WorkLease]:
        """`claim` for each digest, one lock round and one write per shard: {digest: lease}
        of those won."""
        return self.fence({}, claims=digests, origin=origin).claimed

    def fence(self, tokens: Mapping[str, str], *, claims: Iterable[str] = (),
              origin: Origin = "generated") -> Fenced:
        """`begin_commit` for each {digest: token} of `tokens`, and `claim` for each of
        `claims`, one lock round and one write per shard. A record already `committing`
        under its token needs no round."""
        if origin not in ("initial", "generated"):
            raise ValueError(f"origin must be 'initial' or 'generated' (got {origin!r})")
        committing: set[str] = set()
        by_shard: dict[int, tuple[dict[str, str], list[str]]] = {}
        for digest, token in tokens.items():
            seen = self._logs[self._shard(check_digest(digest))].records.get(digest)
            if seen is not None and seen.token == token and seen.status == "committing":
                committing.add(digest)  # only its holder changes it: no one else can have
            else:
                by_shard.setdefault(self._shard(digest), ({}, []))[0][digest] = token
        for digest in dict.fromkeys(map(check_digest, claims)):
            if digest in tokens:
                continue  # its result is in hand: it is fenced, not claimed again
            by_shard.setdefault(self._shard(digest), ({}, []))[1].append(digest)
        claimed: dict[str, WorkLease] = {}
        for shard in sorted(by_shard):
            fences, wanted = by_shard[shard]

            def decide(records: dict[str, WorkLease], now: float, fences=fences, wanted=wanted):
                changes = []
                for digest, token in fences.items():
                    old = records.get(digest)
                    if not self._current(old, token) or old.status == "done":
                        continue
                    committing.add(digest)
                    if old.status == "leased":
                        self._add("commits_begun")
                        changes.append(msgspec.structs.replace(old, status="committing",
                                                               updated=now))
                for digest in wanted:
                    if (lease := self._claimed(records.get(digest), digest, origin, now,
                                               takeover_only=False)) is not None:
                        claimed[digest] = lease
                        changes.append(lease)
                return changes
            self._round(shard, decide)
        return Fenced(frozenset(committing), claimed)

    def recover_expired(self, *, limit: int | None = None) -> list[WorkLease]:
        """F320 §2.3 recovery scan: take over expired `leased` records (never `committing`)
        of other holders, at most `limit` of them.

        Racing recoverers are serialised by the shard lock, so exactly one new token wins per
        record. Its own leases its holder knows in memory, in flight or about to be: taking
        one over would dispatch the input a second time."""
        now = self.clock.time()
        expired: dict[int, list[str]] = {}
        found = 0
        for shard, shard_log in enumerate(self._logs):
            shard_log.refresh()
            for digest, seen in shard_log.records.items():
                if limit is not None and found >= limit:
                    break
                if seen.expired(now) and seen.owner != self.owner:
                    expired.setdefault(shard, []).append(digest)
                    found += 1
        won: list[WorkLease] = []
        for shard, digests in expired.items():
            def decide(records: dict[str, WorkLease], now: float, digests=digests):
                changes = [lease for digest in digests if (lease := self._claimed(
                    records.get(digest), digest, None, now, takeover_only=True)) is not None]
                won.extend(changes)
                return changes
            self._round(shard, decide)
        return won

    def adopt(self, done: Callable[[str], bool]) -> list[WorkLease]:
        """A successor's takeover of its dead predecessor's records: those of this table's
        owner name, which is one master index of one job epoch (job/federated.py). ULFM
        confirmed the predecessor's death, so no token of its can be presented any more,
        and the successor took over its journal: a record of an input the journal holds as
        `done` is completed; any other is leased anew to the successor, whatever its status,
        for the input to be analysed again. (A `committing` record's commit never reached
        the journal; nor may a `done` one's: a commit completes its lease before the group
        commit that makes its done line durable.) Returns the leases taken."""
        def anew(old: WorkLease, now: float) -> WorkLease:
            self._add("adopted")
            return msgspec.structs.replace(old, status="leased", token=_new_token(), updated=now,
                                           expires=now + self.ttl, attempts=old.attempts + 1)
        return self._take_records(self.owner, done, anew)

    def release(self, owner: str, done: Callable[[str], bool]) -> list[WorkLease]:
        """The records of `owner`, a master whose group ULFM saw die whole (no successor, no
        token of its presented again: federation/withdrawal.py), as `adopt` takes them, but
        given up: each input a journal holds as `done` is completed, any other record is
        removed whatever its status, for the input's new owner to claim it afresh. Returns
        the records removed."""
        def given_up(old: WorkLease, now: float) -> WorkLease:
            self._add("abandoned")
            return msgspec.structs.replace(old, status="abandoned", updated=now)
        return self._take_records(owner, done, given_up)

    def _take_records(self, owner: str, done: Callable[[str], bool],
                      replace: Callable[[WorkLease, float], WorkLease]) -> list[WorkLease]:
        taken: list[WorkLease] = []
        for shard, shard_log in enumerate(self._logs):
            shard_log.refresh()
            if not any(r.owner == owner for r in shard_log.records.values()):
                continue

            def decide(records: dict[str, WorkLease], now: float):
                changes = []
                for old in list(records.values()):
                    if old.owner != owner:
                        continue
                    if done(old.digest):
                        if old.status != "done":
                            changes.append(msgspec.structs.replace(old, status="done",
                                                                   updated=now))
                        continue
                    changes.append(replace(old, now))
                    taken.append(changes[-1])
                return changes
            self._round(shard, decide)
        return taken

    def heartbeat(self, digest: str, token: str) -> bool:
        """Extend the lease of the exact current `leased` token; False if stale or committing
        (a committing record never expires, so there is nothing to extend)."""
        return digest in self.heartbeat_many({digest: token})

    def heartbeat_many(self, tokens: Mapping[str, str]) -> set[str]:
        """`heartbeat` for each {digest: token}, one round per shard: the digests extended."""
        by_shard: dict[int, dict[str, str]] = {}
        for digest, token in tokens.items():
            by_shard.setdefault(self._shard(check_digest(digest)), {})[digest] = token
        extended: set[str] = set()
        for shard, beats in by_shard.items():
            def decide(records: dict[str, WorkLease], now: float, beats=beats):
                changes = []
                for digest, token in beats.items():
                    old = records.get(digest)
                    if self._current(old, token) and old.status == "leased":
                        self._add("heartbeats")
                        extended.add(digest)
                        changes.append(msgspec.structs.replace(old, updated=now,
                                                               expires=now + self.ttl))
                return changes
            self._round(shard, decide)
        return extended

    def begin_commit(self, digest: str, token: str) -> bool:
        """leased → committing for the exact current token: from now on no TTL takeover (F321).

        True also if already committing under `token` (safe to repeat); False otherwise.
        """
        return digest in self.fence({check_digest(digest): token}).committing

    def complete(self, digest: str, token: str) -> bool:
        """committing → done for the exact current token, written with the shard's next write
        (or `flush`); True also if already done by it."""
        shard = self._shard(check_digest(digest))
        if digest in self._completions[shard]:
            return self._completions[shard][digest].token == token
        old = self._logs[shard].records.get(digest)
        if not self._current(old, token) or old.status == "leased":
            return False
        if old.status == "committing":
            self._add("completed")
            self._completions[shard][digest] = msgspec.structs.replace(
                old, status="done", updated=self.clock.time())
        return True

    def abandon(self, digest: str, token: str) -> bool:
        """Give up a pre-commit lease (F320 §2.3: the corpus file is missing): the record is
        removed, so no one heartbeats it and a later claim starts afresh. False for a stale
        token or a record already committing or done."""
        given_up = []

        def decide(records: dict[str, WorkLease], now: float):
            old = records.get(digest)
            if not self._current(old, token) or old.status != "leased":
                return []
            self._add("abandoned")
            given_up.append(digest)
            return [msgspec.structs.replace(old, status="abandoned", updated=now)]
        self._round(self._shard(check_digest(digest)), decide)
        return bool(given_up)

    def flush(self) -> int:
        """Write the completions still waiting for their shard's next write; how many."""
        waiting = sum(map(len, self._completions))
        for shard, pending in enumerate(self._completions):
            if pending:
                self._round(shard, lambda records, now: [])
        return waiting

    def read(self, digest: str) -> WorkLease | None:
        """The digest's record as its log says now (completions not yet written are not in)."""
        shard_log = self._logs[self._shard(check_digest(digest))]
        shard_log.refresh()
        return shard_log.records.get(digest)

    def records(self) -> list[WorkLease]:
        """Every record, as the logs say now."""
        for shard_log in self._logs:
            shard_log.refresh()
        return [record for shard_log in self._logs for record in shard_log.records.values()]

    def statistics(self) -> TableStatistics:
        logs = self._logs
        return TableStatistics(**self._counts, writes=sum(s.writes for s in logs),
                               corrupt_lines=sum(s.corrupt for s in logs),
                               torn_tails=sum(s.torn for s in logs))

    def close(self) -> None:
        for shard_log in self._logs:
            shard_log.close()

    # -- machinery

    def _open(self, shards: int, fsync: bool) -> int:
        """Create the table if absent; the shard count its creator fixed."""
        make_directories(self.root / "logs")
        return open_description(self.root, TABLE_SCHEMA, shards, fsync=fsync)

    def _add(self, name: str, amount: float = 1) -> None:
        self._counts[name] = self._counts.get(name, 0) + amount

    def _shard(self, digest: str) -> int:
        return self.shard_of(digest)

    def _round(self, shard: int,
               decide: Callable[[dict[str, WorkLease], float], list[WorkLease]]) -> None:
        """One lock round of `shard`: the changes `decide` makes of its records, after the
        completions waiting for this shard, in one write (none if there is nothing)."""
        shard_log = self._logs[shard]
        with shard_log.locked() as waited:
            if waited > 0:
                self._add("lock_waits")
                self._add("lock_wait_seconds", waited)
            records = shard_log.records
            # A completion is written only if its token is still the record's: the holder's
            # view may be old (a successor adopted the record meanwhile).
            changes = [done for done in self._completions[shard].values()
                       if (old := records.get(done.digest)) is not None
                       and old.token == done.token and old.status == "committing"] \
                + decide(records, self.clock.time())
            if not changes:
                self._completions[shard].clear()
                return
            try:
                shard_log.append(changes, encode_lease)
            except OSError:
                self._add("write_failures")
                raise
            self._completions[shard].clear()
            self._add("changes", len(changes))

    def _current(self, old: WorkLease | None, token: str) -> bool:
        if old is not None and old.token == token:
            return True
        self._add("stale")
        return False

    def _claimed(self, old: WorkLease | None, digest: str, origin: Origin | None, now: float,
                 *, takeover_only: bool) -> WorkLease | None:
        """The lease a claim of `digest` writes over `old`, or None if it is refused."""
        if old is None:
            if takeover_only:
                return None
            attempts, steals = 1, 0
            payload = WorkPayload(WORK_PAYLOAD_SCHEMA, digest, origin or "generated")
        elif old.expired(now):
            attempts, steals, payload = old.attempts + 1, old.steals + 1, old.payload
        else:
            self._add("refused")
            return None
        self._add("claims")
        self._add("taken_over", int(old is not None))
        return WorkLease(WORK_SCHEMA, digest, "leased", self.owner, _new_token(), now,
                         now + self.ttl, attempts, steals, payload)

    def __repr__(self) -> str:
        return f"FencedWorkLeaseTable({str(self.root)!r}, owner={self.owner!r})"
