"""A master's work leases: grouped claims and fences, rate-limited heartbeats, the figures.

The master loop's one handle on the shared table (F320 §2.2–2.3, issue 11 items 2 and 7). It
keeps what the table cannot: when each of this master's tokens was last extended, so that the
loop may call `heartbeat` every tick and the table sees at most one write per token per
`heartbeat_interval`; and when the last recovery scan ran, because a scan lists the whole
table and nothing can expire faster than a TTL.

`heartbeat_interval = min(TTL / 3, 30 s)`, and the leases due are looked at four times per
interval: a master that ticks at least that often extends every live lease at most 5/12 TTL
apart, so only a master stalled for most of a TTL loses one. Times are the table clock's
monotonic seconds (tests pass a `ManualClock`).

Errors: `LockTimeout` (a `TimeoutError`) and `OSError` propagate; the master turns them into a
one-line failure and Abort(70) (F320 §2.6).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from symcc_mpi.federation.leases import FencedWorkLeaseTable
from symcc_mpi.federation.work_leases import Origin, WorkLease

LONGEST_HEARTBEAT_INTERVAL = 30.0


@dataclass(frozen=True)
class LeaseFigures:
    """What one master did with the shared table, for stats.json and the live view."""

    claims: int  # leases won, fresh or taken over
    steals: int  # expired leases taken over (by claim or recovery scan)
    expiries: int  # this master's own leases found taken over (a heartbeat refused)
    stale_results: int  # results refused at begin_commit: their lease was no longer current
    refused: int  # claims refused: held by another, committing or done
    heartbeats: int  # heartbeat writes
    completed: int
    abandoned: int
    adopted: int  # a dead predecessor's leases this master took, as its successor
    corrupt_lines: int  # log lines skipped
    lock_waits: int
    lock_wait_seconds: float
    writes: int  # appends to the table's logs
    changes: int  # records written (claims, heartbeats, fences, completions, releases)


class WorkLeases:
    """This master's leases in `table`; tokens are handed out and taken back as plain strings."""

    def __init__(self, table: FencedWorkLeaseTable):
        self._table = table
        self._clock = table.clock
        self.heartbeat_interval = min(table.ttl / 3.0, LONGEST_HEARTBEAT_INTERVAL)
        self._last_beat: dict[str, float] = {}  # token of a `leased` record -> last extension
        self._next_beats = float("-inf")  # no lease is due before
        self._next_recovery = float("-inf")
        self._expiries = 0
        self._stale_results = 0

    def claim(self, digests: Iterable[str], *, origin: Origin = "generated") -> dict[str, str]:
        """Claim `digests` (each shard's lock taken once); {digest: token} of those won."""
        won = self._table.claim_many(digests, origin=origin)
        return self._held({digest: lease.token for digest, lease in won.items()})

    def heartbeat(self, tokens: Mapping[str, str]) -> list[str]:
        """Extend the leases in `tokens` ({digest: token}) that are due, in one round per
        shard; the digests lost.

        Only tokens this object handed out and that are still `leased` are extended; others
        are ignored. A lost lease was taken over after it expired: the master drops it from
        its queue, and a result already running for it will be refused at `begin_commit`.
        """
        now = self._clock.monotonic()
        if now < self._next_beats:
            return []
        # Looked at four times per interval: a lease is extended at most 1.25 intervals apart.
        self._next_beats = now + self.heartbeat_interval / 4
        due = {digest: token for digest, token in tokens.items()
               if (last := self._last_beat.get(token)) is not None
               and now - last >= self.heartbeat_interval}
        if not due:
            return []
        extended = self._table.heartbeat_many(due)
        lost = []
        for digest, token in due.items():
            if digest in extended:
                self._last_beat[token] = now
            else:
                del self._last_beat[token]
                self._expiries += 1
                lost.append(digest)
        return lost

    def fence(self, tokens: Mapping[str, str], claims: Iterable[str] = ()
              ) -> tuple[frozenset[str], dict[str, str]]:
        """The fence before any side effect of the results of `tokens` ({digest: token}),
        with the claims of `claims` in the same write: (the digests now committing, {digest:
        token} claimed). A digest not committing is a stale result (counted)."""
        for token in tokens.values():
            self._last_beat.pop(token, None)  # committing never expires: no more heartbeats
        fenced = self._table.fence(tokens, claims=claims)
        self._stale_results += len(tokens) - len(fenced.committing & tokens.keys())
        return fenced.committing, self._held({d: lease.token
                                               for d, lease in fenced.claimed.items()})

    def complete(self, digest: str, token: str) -> bool:
        """committing → done (written with the next write); False if the token is stale."""
        return self._table.complete(digest, token)

    def abandon(self, digest: str, token: str) -> bool:
        """Give up a lease before commit (its corpus file is missing, or its master withdraws
        from the work); False if already lost."""
        self._last_beat.pop(token, None)
        return self._table.abandon(digest, token)

    def adopt(self, done: Callable[[str], bool]) -> dict[str, str]:
        """A successor takes its dead predecessor's leases (FencedWorkLeaseTable.adopt);
        {digest: token} taken."""
        return self._held({lease.digest: lease.token for lease in self._table.adopt(done)})

    def read(self, digest: str) -> WorkLease | None:
        """The digest's record as the table says now."""
        return self._table.read(digest)

    def release(self, owner: str, done: Callable[[str], bool]) -> int:
        """Give up the leases of `owner`, a master whose group died whole
        (FencedWorkLeaseTable.release); how many."""
        return len(self._table.release(owner, done))

    def recover_expired(self, limit: int, *, rescan: bool = False) -> dict[str, str]:
        """Take over up to `limit` expired leases of any master; {digest: token} won.

        Runs a scan at most once per `heartbeat_interval`, unless `rescan` (F320 §2.5: the
        rescan at PREPARE) or the previous scan stopped at its limit; otherwise returns {}.
        """
        now = self._clock.monotonic()
        if limit <= 0 or (now < self._next_recovery and not rescan):
            return {}
        won = self._table.recover_expired(limit=limit)
        # A scan cut short by its limit may have left expired leases behind: no pause then.
        full = len(won) >= limit
        self._next_recovery = float("-inf") if full else now + self.heartbeat_interval
        return self._held({lease.digest: lease.token for lease in won})

    def flush(self) -> None:
        """Write the completions kept for their shards' next writes."""
        self._table.flush()

    def close(self) -> None:
        self._table.close()

    def statistics(self) -> LeaseFigures:
        table = self._table.statistics()
        return LeaseFigures(
            claims=table.claims, steals=table.taken_over, expiries=self._expiries,
            stale_results=self._stale_results, refused=table.refused,
            heartbeats=table.heartbeats, completed=table.completed, abandoned=table.abandoned,
            adopted=table.adopted, corrupt_lines=table.corrupt_lines,
            lock_waits=table.lock_waits, lock_wait_seconds=table.lock_wait_seconds,
            writes=table.writes, changes=table.changes)

    def _held(self, tokens: dict[str, str]) -> dict[str, str]:
        now = self._clock.monotonic()
        for token in tokens.values():
            self._last_beat[token] = now
        return tokens
