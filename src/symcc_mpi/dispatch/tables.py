"""The preparing/active/committing tables and the exception boundary that sweeps them (F313 §3.2).

A dispatch moves through three master-side tables, and a worker sits in at most one (F313 D1):

    preparing --sent()--> active --begin_commit() accepted--> committing --finish()--> gone
        |                   |                                     |
        +- before-send -----+---- after-send rollback (fenced, stale, timeout, sweep) ------+

The tables never pop a transaction before the step that may raise: `begin_commit` keeps the
transaction in `active` while the fence (a shared-storage call) runs and moves it to
`committing` only once the fence said yes (F313 D5), so an EIO inside the fence still finds
the whole compensation stack in a table. `finish` drops the stack only at the very end (D6).

`boundary(worker)` is the one exception boundary around a dispatch path (F313 D8): whatever
raises inside it — a reservation, message building, the send, the fence, triage — the worker
is removed from all three tables and every distinct transaction found is rolled back, even if
a future regression put the worker in two tables at once (D1 broken); transactions are
deduplicated by identity so none is compensated twice.

The optional `gate` is consulted by `begin`: the dispatch entry itself refuses a parked rank
(F317 §4.3, W6), so no code path can hand work to it.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from symcc_mpi.dispatch.transaction import (
    DispatchError,
    DispatchTransaction,
    RollbackReport,
    SendPhase,
)
from symcc_mpi.durable.clock import SYSTEM_CLOCK, Clock


class Table(enum.Enum):
    PREPARING = "preparing"
    ACTIVE = "active"
    COMMITTING = "committing"


class CommitStart(enum.Enum):
    COMMITTING = "committing"  # fence accepted; the transaction moved active → committing (D5)
    FENCED = "fenced"  # fence refused (lease taken over): rolled back after-send (D4)
    NOT_ACTIVE = "not-active"  # no active dispatch with that exact (worker, token): stale


class ResultClass(enum.Enum):
    CURRENT = "current"  # the exact token of the worker's active dispatch
    STALE = "stale"  # anything else: unowned, late, foreign (F315; F317 W8)


class WorkerBusy(DispatchError):
    """`begin` for a worker that already holds a transaction (F313 D1)."""


class ParkedWorker(DispatchError):
    """`begin` for a rank the watchdog parked (F317 W6)."""


class NoSuchDispatch(DispatchError):
    """No transaction with that exact (worker, token) in the expected table."""


class DispatchGate(Protocol):
    def may_dispatch(self, worker: int) -> bool: ...


@dataclass(frozen=True)
class SweepReport:
    """What the exception boundary found and compensated for one worker."""

    worker: int
    found_in: tuple[Table, ...]  # every table that held the worker (more than one: D1 broken)
    rollbacks: tuple[RollbackReport, ...]  # one per distinct transaction


@dataclass(frozen=True)
class TablesStatistics:
    preparing: int
    active: int
    committing: int
    begun: int
    sent: int
    committed: int
    rolled_back_before_send: int
    rolled_back_after_send: int
    fenced: int
    sweeps: int
    d1_violations: int  # sweeps that found one worker in several tables
    compensation_failures: int
    failures_by_resource: tuple[tuple[str, int], ...]  # sorted (resource, count)


class DispatchTables:
    def __init__(self, *, clock: Clock = SYSTEM_CLOCK, gate: DispatchGate | None = None):
        self.clock = clock
        self.gate = gate
        self._tables: dict[Table, dict[int, DispatchTransaction]] = {t: {} for t in Table}
        self._counts: Counter[str] = Counter()
        self._failures_by_resource: Counter[str] = Counter()

    # -- reading

    def find(self, worker: int) -> tuple[Table, DispatchTransaction] | None:
        """The table holding `worker` and its transaction (the first, if D1 were broken)."""
        for table in Table:
            tx = self._tables[table].get(worker)
            if tx is not None:
                return table, tx
        return None

    def get(self, table: Table, worker: int) -> DispatchTransaction | None:
        return self._tables[table].get(worker)

    def holds(self, worker: int) -> bool:
        return any(worker in self._tables[t] for t in Table)

    def workers(self, table: Table) -> frozenset[int]:
        return frozenset(self._tables[table])

    def __len__(self) -> int:
        """Transactions in every table."""
        return sum(map(len, self._tables.values()))

    def transactions(self) -> Iterator[tuple[Table, DispatchTransaction]]:
        for table in Table:
            for tx in list(self._tables[table].values()):
                yield table, tx

    def classify(self, worker: int, token: str) -> ResultClass:
        """F315/W8: a RESULT is current only for the exact token of the worker's ACTIVE dispatch."""
        tx = self._tables[Table.ACTIVE].get(worker)
        return ResultClass.CURRENT if tx is not None and tx.token == token else ResultClass.STALE

    def expired(self, now: float, timeout: float) -> tuple[tuple[int, str], ...]:
        """F317 §4.2: a deterministic snapshot of (rank, exact token) past their deadline.

        Only the active table is looked at (W1); the snapshot is sorted by rank so a sweep
        does not depend on dict order and may mutate the tables while walking it.
        """
        if not timeout > 0:
            return ()
        return tuple(sorted((w, tx.token) for w, tx in self._tables[Table.ACTIVE].items()
                            if tx.expired(now, timeout)))

    def statistics(self) -> TablesStatistics:
        c = self._counts
        return TablesStatistics(
            preparing=len(self._tables[Table.PREPARING]), active=len(self._tables[Table.ACTIVE]),
            committing=len(self._tables[Table.COMMITTING]), begun=c["begun"], sent=c["sent"],
            committed=c["committed"], rolled_back_before_send=c["rolled_back_before_send"],
            rolled_back_after_send=c["rolled_back_after_send"], fenced=c["fenced"],
            sweeps=c["sweeps"], d1_violations=c["d1_violations"],
            compensation_failures=sum(self._failures_by_resource.values()),
            failures_by_resource=tuple(sorted(self._failures_by_resource.items())))

    # -- transitions

    def begin(self, worker: int, work_id: str, token: str) -> DispatchTransaction:
        """Open a transaction in `preparing` (the dispatch entry)."""
        if self.gate is not None and not self.gate.may_dispatch(worker):
            raise ParkedWorker(f"rank {worker} is parked: no dispatch until its exact READY")
        if self.holds(worker):
            raise WorkerBusy(f"rank {worker} already holds a dispatch (F313 D1)")
        tx = DispatchTransaction(worker, work_id, token, clock=self.clock)
        self._tables[Table.PREPARING][worker] = tx
        self._counts["begun"] += 1
        return tx

    def sent(self, worker: int, token: str) -> DispatchTransaction:
        """The WORK send returned: stamp the send time and move preparing → active."""
        tx = self._exact(Table.PREPARING, worker, token)
        tx.mark_dispatched()
        # Both dict operations are infallible: the transaction is never in no table.
        self._tables[Table.ACTIVE][worker] = tx
        del self._tables[Table.PREPARING][worker]
        self._counts["sent"] += 1
        return tx

    def begin_commit(self, worker: int, token: str, fence: Callable[[], bool]) -> CommitStart:
        """Run the fence (shared `begin_commit`) with the transaction still in `active`.

        True: active → committing. False: the work was taken over, so discard after-send and
        drop it (F313 D4). If the fence raises, the transaction stays in `active` for the
        exception boundary to compensate (F313 D5).
        """
        tx = self._tables[Table.ACTIVE].get(worker)
        if tx is None or tx.token != token:
            return CommitStart.NOT_ACTIVE
        if not fence():
            self._counts["fenced"] += 1
            self._close(tx, Table.ACTIVE)
            return CommitStart.FENCED
        tx.begin_commit()
        self._tables[Table.COMMITTING][worker] = tx
        del self._tables[Table.ACTIVE][worker]
        return CommitStart.COMMITTING

    def finish(self, worker: int, token: str) -> DispatchTransaction:
        """Triage, completion and releases are done: drop the compensations (F313 D6)."""
        tx = self._exact(Table.COMMITTING, worker, token)
        tx.commit()
        del self._tables[Table.COMMITTING][worker]
        self._counts["committed"] += 1
        return tx

    def abort(self, worker: int, token: str) -> RollbackReport | None:
        """Roll back the exact (worker, token) dispatch wherever it sits (F317 W4); None if
        there is no such dispatch (already gone: the caller's event is stale)."""
        for table in Table:
            tx = self._tables[table].get(worker)
            if tx is not None and tx.token == token:
                return self._close(tx, table)
        return None

    def sweep(self, worker: int) -> SweepReport:
        """F313 D8: remove `worker` from all three tables and compensate every distinct
        transaction found, conservatively, even if D1 was broken."""
        found: list[Table] = []
        distinct: dict[int, DispatchTransaction] = {}
        for table in Table:
            tx = self._tables[table].pop(worker, None)
            if tx is not None:
                found.append(table)
                distinct.setdefault(id(tx), tx)
        # Other workers' entries pointing at one of these objects would be a second D1 break;
        # drop them too, so no table keeps a transaction that is already rolled back.
        for table in Table:
            for other, tx in list(self._tables[table].items()):
                if id(tx) in distinct:
                    found.append(table)
                    del self._tables[table][other]
        self._counts["sweeps"] += 1
        if len(found) > 1:
            self._counts["d1_violations"] += 1
        reports = tuple(self._record(tx.rollback()) for tx in distinct.values())
        return SweepReport(worker, tuple(found), reports)

    def sweep_all(self) -> tuple[SweepReport, ...]:
        """Shutdown compensation (F313 §2 diagram): sweep every worker still holding a
        transaction, so its leases go back for --resume or another coordinator. Safe to call
        twice: the second call finds nothing."""
        workers = sorted({w for table in Table for w in self._tables[table]})
        return tuple(self.sweep(worker) for worker in workers)

    @contextmanager
    def boundary(self, worker: int) -> Iterator[None]:
        """F313 D8: on any exception inside, sweep `worker`'s transactions, then re-raise."""
        try:
            yield
        except BaseException:
            self.sweep(worker)
            raise

    # -- machinery

    def _exact(self, table: Table, worker: int, token: str) -> DispatchTransaction:
        tx = self._tables[table].get(worker)
        if tx is None or tx.token != token:
            raise NoSuchDispatch(f"no {table.value} dispatch to rank {worker} with token "
                                 f"{token[:12]}")
        return tx

    def _close(self, tx: DispatchTransaction, table: Table) -> RollbackReport:
        del self._tables[table][tx.worker]
        return self._record(tx.rollback())

    def _record(self, report: RollbackReport) -> RollbackReport:
        if report.phase is SendPhase.BEFORE_SEND:
            self._counts["rolled_back_before_send"] += 1
        elif report.phase is SendPhase.AFTER_SEND:
            self._counts["rolled_back_after_send"] += 1
        for failure in report.failures:
            self._failures_by_resource[failure.resource] += 1
        return report
