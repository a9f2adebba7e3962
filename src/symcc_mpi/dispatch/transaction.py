"""One dispatch's reservations and their compensations, undone in reverse order (F313 §3.1).

Between "pick a work" and "the WORK send returned" the master changes several unrelated
states: leases, a journal, scheduling components, the transfer cache. A transaction records,
in acquisition order, one `Compensation` per reservation, each with two meanings (F313 §3.1):

- `before_send`: the WORK never reached an executor, so undo *exactly*: the reservation
  leaves no trace, not even a counted attempt (F313 D3);
- `after_send`: the executor may have run but its result cannot be trusted (stale fence,
  lost result, watchdog timeout), so *discard*: keep the real attempt counts, learn nothing
  (F313 D4).

Which meaning applies is a fact, not a choice: it is `after_send` once `mark_dispatched()`
recorded a returned send, `before_send` otherwise. An ambiguous send (one that raised; MPI
cannot prove the peer saw nothing) is rolled back as `before_send`: if the worker did get the
WORK, its RESULT can no longer pass the fence, so the cost is a wasted execution, never a
wrong commit (F313 §4).

Rollback isolates failures: one compensation raising is recorded by resource name and the
others still run (F313 §3.1: an unwritable shared directory must not keep the in-process
target registry or a pending token from being released). `commit()` drops the stack once
the dispatch is fully committed (D6); a second rollback, or a rollback after commit, is a
no-op, so `finally` paths may call it blindly.

`mark_dispatched()` also stamps the master's monotonic send time: the watchdog deadline
counts from there and only while the transaction is ACTIVE (F317 §4.1, W1/W2).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass

from symcc_mpi.durable.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger("symcc_mpi.dispatch")

Undo = Callable[[], object]
"""A compensation step; its return value is ignored, an exception is recorded."""


class DispatchError(Exception):
    """Base of the dispatch package's errors."""


class TransactionClosed(DispatchError):
    """The transaction was already committed or rolled back."""


class SendPhase(enum.Enum):
    BEFORE_SEND = "before-send"  # exact undo: the work never reached an executor (F313 D3)
    AFTER_SEND = "after-send"  # discard: it may have run; keep counts, learn nothing (D4)


class TransactionState(enum.Enum):
    PREPARING = "preparing"  # reserving, building the message (F313 §2)
    ACTIVE = "active"  # send returned; waiting for the RESULT
    COMMITTING = "committing"  # fence accepted (begin_commit), triage under way
    COMMITTED = "committed"  # compensations dropped (D6)
    ROLLED_BACK = "rolled-back"


CLOSED = frozenset({TransactionState.COMMITTED, TransactionState.ROLLED_BACK})


@dataclass(frozen=True)
class Compensation:
    resource: str
    before_send: Undo
    after_send: Undo

    def step(self, phase: SendPhase) -> Undo:
        return self.before_send if phase is SendPhase.BEFORE_SEND else self.after_send


@dataclass(frozen=True)
class CompensationFailure:
    resource: str
    phase: SendPhase
    error: str


@dataclass(frozen=True)
class RollbackReport:
    """What one rollback did. `phase` is None when it was a no-op (already closed)."""

    worker: int
    token: str
    work_id: str
    phase: SendPhase | None
    compensated: tuple[str, ...] = ()  # resource names whose compensation returned
    failures: tuple[CompensationFailure, ...] = ()

    @property
    def noop(self) -> bool:
        return self.phase is None

    @property
    def ok(self) -> bool:
        return not self.failures


class DispatchTransaction:
    """F313 `_DispatchReservationTransaction`: one dispatch of `work_id` to `worker`."""

    def __init__(self, worker: int, work_id: str, token: str, *, clock: Clock = SYSTEM_CLOCK):
        self.worker = worker
        self.work_id = work_id  # the stable semantic identity (SHA-256 of the input, F317 W5)
        self.token = token  # the transport token of this dispatch only (F315)
        self._clock = clock
        self._stack: list[Compensation] = []
        self._state = TransactionState.PREPARING
        self._dispatched_at: float | None = None

    def __repr__(self) -> str:
        return (f"DispatchTransaction(worker={self.worker}, token={self.token[:12]}, "
                f"work={self.work_id[:12]}, state={self._state.value})")

    # -- reading

    @property
    def state(self) -> TransactionState:
        return self._state

    @property
    def closed(self) -> bool:
        return self._state in CLOSED

    def deadline(self, timeout: float) -> float | None:
        if self._dispatched_at is None or not timeout > 0:
            return None
        return self._dispatched_at + timeout

    def expired(self, now: float, timeout: float) -> bool:
        """F317 §4.1/W1: only a dispatched, still ACTIVE transaction can time out; PREPARING and
        COMMITTING never do, and 0 disables. The boundary itself counts as expired."""
        deadline = self.deadline(timeout)
        return self._state is TransactionState.ACTIVE and deadline is not None and now >= deadline

    # -- transitions

    def register(self, resource: str, *, before_send: Undo, after_send: Undo) -> None:
        """Record the compensation of a reservation just made (F313 D2)."""
        if self.closed:
            raise TransactionClosed(f"{self!r}: cannot register {resource!r}")
        self._stack.append(Compensation(str(resource), before_send, after_send))

    def mark_dispatched(self) -> float:
        """The WORK send returned: PREPARING → ACTIVE, deadline starts now (F317 W1/W2)."""
        if self._state is not TransactionState.PREPARING:
            raise TransactionClosed(f"{self!r}: mark_dispatched outside PREPARING")
        self._dispatched_at = self._clock.monotonic()
        self._state = TransactionState.ACTIVE
        return self._dispatched_at

    def begin_commit(self) -> None:
        """The fence was accepted: ACTIVE → COMMITTING (F313 D5; the tables call this)."""
        if self._state is not TransactionState.ACTIVE:
            raise TransactionClosed(f"{self!r}: begin_commit outside ACTIVE")
        self._state = TransactionState.COMMITTING

    def commit(self) -> None:
        """Triage, completion and releases all went through: drop the compensations (D6)."""
        if self.closed:
            raise TransactionClosed(f"{self!r}: commit after close")
        self._stack.clear()
        self._state = TransactionState.COMMITTED

    def rollback(self) -> RollbackReport:
        """Run every compensation in reverse order, for the phase the facts say (§3.1).

        A failing compensation is recorded by resource name and the others still run; an
        interrupt (BaseException) is re-raised only after all of them ran. Repeating a rollback,
        or rolling back a committed transaction, does nothing.
        """
        if self.closed:
            return RollbackReport(self.worker, self.token, self.work_id, None)
        phase = SendPhase.BEFORE_SEND if self._dispatched_at is None else SendPhase.AFTER_SEND
        stack, self._stack = self._stack, []
        # Closed before any step runs: a compensation that re-enters rollback finds a no-op.
        self._state = TransactionState.ROLLED_BACK
        compensated: list[str] = []
        failures: list[CompensationFailure] = []
        interrupt: BaseException | None = None
        for compensation in reversed(stack):
            try:
                compensation.step(phase)()
            except BaseException as error:  # noqa: BLE001 - isolate every step (F313 §3.1)
                failures.append(CompensationFailure(compensation.resource, phase, repr(error)))
                log.warning("dispatch rollback rank=%d token=%s work=%s resource=%s phase=%s "
                            "failed: %r", self.worker, self.token[:12], self.work_id[:12],
                            compensation.resource, phase.value, error)
                if not isinstance(error, Exception) and interrupt is None:
                    interrupt = error
            else:
                compensated.append(compensation.resource)
        if interrupt is not None:
            raise interrupt
        return RollbackReport(self.worker, self.token, self.work_id, phase,
                              tuple(compensated), tuple(failures))
