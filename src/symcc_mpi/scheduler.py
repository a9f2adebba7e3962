"""The master's dispatch state machine: frontier, workers, per-dispatch tokens; no I/O.

Work identity is the SHA-256 of an input's bytes: an input enters the frontier once,
however often it is generated, and is analysed once. Each dispatch gets a fresh token
(F315) that the worker echoes in its RESULT and in its next READY; a RESULT whose token is
not the rank's current one is stale or foreign and is dropped. A READY that echoes the
current token of a dispatch whose RESULT never arrived joins the two (F316): the work did
not finish, so it is requeued by its input hash, not lost.
"""

from __future__ import annotations

import enum
import secrets
from collections import Counter, deque
from dataclasses import dataclass, field

from .protocol import Result


class Verdict(enum.Enum):
    ACCEPT = "accept"
    STALE = "stale"  # no dispatch with that token is active on that rank
    HASH_MISMATCH = "hash-mismatch"  # the worker ran other bytes than it was sent


@dataclass(frozen=True)
class Dispatch:
    rank: int
    token: str
    input_hash: str


@dataclass
class SchedulerStats:
    dispatched: int = 0
    accepted: int = 0
    stale_results: int = 0
    invalid_results: int = 0
    requeued: int = 0
    deferred: int = 0
    ready_without_result: int = 0


@dataclass
class Scheduler:
    max_attempts: int = 3
    frontier: deque[str] = field(default_factory=deque)
    known: set[str] = field(default_factory=set)
    done: set[str] = field(default_factory=set)
    deferred: list[str] = field(default_factory=list)
    active: dict[int, Dispatch] = field(default_factory=dict)
    idle: deque[int] = field(default_factory=deque)
    retired: set[int] = field(default_factory=set)  # ranks that will get no more work
    attempts: Counter[str] = field(default_factory=Counter)
    stats: SchedulerStats = field(default_factory=SchedulerStats)

    def add_input(self, digest: str, *, done: bool = False) -> bool:
        """Make an input known; it joins the frontier unless already known or done."""
        if digest in self.known:
            return False
        self.known.add(digest)
        if done:
            self.done.add(digest)
        else:
            self.frontier.append(digest)
        return True

    def worker_ready(self, rank: int, token: str | None) -> Dispatch | None:
        """The rank wants work. Returns the dispatch whose RESULT it never delivered, if any."""
        if rank in self.retired:
            return None
        lost = self.active.pop(rank, None)
        if lost is not None:
            # The worker asks for work while we still wait for its RESULT: that RESULT was
            # lost or malformed. The input was not analysed; give it to someone again.
            self.stats.ready_without_result += 1
            self._requeue(lost.input_hash)
        if rank not in self.idle:
            self.idle.append(rank)
        return lost

    def next_dispatches(self) -> list[Dispatch]:
        dispatches = []
        while self.idle and self.frontier:
            rank = self.idle.popleft()
            digest = self.frontier.popleft()
            dispatch = Dispatch(rank, secrets.token_hex(16), digest)
            self.active[rank] = dispatch
            self.attempts[digest] += 1
            self.stats.dispatched += 1
            dispatches.append(dispatch)
        return dispatches

    def send_failed(self, dispatch: Dispatch) -> None:
        """The WORK never left: undo exactly, the attempt does not count."""
        if self.active.get(dispatch.rank) == dispatch:
            del self.active[dispatch.rank]
        self.attempts[dispatch.input_hash] -= 1
        self.stats.dispatched -= 1
        self.frontier.appendleft(dispatch.input_hash)

    def judge_result(self, rank: int, result: Result) -> Verdict:
        current = self.active.get(rank)
        if current is None or current.token != result.token:
            self.stats.stale_results += 1
            return Verdict.STALE
        del self.active[rank]
        if result.input_hash != current.input_hash:
            self.stats.invalid_results += 1
            self._requeue(current.input_hash)
            return Verdict.HASH_MISMATCH
        self.stats.accepted += 1
        return Verdict.ACCEPT

    def result_failed(self, digest: str) -> None:
        """An accepted RESULT could not be committed (bad staging): requeue its input."""
        self.stats.invalid_results += 1
        self._requeue(digest)

    def is_active_token(self, token: str) -> bool:
        return any(d.token == token for d in self.active.values())

    def mark_done(self, digest: str) -> None:
        self.done.add(digest)

    def retire(self, rank: int) -> None:
        """The rank is gone or unusable: no more work to it, its work back to the frontier."""
        self.retired.add(rank)
        if rank in self.idle:
            self.idle.remove(rank)
        current = self.active.pop(rank, None)
        if current is not None:
            self._requeue(current.input_hash)

    def _requeue(self, digest: str) -> None:
        if self.attempts[digest] >= self.max_attempts:
            self.deferred.append(digest)
            self.stats.deferred += 1
        else:
            self.frontier.appendleft(digest)
            self.stats.requeued += 1

    @property
    def exhausted(self) -> bool:
        return not self.frontier and not self.active
