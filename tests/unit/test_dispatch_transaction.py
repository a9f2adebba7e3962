"""F313: compensating dispatch transactions, the three tables, resources and the object cache.

The ten cases of F313 §5 are marked `# F313 §5.N`. The shared work lease table and the local
journal are in-memory stand-ins of the `WorkLeases` / `LeaseJournal` protocols, written to the
contracts of `durable/leases.py` and `durable/journal.py` (exact tokens; append first).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

import pytest

from symcc_mpi.dispatch.objects import ObjectMismatch, ObjectTransferCache
from symcc_mpi.dispatch.resources import (
    RESULT_LOST,
    HoldState,
    JournalState,
    LocalJournal,
    LocalTargetRegistry,
    ParameterTuner,
    ProposalBook,
    ProposalState,
    ResourceName,
    SeedWorkerPairing,
    SharedWorkLeases,
    StagedAlgorithmSelector,
    StateTaskLeases,
    TargetGroups,
)
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
    """`WorkLeases` in memory: exact-token operations, committing is not abandonable."""

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

    def claim(self, work_id: str) -> Held | None:
        self._fault("claim")
        if work_id in self.records:
            return None
        token = self._token(self.owner)
        self.records[work_id] = Record("leased", token, self.owner)
        return Held(token)

    def steal(self, work_id: str, owner: str = "other") -> str:
        """Another coordinator takes an expired `leased` record over."""
        assert self.records[work_id].status == "leased"
        token = self._token(owner)
        self.records[work_id] = Record("leased", token, owner)
        return token

    def abandon(self, work_id: str, token: str) -> bool:
        self._fault("abandon")
        rec = self.records.get(work_id)
        if rec is None or rec.token != token or rec.status != "leased":
            return False
        del self.records[work_id]
        return True

    def begin_commit(self, work_id: str, token: str) -> bool:
        self._fault("begin_commit")
        rec = self.records.get(work_id)
        if rec is None or rec.token != token or rec.status == "done":
            return False
        rec.status = "committing"
        return True

    def complete(self, work_id: str, token: str) -> bool:
        self._fault("complete")
        rec = self.records.get(work_id)
        if rec is None or rec.token != token or rec.status == "leased":
            return False
        rec.status = "done"
        return True


class MemoryLeaseJournal:
    """`LeaseJournal` in memory, F313 §3.4 order: append the event, then change memory."""

    def __init__(self):
        self.lines: list[tuple[str, str, str]] = []
        self.leased: dict[str, str] = {}
        self.done_ids: dict[str, str] = {}
        self.fail_next = False

    def _event(self, event: str, work_id: str, token: str) -> bool:
        if event == "lease" and self.leased.get(work_id) == token:
            return False
        if event == "reclaim" and work_id not in self.leased:
            return False
        if self.fail_next:
            self.fail_next = False
            raise OSError(5, "injected append failure")
        self.lines.append((event, work_id, token))  # the append comes first...
        self.apply(self.leased, self.done_ids, event, work_id, token)  # ...then memory
        return True

    @staticmethod
    def apply(leased, done, event, work_id, token):
        if event == "lease":
            leased[work_id] = token
        elif event == "done":
            leased.pop(work_id)
            done[work_id] = token
        else:
            leased.pop(work_id)

    def replay(self) -> tuple[dict[str, str], dict[str, str]]:
        leased: dict[str, str] = {}
        done: dict[str, str] = {}
        for line in self.lines:
            self.apply(leased, done, *line)
        return leased, done

    def lease(self, work_id: str, token: str) -> bool:
        return self._event("lease", work_id, token)

    def reclaim(self, work_id: str, token: str) -> bool:
        return self._event("reclaim", work_id, token)

    def done(self, work_id: str, token: str) -> bool:
        return self._event("done", work_id, token)


@dataclass(frozen=True)
class Claim:
    token: str
    group: tuple[int, ...]


class MemoryTargetLeases:
    def __init__(self):
        self.records: dict[int, str] = {}
        self.serial = 0
        self.fail_release = False

    def claim_group(self, targets, *, worker: str = "") -> Claim | None:
        group = tuple(sorted(targets))
        if any(t in self.records for t in group):
            return None
        self.serial += 1
        token = f"t{self.serial}"
        for t in group:
            self.records[t] = token
        return Claim(token, group)

    def release(self, targets, token: str) -> int:
        if self.fail_release:
            raise OSError(30, "read-only shared directory")
        gone = [t for t in targets if self.records.get(t) == token]
        for t in gone:
            del self.records[t]
        return len(gone)


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
    assert tx.resources == ("a", "b", "c")
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
    assert tx.mark_dispatched() == 3.0 and tx.dispatched_at == 3.0
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
    assert tx.state is TransactionState.COMMITTED and tx.resources == ()
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


# -- F313 §3.3 the resources ---------------------------------------------------------------


def test_local_journal_reclaim_replays_and_a_failed_append_changes_nothing():  # F313 §5.1
    journal = MemoryLeaseJournal()
    local = LocalJournal(journal)
    tx = tx_for(i=1)
    journal.fail_next = True
    with pytest.raises(OSError):
        local.reserve(tx)  # the lease append failed: nothing leased, nothing to compensate
    assert journal.leased == {} and journal.lines == [] and tx.resources == ()

    hold = local.reserve(tx, token="lease-tok")
    assert journal.leased == {wid(1): "lease-tok"}
    tx.rollback()  # before send: append `reclaim`, never `done`
    assert hold.state is JournalState.RECLAIMED
    assert journal.lines[-1] == ("reclaim", wid(1), "lease-tok")
    assert journal.replay() == ({}, {}) == (journal.leased, journal.done_ids)

    tx2 = tx_for(i=2)
    hold2 = local.reserve(tx2)
    tx2.mark_dispatched()
    journal.fail_next = True  # the reclaim append fails during an after-send discard
    report = tx2.rollback()
    assert [f.resource for f in report.failures] == [ResourceName.LOCAL_JOURNAL.value]
    assert journal.leased == {wid(2): tx2.token}  # memory not ahead of the file
    assert journal.replay()[0] == journal.leased
    assert hold2.state is JournalState.LEASED  # honest: still leased, not marked reclaimed


def test_shared_work_abandon_takes_only_the_current_precommit_token():  # F313 §5.2
    leases = MemoryWorkLeases()
    shared = SharedWorkLeases(leases)
    tx = tx_for(i=1)
    hold = shared.reserve(tx)
    assert hold is not None and leases.records[wid(1)].token == hold.token
    assert shared.reserve(tx_for(worker=2, i=1)) is None  # held: refused, nothing registered
    tx.rollback()
    assert wid(1) not in leases.records and hold.state is HoldState.RELEASED

    # After send, the lease was taken over: the discard fails safely, the thief keeps it.
    tx = tx_for(i=2)
    hold = shared.reserve(tx)
    tx.mark_dispatched()
    thief = leases.steal(wid(2))
    report = tx.rollback()
    assert report.ok and hold.state is HoldState.LOST
    assert leases.records[wid(2)].token == thief

    # After begin_commit (F321) the lease cannot be abandoned: the refusal is recorded.
    tx = tx_for(i=3)
    hold = shared.reserve(tx)
    tx.mark_dispatched()
    assert hold.begin_commit()
    report = tx.rollback()
    assert [f.resource for f in report.failures] == [ResourceName.SHARED_WORK.value]
    assert leases.records[wid(3)].status == "committing"

    # A finished hold cannot touch a later claim of the same work.
    tx = tx_for(i=4)
    hold = shared.reserve(tx)
    tx.rollback()
    again = shared.reserve(tx_for(worker=2, i=4, token="b" * 32))
    assert not hold.abandon() and leases.records[wid(4)].token == again.token
    assert shared.statistics().lost == 1 and shared.statistics().abandoned == 2


def test_state_abandon_rolls_back_the_count_and_stale_discard_records_a_failure():  # §5.3
    states = StateTaskLeases()
    tx = tx_for()
    lease = states.reserve(tx, "shard-1")
    assert states.reserve(tx_for(worker=2), "shard-1") is None  # one holder per task
    assert states.lease_count("shard-1") == 1
    tx.rollback()
    assert states.lease_count("shard-1") == 0 and states.failures("shard-1") == 0
    assert states.active() == {} and states.holder("shard-1") is None

    tx = tx_for(worker=2)
    lease = states.reserve(tx, "shard-1")
    tx.mark_dispatched()
    tx.rollback()  # a stale result: it ran, the lease count stays, one failure is recorded
    assert states.lease_count("shard-1") == 1 and states.failures("shard-1") == 1
    assert states.active() == {} and not states.release(lease.token)


def test_an_unsent_parameter_token_is_never_observed():  # F313 §5.4
    tuner = ParameterTuner([{"solver_timeout": 5}, {"solver_timeout": 30}])
    tx = tx_for()
    assignment = tuner.reserve(tx)
    tx.rollback()
    assert not tuner.observe(assignment.token, 1.0)
    stats = tuner.statistics()
    assert stats.pending == 0 and stats.arms[assignment.arm].assigned == 0
    assert stats.arms[assignment.arm].pulls == 0

    tx = tx_for()
    assignment = tuner.reserve(tx)
    tx.mark_dispatched()
    tx.rollback()  # after send: the assignment was real, the reward is not learnt
    assert not tuner.observe(assignment.token, 1.0)
    arm = tuner.statistics().arms[assignment.arm]
    assert (arm.assigned, arm.pulls, arm.discarded, arm.reward) == (1, 0, 1, 0.0)

    assignment = tuner.assign()
    assert tuner.observe(assignment.token, 0.5) and not tuner.observe(assignment.token, 0.5)


def test_an_unsent_algorithm_stage_replays_exactly_and_a_discard_does_not_rewind():  # §5.5
    algo = StagedAlgorithmSelector(["fast", "medium", "full"], seed=7)
    for _ in range(3):
        algo.feedback(algo.select().token, 1.0)
    before = algo.statistics()
    tx = tx_for()
    selection = algo.reserve(tx)
    tx.rollback()
    assert algo.statistics() == replace(before, exact_rewinds=before.exact_rewinds + 1)
    assert algo.select() == selection  # the same stage and the same token again

    algo2 = StagedAlgorithmSelector(["fast", "medium", "full"], seed=7)
    tx = tx_for()
    executed = algo2.reserve(tx)
    tx.mark_dispatched()
    moved = algo2.statistics()
    tx.rollback()  # after send: only the pending feedback goes
    stats = algo2.statistics()
    assert (stats.cursor, stats.sequence, stats.priors) == (moved.cursor, moved.sequence,
                                                            moved.priors)
    assert stats.pending == 0 and stats.discarded == 1 and stats.feedback == (0, 0, 0)
    assert algo2.select() != executed


def test_two_unsent_algorithm_selections_roll_back_lifo_and_replay_the_same_tokens():  # §5.9
    algo = StagedAlgorithmSelector(["a", "b", "c"], seed=11, advance_probability=0.7)
    start = algo.statistics()
    first, second = tx_for(worker=1), tx_for(worker=2)
    s1 = algo.reserve(first)
    s2 = algo.reserve(second)
    second.rollback()
    first.rollback()
    stats = algo.statistics()
    assert (stats.sequence, stats.cursor, stats.priors) == (start.sequence, start.cursor,
                                                            start.priors)
    assert stats.exact_rewinds == 2
    assert [algo.select(), algo.select()] == [s1, s2]

    # Out of LIFO order the older one may not rewind global state another selection used.
    algo = StagedAlgorithmSelector(["a", "b", "c"], seed=11, advance_probability=0.7)
    s1, s2 = algo.select(), algo.select()
    assert not algo.rewind(s1.token)  # conservative: only the pending token goes
    assert algo.sequence == 2
    assert algo.rewind(s2.token)  # the top is still exact: back to just after s1
    assert algo.sequence == 1 and algo.pending() == {}
    assert algo.select() == s2
    assert algo.statistics().conservative_rewinds == 1


def test_seed_worker_release_undoes_the_assignment_and_discard_keeps_it():  # F313 §5.6
    pairing = SeedWorkerPairing()
    seed = pairing.choose(["s2", "s1"])
    assert seed == "s1"
    tx = tx_for(worker=3)
    assert pairing.reserve(tx, seed)
    assert not pairing.reserve(tx_for(worker=3), "s2")  # one pairing per worker
    tx.rollback()
    assert pairing.active() == {} and pairing.assignments("s1") == 0

    tx = tx_for(worker=3)
    pairing.reserve(tx, "s1")
    tx.mark_dispatched()
    tx.rollback()
    assert pairing.active() == {} and pairing.assignments("s1") == 1
    assert pairing.choose(["s1", "s2"]) == "s2"


def test_proposal_unsent_goes_back_pending_and_lost_goes_to_retry():  # F313 §5.7
    book = ProposalBook(max_attempts=2)
    book.add("p1")
    tx = tx_for()
    assert book.reserve(tx) == "p1"
    assert book.get("p1").state is ProposalState.DISPATCHED and book.get("p1").attempts == 1
    tx.rollback()
    assert book.get("p1") == book.get("p1").__class__("p1", ProposalState.PENDING, 0)

    for expected in (ProposalState.RETRY, ProposalState.REJECTED):
        tx = tx_for()
        assert book.reserve(tx) == "p1"
        tx.mark_dispatched()
        tx.rollback()
        proposal = book.get("p1")
        assert proposal.state is expected and proposal.reason == RESULT_LOST
    assert book.get("p1").attempts == 2 and book.take() is None

    book.add("p2")
    book.add("p3")
    pid = book.take()
    book.lose(pid)
    tx = tx_for()
    assert book.reserve(tx) == "p2"  # a retry is taken again, oldest first
    tx.rollback()
    assert book.get("p2").state is ProposalState.RETRY and book.get("p2").attempts == 1
    assert book.settle(book.take(), verified=True)
    assert book.statistics().verified == 1


def test_target_group_released_locally_even_when_the_shared_release_fails():
    local, shared = LocalTargetRegistry(), MemoryTargetLeases()
    groups = TargetGroups(local, shared)
    tx = tx_for(worker=1)
    hold = groups.reserve(tx, [3, 1, 3])
    assert hold.group == (1, 3) and local.held() == {1: 1, 3: 1}
    assert groups.reserve(tx_for(worker=2), [3, 4]) is None  # local conflict
    assert local.held() == {1: 1, 3: 1}
    shared.records[9] = "foreign"
    assert groups.reserve(tx_for(worker=2), [8, 9]) is None  # shared refusal: local undone
    assert local.holder(8) is None
    shared.fail_release = True
    report = tx.rollback()
    assert [f.resource for f in report.failures] == [ResourceName.TARGET_GROUP.value]
    assert local.held() == {}  # F313 §3.1: the in-process registry is still released
    assert tx.resources == () and report.compensated == (ResourceName.LOCAL_TARGETS.value,)


# -- F313 §3.2 the three tables ------------------------------------------------------------


def full_dispatch(tables, worker, i, r):
    """Reserve one of everything, as a hybrid dispatch would; returns the handles."""
    tx = tables.begin(worker, wid(i), f"{worker:02x}{i:030x}")
    return tx, {
        "work": r["shared"].reserve(tx),
        "journal": r["journal"].reserve(tx),
        "targets": r["targets"].reserve(tx, [i, i + 1]),
        "state": r["states"].reserve(tx, f"shard-{i}"),
        "param": r["tuner"].reserve(tx),
        "algo": r["algo"].reserve(tx),
        "seed": r["pairing"].reserve(tx, f"seed-{i}"),
        "proposal": r["book"].reserve(tx),
    }


@pytest.fixture
def world():
    clock = ManualClock()
    leases, journal = MemoryWorkLeases(), MemoryLeaseJournal()
    book = ProposalBook()
    for n in range(4):
        book.add(f"p{n}")
    r = {
        "clock": clock, "leases": leases, "journal_store": journal,
        "shared": SharedWorkLeases(leases), "journal": LocalJournal(journal),
        "local": LocalTargetRegistry(), "states": StateTaskLeases(),
        "tuner": ParameterTuner([{"k": 1}, {"k": 2}]),
        "algo": StagedAlgorithmSelector(["a", "b"], seed=3), "pairing": SeedWorkerPairing(),
        "book": book,
    }
    r["targets"] = TargetGroups(r["local"])
    return r


def nothing_held(r) -> bool:
    return (r["leases"].records == {} and r["journal_store"].leased == {}
            and r["local"].held() == {} and r["states"].active() == {}
            and r["tuner"].pending() == {} and r["algo"].pending() == {}
            and r["pairing"].active() == {}
            and r["book"].statistics().dispatched == 0)


def test_an_exception_while_building_the_message_compensates_everything(world):  # F313 D8
    tables = DispatchTables(clock=world["clock"])
    with pytest.raises(RuntimeError), tables.boundary(1):
        full_dispatch(tables, 1, 0, world)
        raise RuntimeError("envelope encoding failed")
    assert not tables.holds(1) and nothing_held(world)
    assert world["book"].get("p0").attempts == 0
    stats = tables.statistics()
    assert (stats.rolled_back_before_send, stats.sweeps, stats.compensation_failures) == (1, 1, 0)


def test_d1_violation_is_swept_conservatively(world):  # F313 §5.10
    tables = DispatchTables(clock=world["clock"])
    tx_a, _ = full_dispatch(tables, 1, 0, world)
    tables.sent(1, tx_a.token)
    tx_b = DispatchTransaction(1, wid(5), "b" * 32, clock=world["clock"])
    world["states"].reserve(tx_b, "shard-5")
    # A regression put the worker in two tables, and one object twice: break D1 on purpose.
    tables._tables[Table.PREPARING][1] = tx_b
    tables._tables[Table.COMMITTING][1] = tx_a
    report = tables.sweep(1)
    assert set(report.found_in) == {Table.PREPARING, Table.ACTIVE, Table.COMMITTING}
    assert len(report.rollbacks) == 2  # two distinct transactions, each compensated once
    assert {r.phase for r in report.rollbacks} == {SendPhase.BEFORE_SEND, SendPhase.AFTER_SEND}
    assert all(r.ok for r in report.rollbacks)
    assert not tables.holds(1) and list(tables.transactions()) == []
    assert nothing_held(world) and world["states"].lease_count("shard-5") == 0
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


def test_begin_commit_keeps_the_transaction_active_until_the_fence_says_yes(world):  # D5 D6
    tables = DispatchTables(clock=world["clock"])
    tx, held = full_dispatch(tables, 1, 0, world)
    tables.sent(1, tx.token)
    assert tables.classify(1, "f" * 32) is ResultClass.STALE
    assert tables.begin_commit(1, "f" * 32, held["work"].begin_commit) is CommitStart.NOT_ACTIVE
    world["leases"].fail_next = "begin_commit"
    with pytest.raises(OSError), tables.boundary(1):
        assert tables.classify(1, tx.token) is ResultClass.CURRENT
        tables.begin_commit(1, tx.token, held["work"].begin_commit)
    # The EIO happened with the transaction still in `active`: the sweep found it whole.
    assert not tables.holds(1) and nothing_held(world)
    assert world["book"].get("p0").attempts == 1  # it was sent: the attempt is real
    assert world["tuner"].statistics().arms[held["param"].arm].assigned == 1

    tx, held = full_dispatch(tables, 2, 1, world)
    tables.sent(2, tx.token)
    assert tables.begin_commit(2, tx.token, held["work"].begin_commit) is CommitStart.COMMITTING
    assert tables.find(2) == (Table.COMMITTING, tx)
    assert tables.expired(world["clock"].monotonic() + 1e6, 1.0) == ()  # W1: not ACTIVE
    held["work"].complete()
    held["journal"].done()
    held["targets"].release()
    world["states"].release(held["state"].token)
    world["tuner"].observe(held["param"].token, 1.0)
    world["algo"].feedback(held["algo"].token, 1.0)
    world["pairing"].finish(2, "seed-1")
    world["book"].settle(held["proposal"], verified=True)
    tables.finish(2, tx.token)
    assert tx.state is TransactionState.COMMITTED and not tables.holds(2)
    assert world["leases"].records[wid(1)].status == "done"
    assert world["journal_store"].done_ids == {wid(1): tx.token}
    stats = tables.statistics()
    assert (stats.committed, stats.rolled_back_after_send, stats.sent) == (1, 1, 2)


def test_a_fenced_result_is_discarded_after_send(world):  # F313 D4
    tables = DispatchTables(clock=world["clock"])
    tx, held = full_dispatch(tables, 1, 0, world)
    tables.sent(1, tx.token)
    thief = world["leases"].steal(wid(0))
    assert tables.begin_commit(1, tx.token, held["work"].begin_commit) is CommitStart.FENCED
    assert not tables.holds(1) and tables.statistics().fenced == 1
    assert world["leases"].records == {wid(0): Record("leased", thief, "other")}
    assert world["states"].failures("shard-0") == 1 and world["tuner"].pending() == {}
    assert world["book"].get("p0").state is ProposalState.RETRY


def test_a_failure_half_way_through_the_commit_is_compensated_without_double_work(world):
    tables = DispatchTables(clock=world["clock"])
    tx, held = full_dispatch(tables, 1, 0, world)
    tables.sent(1, tx.token)
    with pytest.raises(OSError), tables.boundary(1):
        tables.begin_commit(1, tx.token, held["work"].begin_commit)
        held["targets"].release()  # the success path released the targets already...
        raise OSError(5, "triage failed")  # ...then triage failed
    # F321: the committing lease is not abandoned (recorded); everything else is released.
    stats = tables.statistics()
    assert stats.failures_by_resource == ((ResourceName.SHARED_WORK.value, 1),)
    assert world["leases"].records[wid(0)].status == "committing"
    assert world["journal_store"].leased == {} and world["local"].held() == {}
    assert world["local"].statistics().released == 2  # released once, not twice


def test_shutdown_sweeps_every_worker_once(world):  # F313 §2: shutdown compensation
    tables = DispatchTables(clock=world["clock"])
    tx1, _ = full_dispatch(tables, 1, 0, world)
    tables.sent(1, tx1.token)
    tx2, held2 = full_dispatch(tables, 2, 1, world)
    tables.sent(2, tx2.token)
    tables.begin_commit(2, tx2.token, held2["work"].begin_commit)
    tables.begin(3, wid(2), "c" * 32)
    reports = tables.sweep_all()
    assert [r.worker for r in reports] == [1, 2, 3]
    assert [r.found_in for r in reports] == [(Table.ACTIVE,), (Table.COMMITTING,),
                                             (Table.PREPARING,)]
    assert list(tables.transactions()) == [] and tables.sweep_all() == ()
    # Only the F321 committing lease stays; everything else went back.
    assert world["leases"].records == {wid(1): Record("committing", held2["work"].token, "m0")}
    assert world["local"].held() == {} and world["tuner"].pending() == {}


# -- F313 §3.5 the object transfer cache ---------------------------------------------------


def test_objects_are_cached_only_after_the_send_returned():  # F313 D7
    blobs = {hashlib.sha256(b).hexdigest(): b for b in (b"seed", b"dict", b"grammar")}
    ids = list(blobs)
    loads: list[str] = []

    def load(object_id):
        loads.append(object_id)
        return blobs[object_id]

    cache = ObjectTransferCache()
    plan = cache.plan(1, ids[:2], load)
    assert set(plan.contents) == set(ids[:2])
    # The send raised: no confirm. The next WORK carries the full content again.
    again = cache.plan(1, ids[:2], load)
    assert set(again.contents) == set(ids[:2]) and not cache.knows(1, ids[0])
    cache.confirm(again)
    assert cache.knows(1, ids[0]) and not cache.knows(2, ids[0])
    third = cache.plan(1, ids, load)
    assert set(third.contents) == {ids[2]} and third.object_ids == tuple(ids)
    cache.confirm(third)
    assert loads.count(ids[0]) == 2  # loaded for the failed send and its retry, never after
    stats = cache.statistics()
    assert (stats.confirmed, stats.shipped_objects, stats.hits) == (2, 3, 2)
    cache.forget(1)
    assert set(cache.plan(1, ids[:1], load).contents) == {ids[0]}
    with pytest.raises(ObjectMismatch):
        cache.plan(2, [ids[0]], lambda _: b"not the seed")
