"""F313: compensating dispatch transactions, the three tables and the object cache.

The cases of F313 §5 are marked `# F313 §5.N`. The tables are driven with two in-memory
reservations: a work lease with exact tokens whose `committing` record cannot be abandoned
(F321), standing for a shared-storage fence, and a ledger of plain reservations, like the
frontier entry the coordinator registers, that records which phase undid each one.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass

import pytest

from symcc_mpi.dispatch.objects import ObjectMismatch, ObjectTransferCache
from symcc_mpi.dispatch.tables import (
    CommitStart,
    DispatchTables,
    NoSuchDispatch,
    ResultClass,
    Table,
    WorkerBusy,
)
from symcc_mpi.dispatch.transaction import (
    DispatchTransaction,
    SendPhase,
    TransactionClosed,
    TransactionState,
)
from symcc_mpi.durable.clock import ManualClock

SHARED_WORK = "shared-work"


def wid(i: int) -> str:
    return hashlib.sha256(f"input-{i}".encode()).hexdigest()


# -- in-memory stand-ins -------------------------------------------------------------------


@dataclass
class Record:
    status: str  # leased / committing / done
    token: str
    owner: str


@dataclass(frozen=True)
class Held:
    token: str


class MemoryWorkLeases:
    """A work lease table in memory: exact-token operations, committing is not abandonable."""

    def __init__(self, owner: str = "m0"):
        self.owner = owner
        self.records: dict[str, Record] = {}
        self.serial = 0
        self.fail_next: str | None = None  # name of the next operation to raise OSError

    def _token(self, owner: str) -> str:
        self.serial += 1
        return f"{owner}-{self.serial:04d}"

    def _fault(self, op: str) -> None:
        if self.fail_next == op:
            self.fail_next = None
            raise OSError(5, f"injected {op} failure")

    def reserve(self, tx: DispatchTransaction) -> Held:
        """Claim the transaction's work and register the lease's compensation: abandon the
        current token (a lease taken over fails safely), refused once it is committing."""
        assert tx.work_id not in self.records
        held = Held(self._token(self.owner))
        self.records[tx.work_id] = Record("leased", held.token, self.owner)

        def abandon() -> None:
            rec = self.records.get(tx.work_id)
            if rec is not None and rec.token == held.token and rec.status == "committing":
                raise RuntimeError(f"work {tx.work_id[:12]} is committing (F321)")
            if rec is not None and rec.token == held.token:
                del self.records[tx.work_id]

        tx.register(SHARED_WORK, before_send=abandon, after_send=abandon)
        return held

    def steal(self, work_id: str, owner: str = "other") -> str:
        """Another coordinator takes an expired `leased` record over."""
        assert self.records[work_id].status == "leased"
        token = self._token(owner)
        self.records[work_id] = Record("leased", token, owner)
        return token

    def begin_commit(self, work_id: str, token: str) -> bool:
        self._fault("begin_commit")
        rec = self.records.get(work_id)
        if rec is None or rec.token != token or rec.status == "done":
            return False
        rec.status = "committing"
        return True

    def complete(self, work_id: str, token: str) -> bool:
        rec = self.records.get(work_id)
        if rec is None or rec.token != token or rec.status == "leased":
            return False
        rec.status = "done"
        return True


class Ledger:
    """Plain reservations: each records the phase that undid it; `release` (the success path)
    leaves its compensation nothing to do, so nothing is undone twice."""

    def __init__(self):
        self.held: dict[str, str] = {}  # reservation name -> the token of its dispatch
        self.undone: list[tuple[str, SendPhase]] = []
        self.released = 0

    def reserve(self, tx: DispatchTransaction, name: str) -> None:
        self.held[name] = tx.token

        def undo(phase: SendPhase):
            def step() -> None:
                if self.held.get(name) == tx.token:
                    del self.held[name]
                    self.undone.append((name, phase))
            return step

        tx.register(name, before_send=undo(SendPhase.BEFORE_SEND),
                    after_send=undo(SendPhase.AFTER_SEND))

    def release(self, name: str, token: str) -> None:
        if self.held.get(name) == token:
            del self.held[name]
            self.released += 1


def tx_for(worker: int = 1, i: int = 0, token: str = "a" * 32, clock=None):
    return DispatchTransaction(worker, wid(i), token, clock=clock or ManualClock())


# -- F313 §3.1 the transaction -------------------------------------------------------------


def test_rollback_runs_in_reverse_by_phase_and_isolates_a_failure():  # F313 §5.8
    calls: list[str] = []

    def step(name):
        return lambda: calls.append(name)

    def boom():
        raise OSError(28, "no space")

    tx = tx_for()
    tx.register("a", before_send=step("a-before"), after_send=step("a-after"))
    tx.register("b", before_send=boom, after_send=step("b-after"))
    tx.register("c", before_send=step("c-before"), after_send=step("c-after"))
    report = tx.rollback()
    assert report.phase is SendPhase.BEFORE_SEND
    assert calls == ["c-before", "a-before"]  # reverse order; b failed, a still ran
    assert report.compensated == ("c", "a")
    assert [f.resource for f in report.failures] == ["b"]
    assert "no space" in report.failures[0].error
    assert tx.state is TransactionState.ROLLED_BACK
    again = tx.rollback()  # a second rollback is a no-op
    assert again.noop and calls == ["c-before", "a-before"]

    calls.clear()
    clock = ManualClock()
    tx = tx_for(clock=clock)
    tx.register("a", before_send=step("a-before"), after_send=step("a-after"))
    tx.register("b", before_send=step("b-before"), after_send=boom)
    clock.advance(3.0)
    assert tx.mark_dispatched() == 3.0
    report = tx.rollback()
    assert report.phase is SendPhase.AFTER_SEND
    assert calls == ["a-after"] and [f.resource for f in report.failures] == ["b"]


def test_commit_clears_and_closed_transactions_refuse_more():
    calls: list[str] = []
    tx = tx_for()
    tx.register("a", before_send=lambda: calls.append("x"), after_send=lambda: calls.append("y"))
    tx.mark_dispatched()
    tx.begin_commit()
    tx.commit()
    assert tx.state is TransactionState.COMMITTED
    assert tx.rollback().noop and calls == []
    with pytest.raises(TransactionClosed):
        tx.register("b", before_send=lambda: None, after_send=lambda: None)
    with pytest.raises(TransactionClosed):
        tx.commit()


def test_an_interrupt_in_a_compensation_still_lets_the_others_run():
    calls: list[str] = []

    def interrupt():
        raise KeyboardInterrupt

    tx = tx_for()
    tx.register("a", before_send=lambda: calls.append("a"), after_send=lambda: None)
    tx.register("b", before_send=interrupt, after_send=lambda: None)
    with pytest.raises(KeyboardInterrupt):
        tx.rollback()
    assert calls == ["a"] and tx.closed


def test_a_compensation_that_reenters_rollback_finds_a_noop():
    tx = tx_for()
    inner = []
    tx.register("a", before_send=lambda: inner.append(tx.rollback()), after_send=lambda: None)
    assert tx.rollback().compensated == ("a",)
    assert inner[0].noop


# -- F313 §3.2 the three tables ------------------------------------------------------------


def full_dispatch(tables, worker, i, r):
    """Reserve a work lease and two plain reservations; returns the lease's handle."""
    tx = tables.begin(worker, wid(i), f"{worker:02x}{i:030x}")
    held = r["leases"].reserve(tx)
    for part in ("a", "b"):
        r["ledger"].reserve(tx, f"{part}-{i}")
    return tx, held


@pytest.fixture
def world():
    return {"clock": ManualClock(), "leases": MemoryWorkLeases(), "ledger": Ledger()}


def nothing_held(r) -> bool:
    return r["leases"].records == {} and r["ledger"].held == {}


def phases(r) -> set[SendPhase]:
    return {phase for _, phase in r["ledger"].undone}


def test_an_exception_while_building_the_message_compensates_everything(world):  # F313 D8
    tables = DispatchTables(clock=world["clock"])
    with pytest.raises(RuntimeError), tables.boundary(1):
        full_dispatch(tables, 1, 0, world)
        raise RuntimeError("envelope encoding failed")
    assert not tables.holds(1) and nothing_held(world)
    assert phases(world) == {SendPhase.BEFORE_SEND}  # never sent: exact undo
    stats = tables.statistics()
    assert (stats.rolled_back_before_send, stats.sweeps, stats.compensation_failures) == (1, 1, 0)


def test_d1_violation_is_swept_conservatively(world):  # F313 §5.10
    tables = DispatchTables(clock=world["clock"])
    tx_a, _ = full_dispatch(tables, 1, 0, world)
    tables.sent(1, tx_a.token)
    tx_b = DispatchTransaction(1, wid(5), "b" * 32, clock=world["clock"])
    world["ledger"].reserve(tx_b, "shard-5")
    # A regression put the worker in two tables, and one object twice: break D1 on purpose.
    tables._tables[Table.PREPARING][1] = tx_b
    tables._tables[Table.COMMITTING][1] = tx_a
    report = tables.sweep(1)
    assert set(report.found_in) == {Table.PREPARING, Table.ACTIVE, Table.COMMITTING}
    assert len(report.rollbacks) == 2  # two distinct transactions, each compensated once
    assert {r.phase for r in report.rollbacks} == {SendPhase.BEFORE_SEND, SendPhase.AFTER_SEND}
    assert all(r.ok for r in report.rollbacks)
    assert not tables.holds(1) and list(tables.transactions()) == []
    assert nothing_held(world)
    assert set(Counter(name for name, _ in world["ledger"].undone).values()) == {1}
    assert tables.statistics().d1_violations == 1


def test_a_worker_holds_one_transaction(world):  # F313 D1
    tables = DispatchTables(clock=world["clock"])
    tx = tables.begin(1, wid(0), "a" * 32)
    with pytest.raises(WorkerBusy):
        tables.begin(1, wid(1), "b" * 32)
    tables.sent(1, tx.token)
    with pytest.raises(WorkerBusy):
        tables.begin(1, wid(1), "b" * 32)
    with pytest.raises(NoSuchDispatch):
        tables.sent(1, tx.token)


def fence(r, tx, held):
    return lambda: r["leases"].begin_commit(tx.work_id, held.token)


def test_begin_commit_keeps_the_transaction_active_until_the_fence_says_yes(world):  # D5 D6
    tables = DispatchTables(clock=world["clock"])
    tx, held = full_dispatch(tables, 1, 0, world)
    tables.sent(1, tx.token)
    assert tables.classify(1, "f" * 32) is ResultClass.STALE
    assert tables.begin_commit(1, "f" * 32, fence(world, tx, held)) is CommitStart.NOT_ACTIVE
    world["leases"].fail_next = "begin_commit"
    with pytest.raises(OSError), tables.boundary(1):
        assert tables.classify(1, tx.token) is ResultClass.CURRENT
        tables.begin_commit(1, tx.token, fence(world, tx, held))
    # The EIO happened with the transaction still in `active`: the sweep found it whole, and
    # it was sent, so every reservation was discarded after-send.
    assert not tables.holds(1) and nothing_held(world)
    assert phases(world) == {SendPhase.AFTER_SEND}

    tx, held = full_dispatch(tables, 2, 1, world)
    tables.sent(2, tx.token)
    assert tables.begin_commit(2, tx.token, fence(world, tx, held)) is CommitStart.COMMITTING
    assert tables.find(2) == (Table.COMMITTING, tx)
    assert tables.expired(world["clock"].monotonic() + 1e6, 1.0) == ()  # W1: not ACTIVE
    assert world["leases"].complete(tx.work_id, held.token)
    for name in ("a-1", "b-1"):
        world["ledger"].release(name, tx.token)
    undone_before = list(world["ledger"].undone)
    tables.finish(2, tx.token)
    assert tx.state is TransactionState.COMMITTED and not tables.holds(2)
    assert world["leases"].records[wid(1)].status == "done"
    assert world["ledger"].undone == undone_before and world["ledger"].held == {}
    stats = tables.statistics()
    assert (stats.committed, stats.rolled_back_after_send, stats.sent) == (1, 1, 2)


def test_a_fenced_result_is_discarded_after_send(world):  # F313 D4
    tables = DispatchTables(clock=world["clock"])
    tx, held = full_dispatch(tables, 1, 0, world)
    tables.sent(1, tx.token)
    thief = world["leases"].steal(wid(0))
    assert tables.begin_commit(1, tx.token, fence(world, tx, held)) is CommitStart.FENCED
    assert not tables.holds(1) and tables.statistics().fenced == 1
    assert world["leases"].records == {wid(0): Record("leased", thief, "other")}
    assert world["ledger"].held == {} and phases(world) == {SendPhase.AFTER_SEND}


def test_a_failure_half_way_through_the_commit_is_compensated_without_double_work(world):
    tables = DispatchTables(clock=world["clock"])
    tx, held = full_dispatch(tables, 1, 0, world)
    tables.sent(1, tx.token)
    with pytest.raises(OSError), tables.boundary(1):
        tables.begin_commit(1, tx.token, fence(world, tx, held))
        world["ledger"].release("a-0", tx.token)  # the success path released one already...
        raise OSError(5, "triage failed")  # ...then triage failed
    # F321: the committing lease is not abandoned (recorded); everything else is released.
    stats = tables.statistics()
    assert stats.failures_by_resource == ((SHARED_WORK, 1),)
    assert world["leases"].records[wid(0)].status == "committing"
    assert world["ledger"].held == {}
    assert world["ledger"].released == 1  # released once by the success path, never undone
    assert world["ledger"].undone == [("b-0", SendPhase.AFTER_SEND)]


def test_shutdown_sweeps_every_worker_once(world):  # F313 §2: shutdown compensation
    tables = DispatchTables(clock=world["clock"])
    tx1, _ = full_dispatch(tables, 1, 0, world)
    tables.sent(1, tx1.token)
    tx2, held2 = full_dispatch(tables, 2, 1, world)
    tables.sent(2, tx2.token)
    tables.begin_commit(2, tx2.token, fence(world, tx2, held2))
    tables.begin(3, wid(2), "c" * 32)
    reports = tables.sweep_all()
    assert [r.worker for r in reports] == [1, 2, 3]
    assert [r.found_in for r in reports] == [(Table.ACTIVE,), (Table.COMMITTING,),
                                             (Table.PREPARING,)]
    assert list(tables.transactions()) == [] and tables.sweep_all() == ()
    # Only the F321 committing lease stays; everything else went back.
    assert world["leases"].records == {wid(1): Record("committing", held2.token, "m0")}
    assert world["ledger"].held == {}


# -- F313 §3.5 the object transfer cache ---------------------------------------------------


def test_objects_are_cached_only_after_the_send_returned():  # F313 D7
    blobs = {hashlib.sha256(b).hexdigest(): b for b in (b"seed", b"dict", b"grammar")}
    ids = list(blobs)
    loads: list[str] = []

    def load(digest):
        loads.append(digest)
        return blobs[digest]

    cache = ObjectTransferCache()
    plan = cache.plan(1, ids[:2], load)
    assert set(plan.contents) == set(ids[:2])
    # The send raised: no confirm. The next WORK carries the full content again.
    again = cache.plan(1, ids[:2], load)
    assert set(again.contents) == set(ids[:2]) and not cache.knows(1, ids[0])
    cache.confirm(again)
    assert cache.knows(1, ids[0]) and not cache.knows(2, ids[0])
    third = cache.plan(1, ids, load)
    assert set(third.contents) == {ids[2]} and third.digests == tuple(ids)
    cache.confirm(third)
    assert loads.count(ids[0]) == 2  # loaded for the failed send and its retry, never after
    stats = cache.statistics()
    assert (stats.confirmed, stats.shipped_objects, stats.hits) == (2, 3, 2)
    cache.forget(1)
    assert set(cache.plan(1, ids[:1], load).contents) == {ids[0]}
    with pytest.raises(ObjectMismatch):
        cache.plan(2, [ids[0]], lambda _: b"not the seed")
