"""Dispatch watchdog: deadlines, parked ranks, exact-token READY recovery, retry/defer (F317).

A worker that hangs before sending any RESULT or READY never triggers the F316 READY/RESULT
join, so its transaction, leases and assignments would be held forever. F317 separates two
recoveries:

- the *work* is recovered on a timeout: the exact (rank, token) dispatch is rolled back
  through its after-send compensations (F313 D4; F317 W4) and the semantic work — its stable
  work id, never the transport token (W5) — is requeued, or deferred to the journal once it
  failed more than `SYMCC_DISPATCH_PROTOCOL_RETRIES` times (§4.2);
- the *rank* is not: a timeout is a suspicion, not a proof of death (Aguilera/Chen/Toueg).
  The rank may still be running the old dispatch, so it is parked (W6): no WORK goes to it
  until a READY carrying exactly the retired token proves its old execution loop ended (W7).
  Its late RESULT for that token finds no active dispatch and is stale (W8). A rank that
  really died stays parked for good (W10).

The master round order matters (§4.2, W3): READY → dispatch → drain RESULT → invalid-result
join → deadline sweep. A current RESULT seen this round is committed before the sweep; a
current READY seen this round means the worker finished, so the join (not the clock) decides
that dispatch's fate, and the sweep leaves it alone.

Deadlines use the master's monotonic clock only (W2): never persisted, never compared across
processes or reboots. `SYMCC_DISPATCH_WATCHDOG_SEC` defaults to max(120, 4 × execution
timeout), lies in [0, 86400], and 0 disables the watchdog (§4.1); NaN, ±Infinity and garbage
fall back to the default, negatives become 0, larger values 86400. The default is a
conservative starting point, not a fitted optimum.
"""

from __future__ import annotations

import enum
import logging
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from symcc_mpi.config import protocol_retries, watchdog_seconds
from symcc_mpi.dispatch.tables import DispatchTables, ResultClass, Table
from symcc_mpi.dispatch.transaction import RollbackReport
from symcc_mpi.durable.clock import Clock

log = logging.getLogger("symcc_mpi.dispatch")

MIN_DEFAULT_SECONDS = 120.0
TIMEOUT_FACTOR = 4.0
MAX_SECONDS = 86400.0
DEFAULT_PROTOCOL_RETRIES = 1  # F317 §5.3: the first failure requeues, the second defers


# == configuration ==========================================================================


def default_watchdog_seconds(execution_timeout: float) -> float:
    """max(120, 4 × timeout), within [120, 86400] (F317 §4.1)."""
    timeout = float(execution_timeout)
    if not math.isfinite(timeout) or timeout < 0:
        timeout = 0.0
    return min(MAX_SECONDS, max(MIN_DEFAULT_SECONDS, TIMEOUT_FACTOR * timeout))


@dataclass(frozen=True)
class WatchdogConfig:
    seconds: float  # 0: disabled
    protocol_retries: int
    notes: tuple[str, ...] = ()  # what was ignored or adjusted, for the master to log (W9)

    @property
    def enabled(self) -> bool:
        return self.seconds > 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *,
                 execution_timeout: float) -> WatchdogConfig:
        seconds, note_s = watchdog_seconds(env,
                                           default=default_watchdog_seconds(execution_timeout),
                                           cap=MAX_SECONDS)
        retries, note_r = protocol_retries(env, default=DEFAULT_PROTOCOL_RETRIES)
        return cls(seconds, retries, tuple(n for n in (note_s, note_r) if n))


# == park gate (F317 §4.3) ==================================================================


class GateVerdict(enum.Enum):
    NOT_PARKED = "not-parked"
    RECOVERED = "recovered"  # the exact retired token: unparked
    MISSING = "watchdog-missing"  # READY without a token: still parked
    MALFORMED = "watchdog-malformed"  # undecodable READY: still parked
    STALE = "watchdog-stale"  # a valid token other than the retired one: still parked


@dataclass(frozen=True)
class GateStatistics:
    parked: int
    parks: int
    recoveries: int
    ready_missing: int
    ready_malformed: int
    ready_stale: int


class RetiredDispatchGate:
    """F317 `_RetiredDispatchGate`: parked[rank] = retired token; only that READY unparks."""

    def __init__(self) -> None:
        self._parked: dict[int, str] = {}
        self._counts: Counter[str] = Counter()

    def clear(self) -> None:
        """A new communicator generation: its ranks are numbered anew, none is parked."""
        self._parked.clear()

    def park(self, rank: int, token: str) -> None:
        self._parked[rank] = token
        self._counts["parks"] += 1

    def is_parked(self, rank: int) -> bool:
        return rank in self._parked

    def may_dispatch(self, rank: int) -> bool:
        return rank not in self._parked

    def parked(self) -> dict[int, str]:
        return dict(self._parked)

    def admit(self, rank: int, token: str | None, *, malformed: bool = False) -> GateVerdict:
        """A READY from `rank` (W7): unpark only on exactly its retired token."""
        retired = self._parked.get(rank)
        if retired is None:
            return GateVerdict.NOT_PARKED
        if malformed:
            verdict = GateVerdict.MALFORMED
        elif token is None:
            verdict = GateVerdict.MISSING
        elif token != retired:
            verdict = GateVerdict.STALE
        else:
            del self._parked[rank]
            self._counts["recoveries"] += 1
            return GateVerdict.RECOVERED
        self._counts[verdict.value] += 1
        return verdict

    def statistics(self) -> GateStatistics:
        c = self._counts
        return GateStatistics(len(self._parked), c["parks"], c["recoveries"],
                              c[GateVerdict.MISSING.value], c[GateVerdict.MALFORMED.value],
                              c[GateVerdict.STALE.value])


# == bounded retry / defer (F317 §4.2, shared with F316) ====================================


class RecoverySource(enum.Enum):
    INVALID_RESULT = "invalid-result"  # F316: READY without a valid RESULT, or a bad RESULT
    WATCHDOG_TIMEOUT = "watchdog-timeout"  # F317: no RESULT nor READY before the deadline
    COMMIT_FAILED = "commit-failed"  # publishing its children raised (an OSError)


class RecoveryAction(enum.Enum):
    REQUEUED = "requeued"  # back into the frontier
    DEFERRED = "deferred"  # written to the deferred-work journal
    DEFERRED_IN_MEMORY = "deferred-in-memory"  # the journal write failed: held in memory only


class DeferralSink(Protocol):
    """Where work goes after too many protocol failures (`durable.journal.DeferredWorkJournal`).

    `defer` may raise OSError, or keep the item in memory itself; either way `is_persisted`
    is the only evidence that the deferral is durable (F317 §4.2 step 3).
    """

    def defer(self, work_id: str, *, source: str, attempts: int) -> object: ...

    def is_persisted(self, work_id: str) -> bool: ...


@dataclass(frozen=True)
class RecoveryOutcome:
    work_id: str
    source: RecoverySource
    action: RecoveryAction
    failures: int  # protocol failures of this work so far, this one included


@dataclass(frozen=True)
class RecoveryStatistics:
    requeued: int  # "Protocol-requeued dispatches"
    deferred: int  # "Protocol-deferred dispatches" (durable or not)
    deferred_in_memory: int  # deferrals not yet durable, now
    deferral_write_failures: int
    by_source: tuple[tuple[str, int], ...]


class ProtocolRecovery:
    """One retry/defer path for both F316 invalid results and F317 timeouts (§4.2).

    Failures are counted per stable work id (W5), so a work cannot escape deferral by being
    dispatched under fresh tokens. The first `retries` failures requeue it (`requeue`, e.g.
    the scheduler's frontier, in front); the next one defers it to `sink`. A deferral that is
    not durable is never reported as durable: it is kept here, in memory, and written again by
    `retry_deferrals()`; the work does not go back to the frontier.
    """

    def __init__(self, *, requeue: Callable[[str], object], sink: DeferralSink | None,
                 retries: int = DEFAULT_PROTOCOL_RETRIES):
        if retries < 0:
            raise ValueError("retries must be at least 0")
        self.retries = retries
        self._requeue = requeue
        self._sink = sink
        self._failures: Counter[str] = Counter()
        self._in_memory: dict[str, tuple[RecoverySource, int]] = {}
        self._durable: set[str] = set()
        self._counts: Counter[str] = Counter()
        self._by_source: Counter[str] = Counter()

    def failures(self, work_id: str) -> int:
        return self._failures[work_id]

    def deferred(self) -> frozenset[str]:
        return frozenset(self._durable) | frozenset(self._in_memory)

    def deferred_in_memory(self) -> frozenset[str]:
        return frozenset(self._in_memory)

    def recover(self, work_id: str, source: RecoverySource) -> RecoveryOutcome:
        self._failures[work_id] += 1
        failures = self._failures[work_id]
        self._by_source[source.value] += 1
        if failures <= self.retries:
            self._requeue(work_id)
            self._counts["requeued"] += 1
            return RecoveryOutcome(work_id, source, RecoveryAction.REQUEUED, failures)
        self._counts["deferred"] += 1
        durable = self._persist(work_id, source, failures)
        action = RecoveryAction.DEFERRED if durable else RecoveryAction.DEFERRED_IN_MEMORY
        return RecoveryOutcome(work_id, source, action, failures)

    def retry_deferrals(self) -> int:
        """Write the in-memory deferrals again; return how many are still not durable."""
        for work_id, (source, failures) in list(self._in_memory.items()):
            self._persist(work_id, source, failures)
        return len(self._in_memory)

    def statistics(self) -> RecoveryStatistics:
        c = self._counts
        return RecoveryStatistics(c["requeued"], c["deferred"], len(self._in_memory),
                                  c["write_failures"], tuple(sorted(self._by_source.items())))

    def _persist(self, work_id: str, source: RecoverySource, failures: int) -> bool:
        durable = False
        if self._sink is not None:
            try:
                self._sink.defer(work_id, source=source.value, attempts=failures)
                durable = self._sink.is_persisted(work_id)
            except OSError as error:
                log.warning("deferring work %s failed, kept in memory: %s", work_id[:12], error)
        if durable:
            self._in_memory.pop(work_id, None)
            self._durable.add(work_id)
        else:
            self._counts["write_failures"] += int(self._sink is not None)
            self._in_memory[work_id] = (source, failures)
        return durable


# == the watchdog (F317 §4) =================================================================


class ReadyVerdict(enum.Enum):
    IDLE = "idle"  # holds no dispatch, not parked: may get work now
    JOIN = "join"  # echoes its ACTIVE dispatch's token: the join (round step 4) decides
    BUSY = "busy"  # still preparing or committing: idle once that transaction ends (join)
    STALE = "stale"  # a token that is not its active dispatch's: ignored
    MALFORMED = "malformed"  # undecodable READY from a rank that is not parked: ignored
    RECOVERED = "recovered"  # parked, exact retired token: unparked, may get work now (W7)
    PARKED = "parked"  # parked, any other READY: quarantined, stays parked (W7)


@dataclass(frozen=True)
class Recovery:
    rank: int
    token: str
    work_id: str
    source: RecoverySource
    action: RecoveryAction
    failures: int
    rollback: RollbackReport


@dataclass(frozen=True)
class JoinReport:
    recoveries: tuple[Recovery, ...]
    ready: tuple[int, ...]  # ranks whose READY was held back and that may now get work


@dataclass(frozen=True)
class WatchdogStatistics:
    enabled: bool
    seconds: float
    timeouts: int  # "Dispatch watchdog timeouts": exact-generation rollbacks
    worker_recoveries: int  # "Dispatch watchdog worker recoveries": exact READY unparks
    protocol_requeued: int  # both sources
    protocol_deferred: int  # both sources
    invalid_joins: int
    parked: int
    ready_missing: int
    ready_malformed: int
    ready_stale: int
    stale_results: int


class DispatchWatchdog:
    """The F316 join and the F317 sweep over `DispatchTables`, with the park gate."""

    def __init__(self, tables: DispatchTables, gate: RetiredDispatchGate,
                 recovery: ProtocolRecovery, *, seconds: float, clock: Clock | None = None):
        if tables.gate is not gate:
            raise ValueError("the tables must consult this gate at dispatch (F317 W6)")
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"watchdog seconds must be finite and >= 0 (got {seconds})")
        self.tables = tables
        self.gate = gate
        self.recovery = recovery
        self.seconds = seconds
        self.clock = tables.clock if clock is None else clock
        self._ready_seen: dict[int, str] = {}  # rank → token of a held-back READY
        self._invalid: dict[int, str] = {}  # rank → current token of a bad RESULT
        self._counts: Counter[str] = Counter()

    def forget_ranks(self) -> None:
        """A new communicator generation: what was held back per rank is of the old one."""
        self._ready_seen.clear()
        self._invalid.clear()
        self.gate.clear()

    # -- round step 1

    def on_ready(self, rank: int, token: str | None, *, malformed: bool = False) -> ReadyVerdict:
        if self.gate.is_parked(rank):
            verdict = self.gate.admit(rank, token, malformed=malformed)
            if verdict is GateVerdict.RECOVERED:
                log.info("dispatch watchdog: rank %d recovered by its exact READY %s", rank,
                         (token or "")[:12])
                return ReadyVerdict.RECOVERED
            log.warning("dispatch watchdog: parked rank %d READY quarantined reason=%s", rank,
                        verdict.value)
            return ReadyVerdict.PARKED
        if malformed:
            return ReadyVerdict.MALFORMED
        found = self.tables.find(rank)
        if found is None:
            return ReadyVerdict.IDLE
        table, tx = found
        if token != tx.token:
            # A READY must echo the dispatch it finished; another token is old or foreign.
            return ReadyVerdict.STALE if table is Table.ACTIVE else ReadyVerdict.BUSY
        self._ready_seen[rank] = token
        return ReadyVerdict.JOIN if table is Table.ACTIVE else ReadyVerdict.BUSY

    # -- round step 3

    def on_result(self, rank: int, token: str) -> ResultClass:
        """Classify a RESULT (F315, W8); a current one goes on to `tables.begin_commit`."""
        verdict = self.tables.classify(rank, token)
        if verdict is ResultClass.STALE:
            self._counts["stale_results"] += 1
        return verdict

    def note_invalid_result(self, rank: int, token: str) -> bool:
        """A RESULT with the current token that cannot be used (wrong hash, not analysed):
        its dispatch is recovered at the join. False if the token is not current."""
        if self.tables.classify(rank, token) is not ResultClass.CURRENT:
            return False
        self._invalid[rank] = token
        return True

    # -- round step 4

    def join(self) -> JoinReport:
        """F316: recover the ACTIVE dispatches whose RESULT was bad, or missing while their
        READY arrived; hand back the ranks whose held-back READY may now take work."""
        recoveries: list[Recovery] = []
        for rank, token in sorted(self._invalid.items()):
            recovery = self._recover(rank, token, RecoverySource.INVALID_RESULT)
            if recovery is not None:
                recoveries.append(recovery)
        self._invalid.clear()
        ready: list[int] = []
        for rank, token in sorted(self._ready_seen.items()):
            found = self.tables.find(rank)
            if found is not None and found[1].token == token and found[0] is Table.ACTIVE:
                recovery = self._recover(rank, token, RecoverySource.INVALID_RESULT)
                if recovery is not None:
                    recoveries.append(recovery)
                found = self.tables.find(rank)
            if found is None or found[1].token != token:
                # Its dispatch ended (committed, rolled back, joined): the READY stands.
                del self._ready_seen[rank]
                if not self.gate.is_parked(rank):
                    ready.append(rank)
        return JoinReport(tuple(recoveries), tuple(ready))

    # -- round step 5

    def sweep(self) -> tuple[Recovery, ...]:
        """F317 §4.2: roll back every ACTIVE dispatch past its deadline, park its rank."""
        if not self.seconds > 0:
            return ()
        recoveries: list[Recovery] = []
        for rank, token in self.tables.expired(self.clock.monotonic(), self.seconds):
            if self._ready_seen.get(rank) == token:
                continue  # W3: its READY was seen; the join decides, not the clock
            if self.tables.classify(rank, token) is not ResultClass.CURRENT:
                continue
            self.gate.park(rank, token)  # W6: before the rollback and requeue, which may raise
            recovery = self._recover(rank, token, RecoverySource.WATCHDOG_TIMEOUT)
            assert recovery is not None
            self._counts["timeouts"] += 1
            recoveries.append(recovery)
        return tuple(recoveries)

    def statistics(self) -> WatchdogStatistics:
        gate = self.gate.statistics()
        recovery = self.recovery.statistics()
        return WatchdogStatistics(
            enabled=self.seconds > 0, seconds=self.seconds, timeouts=self._counts["timeouts"],
            worker_recoveries=gate.recoveries, protocol_requeued=recovery.requeued,
            protocol_deferred=recovery.deferred, invalid_joins=self._counts["invalid_joins"],
            parked=gate.parked, ready_missing=gate.ready_missing,
            ready_malformed=gate.ready_malformed, ready_stale=gate.ready_stale,
            stale_results=self._counts["stale_results"])

    # -- machinery

    def _recover(self, rank: int, token: str, source: RecoverySource) -> Recovery | None:
        found = self.tables.find(rank)
        if found is None or found[0] is not Table.ACTIVE or found[1].token != token:
            return None
        work_id = found[1].work_id
        rollback = self.tables.abort(rank, token)  # after-send compensations (F313 D4, W4)
        assert rollback is not None
        if source is RecoverySource.INVALID_RESULT:
            self._counts["invalid_joins"] += 1
        outcome = self.recovery.recover(work_id, source)
        log.warning("dispatch recovery source=%s rank=%d token=%s work=%s action=%s failures=%d "
                    "compensation_failures=%d", source.value, rank, token[:12], work_id[:12],
                    outcome.action.value, outcome.failures, len(rollback.failures),
                    extra={"source": source.value, "rank": rank, "work_id": work_id,
                           "action": outcome.action.value})
        return Recovery(rank, token, work_id, source, outcome.action, outcome.failures, rollback)
