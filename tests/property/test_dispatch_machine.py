"""F313 + F317 together: random dispatch / send-fail / RESULT / stale / timeout / READY
interleavings on several workers, driven through the real dispatch package as the master loop
composes it (READY → dispatch → drain RESULT → join → deadline sweep).

Workers are modelled as processes with two outgoing queues (READY and RESULT tags), each
drained by a random prefix per round, so a READY may overtake its RESULT (F317 §4.3). Faults
are rules or per-step draws: an exception at any point of the message build (F313 D8), a send
that raises before or after delivering (§4), a fence that raises (D5), a triage that raises
after begin_commit, a lease taken over by another coordinator, an unwritable shared target
table or deferred journal, junk READYs and stale RESULTs.

Properties: no resource is held without a live transaction (nothing leaked), nothing is
committed twice, every work is in exactly one place (nothing lost), a parked rank never holds
nor receives work, real attempt counts equal real sends, the object cache never claims an
object the worker did not get, and the watchdog's counters match what happened.
"""

from __future__ import annotations

import hashlib
from collections import Counter, deque
from dataclasses import dataclass, field

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from symcc_mpi.dispatch.objects import ObjectTransferCache, TransferPlan
from symcc_mpi.dispatch.resources import (
    AlgorithmSelection,
    JournalHold,
    LocalJournal,
    LocalTargetRegistry,
    ParameterAssignment,
    ParameterTuner,
    ProposalBook,
    ProposalState,
    SeedWorkerPairing,
    SharedWorkLeases,
    StagedAlgorithmSelector,
    StateLease,
    StateTaskLeases,
    TargetGroups,
    TargetHold,
    WorkLeaseHold,
)
from symcc_mpi.dispatch.tables import (
    CommitStart,
    DispatchTables,
    ParkedWorker,
    ResultClass,
    Table,
)
from symcc_mpi.dispatch.watchdog import (
    DispatchWatchdog,
    ProtocolRecovery,
    ReadyVerdict,
    RecoverySource,
    RetiredDispatchGate,
)
from symcc_mpi.durable.clock import ManualClock

RANKS = (1, 2, 3)
N_WORK = 8
WATCHDOG = 50.0
ME = "m0"
BYTES = {hashlib.sha256(f"input-{i}".encode()).hexdigest(): f"input-{i}".encode()
         for i in range(N_WORK)}
WORK_IDS = list(BYTES)
SEEDS = ("seed-a", "seed-b", "seed-c")


# -- in-memory stand-ins of the durable protocols -------------------------------------------


@dataclass
class Record:
    status: str
    token: str
    owner: str


@dataclass(frozen=True)
class Held:
    token: str


class MemoryWorkLeases:
    def __init__(self):
        self.records: dict[str, Record] = {}
        self.serial = 0
        self.fail_begin_commit = False
        self.completed: Counter[str] = Counter()

    def _token(self) -> str:
        self.serial += 1
        return f"lease-{self.serial}"

    def claim(self, work_id):
        if work_id in self.records:
            return None
        self.records[work_id] = Record("leased", self._token(), ME)
        return Held(self.records[work_id].token)

    def steal(self, work_id):
        self.records[work_id] = Record("leased", self._token(), "other")

    def abandon(self, work_id, token):
        rec = self.records.get(work_id)
        if rec is None or rec.token != token or rec.status != "leased":
            return False
        del self.records[work_id]
        return True

    def begin_commit(self, work_id, token):
        if self.fail_begin_commit:
            self.fail_begin_commit = False
            raise OSError(5, "injected EIO in begin_commit")
        rec = self.records.get(work_id)
        if rec is None or rec.token != token or rec.status == "done":
            return False
        rec.status = "committing"
        return True

    def complete(self, work_id, token):
        rec = self.records.get(work_id)
        if rec is None or rec.token != token or rec.status == "leased":
            return False
        if rec.status == "committing":
            self.completed[work_id] += 1
        rec.status = "done"
        return True


class MemoryLeaseJournal:
    def __init__(self):
        self.leased: dict[str, str] = {}
        self.done_ids: Counter[str] = Counter()

    def lease(self, work_id, token):
        assert work_id not in self.leased, "journal lease of a work already leased"
        self.leased[work_id] = token
        return True

    def reclaim(self, work_id, token):
        if self.leased.get(work_id) != token:
            return False
        del self.leased[work_id]
        return True

    def done(self, work_id, token):
        assert self.leased.pop(work_id) == token
        self.done_ids[work_id] += 1
        return True


class MemoryTargetLeases:
    def __init__(self):
        self.records: dict[int, str] = {}
        self.serial = 0
        self.fail_release = False
        self.orphaned: set[str] = set()  # tokens whose release failed: TTL ends them

    def claim_group(self, targets, *, worker=""):
        group = tuple(targets)
        if any(t in self.records for t in group):
            return None
        self.serial += 1
        token = f"tg-{self.serial}"
        for t in group:
            self.records[t] = token
        return Held(token)

    def release(self, targets, token):
        if self.fail_release:
            self.orphaned.add(token)
            raise OSError(30, "read-only shared target directory")
        gone = [t for t in targets if self.records.get(t) == token]
        for t in gone:
            del self.records[t]
        return len(gone)

    def expire_orphans(self):
        self.records = {t: tok for t, tok in self.records.items() if tok not in self.orphaned}


class MemorySink:
    def __init__(self):
        self.persisted: dict[str, int] = {}
        self.fail = False

    def defer(self, work_id, *, source, attempts):
        if self.fail:
            raise OSError(5, "injected EIO in the deferred journal")
        self.persisted.setdefault(work_id, attempts)

    def is_persisted(self, work_id):
        return work_id in self.persisted


# -- the harness -----------------------------------------------------------------------------


class Injected(Exception):
    pass


class Refused(Exception):
    pass


@dataclass
class Holdings:
    work: WorkLeaseHold
    journal: JournalHold | None = None
    targets: TargetHold | None = None
    state: StateLease | None = None
    param: ParameterAssignment | None = None
    algo: AlgorithmSelection | None = None
    seed: str | None = None
    proposal: str | None = None
    plan: TransferPlan | None = None


@dataclass
class Worker:
    running: str | None = None
    hung: bool = False  # finishes only through the `worker_finishes` rule
    last: str | None = None
    objects: set[str] = field(default_factory=set)
    ready_q: deque = field(default_factory=deque)  # token | "malformed"
    result_q: deque = field(default_factory=deque)  # (kind, token)


def targets_of(work_id: str) -> tuple[int, int]:
    i = WORK_IDS.index(work_id) % 6
    return 2 * i, 2 * i + 1  # works 0/6 and 1/7 conflict, no others


BUILD_STEPS = 9


def _dispatch_fault(n: int):
    """0..79: no fault (what shrinking tends to); then a build step fails, or the send."""
    if n < 80:
        return None
    if n < 80 + BUILD_STEPS:
        return ("build", n - 79)
    return "send-lost" if n < 94 else "send-delivered"


DISPATCH_FAULTS = st.integers(0, 99).map(_dispatch_fault)
COMMIT_FAULTS = st.integers(0, 19).map(
    lambda n: {18: "fence-raises", 19: "triage-raises"}.get(n))


def _drained(data, queue: deque) -> int:
    """How many queued messages this round sees: usually all, sometimes a prefix (a READY
    may then overtake its RESULT, which travels under another tag)."""
    if data.draw(st.integers(0, 3)):
        return len(queue)
    return data.draw(st.integers(0, len(queue)))


class DispatchMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.clock = ManualClock()
        self.leases = MemoryWorkLeases()
        self.journal_store = MemoryLeaseJournal()
        self.shared_targets = MemoryTargetLeases()
        self.shared = SharedWorkLeases(self.leases)
        self.journal = LocalJournal(self.journal_store)
        self.local_targets = LocalTargetRegistry()
        self.targets = TargetGroups(self.local_targets, self.shared_targets)
        self.states = StateTaskLeases()
        self.tuner = ParameterTuner([{"solver": "fast"}, {"solver": "full"}])
        self.algo = StagedAlgorithmSelector(["linear", "bitblast", "full"], seed=1)
        self.pairing = SeedWorkerPairing()
        self.book = ProposalBook(max_attempts=2)
        self.cache = ObjectTransferCache()
        self.sink = MemorySink()
        self.gate = RetiredDispatchGate()
        self.tables = DispatchTables(clock=self.clock, gate=self.gate)
        self.frontier: deque[str] = deque()
        self.recovery = ProtocolRecovery(requeue=self.frontier.appendleft, sink=self.sink,
                                         retries=1)
        self.watchdog = DispatchWatchdog(self.tables, self.gate, self.recovery,
                                         seconds=WATCHDOG)
        self.workers = {rank: Worker(ready_q=deque([None])) for rank in RANKS}
        self.idle: set[int] = set()
        self.retired: set[int] = set()
        self.holdings: dict[tuple[int, str], Holdings] = {}
        self.known: set[str] = set()
        self.done: list[str] = []
        self.elsewhere: set[str] = set()  # another coordinator holds its lease
        self.stuck: set[str] = set()  # committing after a failed triage: resume redoes it
        self.old_tokens: list[str] = []
        self.serial = 0
        # model counters
        self.sends: Counter[str] = Counter()  # proposal → real sends
        self.sent_total = 0
        self.verified = 0
        self.timeouts = 0
        self.recovered = 0
        self.recoveries = 0

    # -- helpers

    def live(self) -> dict[tuple[int, str], tuple[Table, object]]:
        return {(tx.worker, tx.token): (table, tx) for table, tx in self.tables.transactions()}

    def live_holdings(self) -> list[Holdings]:
        return [self.holdings[key] for key in self.live() if key in self.holdings]

    def _unpop(self, work_id: str) -> None:
        if work_id not in self.elsewhere:
            self.frontier.appendleft(work_id)

    # -- rules

    @initialize(n=st.integers(1, N_WORK))
    def seed_the_frontier(self, n):
        for i in range(n):
            self.add_work(i)

    @rule(i=st.integers(0, N_WORK - 1))
    def add_work(self, i):
        work_id = WORK_IDS[i]
        if work_id not in self.known:
            self.known.add(work_id)
            self.frontier.append(work_id)
            self.book.add(f"proposal-{i}")

    @precondition(lambda self: any(w.running for w in self.workers.values()))
    @rule(data=st.data(), kind=st.sampled_from(["ok", "ok", "lost", "bad"]))
    def worker_finishes(self, data, kind):
        rank = data.draw(st.sampled_from([r for r, w in self.workers.items() if w.running]))
        self._finish(rank, kind)

    def _finish(self, rank: int, kind: str) -> None:
        """The worker ends its execution: RESULT (unless lost), then READY with its token."""
        worker = self.workers[rank]
        token, worker.running, worker.last = worker.running, None, worker.running
        if kind != "lost":
            worker.result_q.append((kind, token))
        worker.ready_q.append(token)

    @rule(rank=st.sampled_from(RANKS), kind=st.sampled_from(["none", "malformed", "random"]))
    def junk_ready(self, rank, kind):
        self.workers[rank].ready_q.append({"none": None, "malformed": "malformed",
                                           "random": "f" * 32}[kind])

    @precondition(lambda self: self.gate.parked())
    @rule(data=st.data())
    def parked_rank_sends_a_wrong_ready(self, data):  # F317 W7
        rank = data.draw(st.sampled_from(sorted(self.gate.parked())))
        retired = self.gate.retired_token(rank)
        others = [t for t in self.old_tokens if t != retired] + [None, "malformed"]
        self.workers[rank].ready_q.append(data.draw(st.sampled_from(others)))

    @precondition(lambda self: self.old_tokens)
    @rule(data=st.data(), rank=st.sampled_from(RANKS))
    def stale_result(self, data, rank):
        token = data.draw(st.sampled_from(self.old_tokens))
        self.workers[rank].result_q.append(("ok", token))

    @rule(seconds=st.sampled_from([1.0, 10.0, WATCHDOG / 2, WATCHDOG]))
    def advance(self, seconds):
        self.clock.advance(seconds)
        if seconds >= WATCHDOG:
            self.shared_targets.expire_orphans()  # their TTL ran out

    @precondition(lambda self: any(
        table is Table.ACTIVE and self.leases.records.get(tx.work_id, Record("", "", "")).owner
        == ME for table, tx in self.tables.transactions()))
    @rule(data=st.data())
    def steal(self, data):
        candidates = sorted(tx.work_id for table, tx in self.tables.transactions()
                            if table is Table.ACTIVE
                            and self.leases.records[tx.work_id].owner == ME
                            and self.leases.records[tx.work_id].status == "leased")
        if candidates:
            self.leases.steal(data.draw(st.sampled_from(candidates)))

    @rule(on=st.booleans())
    def shared_target_table_writable(self, on):
        self.shared_targets.fail_release = not on

    @rule(on=st.booleans())
    def deferred_journal_writable(self, on):
        self.sink.fail = not on
        if on:
            self.recovery.retry_deferrals()

    @precondition(lambda self: self.gate.parked())
    @rule(data=st.data())
    def dispatch_to_a_parked_rank_is_refused(self, data):
        rank = data.draw(st.sampled_from(sorted(self.gate.parked())))
        try:
            self.tables.begin(rank, WORK_IDS[0], "e" * 32)
        except ParkedWorker:
            return
        raise AssertionError(f"parked rank {rank} accepted a dispatch")

    @rule(data=st.data())
    def master_round(self, data):
        # Meanwhile, some running workers finish (others hang, or are just slow).
        for rank in RANKS:
            if self.workers[rank].running and not self.workers[rank].hung:
                kind = data.draw(st.sampled_from([None, "ok", "ok", "ok", "lost", "bad"]))
                if kind is not None:
                    self._finish(rank, kind)
        # 1. READY
        for rank in RANKS:
            worker = self.workers[rank]
            for _ in range(_drained(data, worker.ready_q)):
                self._on_ready(rank, worker.ready_q.popleft())
        # 2. dispatch
        for rank in sorted(self.idle):
            if not self.frontier:
                break
            self._dispatch(rank, self.frontier.popleft(), data.draw(DISPATCH_FAULTS), data)
        # 3. drain RESULT
        for rank in RANKS:
            worker = self.workers[rank]
            for _ in range(_drained(data, worker.result_q)):
                kind, token = worker.result_q.popleft()
                self._on_result(rank, kind, token, data)
        # 4. invalid-result join
        report = self.watchdog.join()
        for recovery in report.recoveries:
            event(f"join recovery: {recovery.action.value}")
        self.recoveries += len(report.recoveries)
        for rank in report.ready:
            assert not self.gate.is_parked(rank) and not self.tables.holds(rank)
            if rank not in self.retired:
                self.idle.add(rank)
        # 5. deadline sweep
        for recovery in self.watchdog.sweep():
            event("watchdog timeout")
            assert recovery.source is RecoverySource.WATCHDOG_TIMEOUT
            assert self.gate.retired_token(recovery.rank) == recovery.token
            assert recovery.rank not in self.idle
            self.timeouts += 1
            self.recoveries += 1
            self.old_tokens.append(recovery.token)

    # -- the master's steps, as the sketch composes them

    def _on_ready(self, rank: int, token) -> None:
        if rank in self.retired:
            return
        malformed = token == "malformed"
        retired_token = self.gate.retired_token(rank)
        verdict = self.watchdog.on_ready(rank, None if malformed else token, malformed=malformed)
        if retired_token is not None:
            exact = not malformed and token == retired_token
            assert verdict is (ReadyVerdict.RECOVERED if exact else ReadyVerdict.PARKED)
            self.recovered += exact
            event("parked rank recovered" if exact else "parked rank stays parked")
        if verdict in (ReadyVerdict.IDLE, ReadyVerdict.RECOVERED):
            assert not self.tables.holds(rank)
            self.idle.add(rank)

    def _dispatch(self, rank: int, work_id: str, fault, data) -> None:
        assert rank not in self.retired and not self.gate.is_parked(rank)
        self.serial += 1
        token = f"{self.serial:032x}"
        step = 0

        def checkpoint():
            nonlocal step
            step += 1
            if fault == ("build", step):
                raise Injected(f"message build failed at step {step}")

        held: Holdings | None = None
        try:
            with self.tables.boundary(rank):
                tx = self.tables.begin(rank, work_id, token)
                tx.register("frontier", before_send=lambda: self._unpop(work_id),
                            after_send=lambda: None)
                checkpoint()
                work = self.shared.reserve(tx)
                if work is None:
                    self.elsewhere.add(work_id)
                    raise Refused("work leased elsewhere")
                held = Holdings(work)
                checkpoint()
                held.journal = self.journal.reserve(tx, work.token)
                checkpoint()
                held.targets = self.targets.reserve(tx, targets_of(work_id))
                if held.targets is None:
                    raise Refused("targets busy")
                checkpoint()
                held.state = self.states.reserve(tx, f"shard-{WORK_IDS.index(work_id) % 7}")
                if held.state is None:
                    raise Refused("state shard busy")
                checkpoint()
                held.param = self.tuner.reserve(tx)
                checkpoint()
                held.algo = self.algo.reserve(tx)
                checkpoint()
                held.seed = self.pairing.choose(SEEDS)
                assert self.pairing.reserve(tx, held.seed)
                held.proposal = self.book.reserve(tx)
                checkpoint()
                held.plan = self.cache.plan(rank, [work_id], BYTES.__getitem__)
                checkpoint()
                if fault == "send-lost":
                    raise OSError(5, "MPI send failed")
                self._deliver(rank, token, held.plan, hung=data.draw(st.integers(0, 3)) == 3)
                if fault == "send-delivered":
                    raise OSError(5, "MPI send failed after delivery")
                self.tables.sent(rank, token)
                self.cache.confirm(held.plan)  # F313 D7: only after the send returned
        except (Injected, Refused) as error:
            event(f"dispatch rolled back: {type(error).__name__}")
            assert not self.tables.holds(rank)
            return
        except OSError:
            event(f"send failed: {fault}")
            assert not self.tables.holds(rank)
            self.idle.discard(rank)
            self.retired.add(rank)  # as the master does after a failed send
            self.old_tokens.append(token)
            return
        self.holdings[(rank, token)] = held
        self.idle.discard(rank)
        self.sent_total += 1
        if held.proposal is not None:
            self.sends[held.proposal] += 1

    def _deliver(self, rank: int, token: str, plan: TransferPlan, *, hung: bool) -> None:
        worker = self.workers[rank]
        assert worker.running is None, f"rank {rank} got WORK while still running"
        assert not self.gate.is_parked(rank), f"parked rank {rank} got WORK"
        for object_id in plan.object_ids:  # no false cache hit
            assert object_id in plan.contents or object_id in worker.objects
        worker.objects.update(plan.contents)
        worker.running, worker.hung = token, hung

    def _on_result(self, rank: int, kind: str, token: str, data) -> None:
        if rank in self.retired:
            return
        verdict = self.watchdog.on_result(rank, token)
        live = self.tables.get(Table.ACTIVE, rank)
        assert (verdict is ResultClass.CURRENT) == (live is not None and live.token == token)
        if verdict is ResultClass.STALE:
            event("stale RESULT dropped")
            return
        if kind == "bad":
            assert self.watchdog.note_invalid_result(rank, token)
            return
        held = self.holdings[(rank, token)]
        work_id = live.work_id
        fault = data.draw(COMMIT_FAULTS)
        try:
            with self.tables.boundary(rank):
                self.leases.fail_begin_commit = fault == "fence-raises"
                start = self.tables.begin_commit(rank, token, held.work.begin_commit)
                if start is CommitStart.FENCED:
                    event("fenced RESULT discarded")
                    self.elsewhere.add(work_id)
                    self.old_tokens.append(token)
                    return
                assert start is CommitStart.COMMITTING
                if fault == "triage-raises":
                    raise Injected("triage failed")
                # F313 D6: completion, learning, releases; the TTL-bounded shared target
                # release last, so its failure cannot undo what the result taught.
                assert held.work.complete()
                held.journal.done()
                assert self.tuner.observe(held.param.token, 1.0)
                assert self.algo.feedback(held.algo.token, 1.0)
                if held.proposal is not None:
                    assert self.book.settle(held.proposal, verified=True)
                    self.verified += 1
                assert self.pairing.finish(rank, held.seed)
                assert self.states.release(held.state.token)
                held.targets.release()
                self.tables.finish(rank, token)
                self.done.append(work_id)
                event("committed")
        except OSError:
            # The fence or the shared target release raised: the sweep compensated after-send.
            assert not self.tables.holds(rank)
            status = self.leases.records.get(work_id, Record("", "", "")).status
            event(f"commit path raised, lease {status or 'gone'}")
            if status == "done":
                self.done.append(work_id)  # committed in substance; only a release failed
            elif status == "committing":
                self.stuck.add(work_id)  # the fence had passed: F321, resume redoes it
            else:
                self.frontier.appendleft(work_id)  # like Frontier.requeue
        except Injected:
            event("triage raised after begin_commit")
            assert not self.tables.holds(rank)
            assert self.leases.records[work_id].status == "committing"
            self.stuck.add(work_id)
        self.old_tokens.append(token)

    # -- invariants

    @invariant()
    def a_worker_is_in_at_most_one_table(self):  # F313 D1
        for rank in RANKS:
            assert sum(rank in self.tables.workers(t) for t in Table) <= 1

    @invariant()
    def a_parked_rank_holds_no_work_and_is_not_idle(self):  # F317 W6
        for rank in self.gate.parked():
            assert not self.tables.holds(rank) and rank not in self.idle
        assert not self.idle & self.retired

    @invariant()
    def nothing_is_leaked(self):  # F313 D2/D8
        live = self.live()
        held = self.live_holdings()
        assert set(live) == set(self.holdings) & set(live)
        precommit = {tx.work_id: (self.holdings[key].work.token if key in self.holdings else None)
                     for key, (table, tx) in live.items()}
        for work_id, rec in self.leases.records.items():
            if rec.owner != ME:
                continue
            if rec.status == "leased":
                assert precommit.get(work_id) == rec.token, f"leaked work lease {work_id[:8]}"
            elif rec.status == "committing":
                assert work_id in self.stuck or any(
                    tx.work_id == work_id for t, tx in live.values() if t is Table.COMMITTING)
        assert self.journal_store.leased == {
            h.journal.work_id: h.journal.token for h in held if h.journal is not None}
        assert self.local_targets.held() == {
            t: h.targets.worker for h in held if h.targets is not None for t in h.targets.group}
        live_target_tokens = {h.targets.shared_token for h in held if h.targets is not None}
        assert set(self.shared_targets.records.values()) <= (live_target_tokens
                                                             | self.shared_targets.orphaned)
        assert set(self.states.active()) == {h.state.token for h in held if h.state}
        assert set(self.tuner.pending()) == {h.param.token for h in held if h.param}
        assert set(self.algo.pending()) == {h.algo.token for h in held if h.algo}
        assert self.pairing.active() == {
            tx.worker: self.holdings[key].seed for key, (t, tx) in live.items()
            if key in self.holdings}
        dispatched = {p for p, prop in self.book.proposals().items()
                      if prop.state is ProposalState.DISPATCHED}
        assert dispatched == {h.proposal for h in held if h.proposal}

    @invariant()
    def nothing_is_committed_twice(self):
        assert len(self.done) == len(set(self.done))
        assert all(n == 1 for n in self.leases.completed.values())
        assert all(n == 1 for n in self.journal_store.done_ids.values())
        assert sum(a.pulls for a in self.tuner.statistics().arms) == len(self.done)
        assert sum(self.algo.statistics().feedback) == len(self.done)
        assert self.book.statistics().verified == self.verified

    @invariant()
    def nothing_is_lost(self):
        in_flight = [tx.work_id for _, tx in self.tables.transactions()]
        places = (list(self.frontier) + in_flight + self.done + sorted(self.recovery.deferred())
                  + sorted(self.elsewhere) + sorted(self.stuck))
        assert Counter(places) == Counter(self.known), "a work is lost or in two places"

    @invariant()
    def attempts_are_real_sends(self):  # F313 D3/D4
        assert sum(a.assigned for a in self.tuner.statistics().arms) == self.sent_total
        assert self.pairing.statistics().assignments == self.sent_total
        assert self.states.statistics().granted == self.sent_total
        assert self.algo.statistics().sequence >= self.sent_total
        for pid, proposal in self.book.proposals().items():
            assert proposal.attempts == self.sends[pid]

    @invariant()
    def the_cache_never_claims_an_object_the_worker_lacks(self):  # F313 D7
        for rank in RANKS:
            assert self.cache.held(rank) <= self.workers[rank].objects

    @invariant()
    def the_counters_match(self):  # F317 §4.4
        stats = self.watchdog.statistics()
        assert stats.timeouts == self.timeouts
        assert stats.worker_recoveries == self.recovered
        assert stats.protocol_requeued + stats.protocol_deferred == self.recoveries
        deferred = self.recovery.deferred()
        assert deferred == set(self.sink.persisted) | self.recovery.deferred_in_memory()
        assert not set(self.sink.persisted) & self.recovery.deferred_in_memory()


pytestmark = pytest.mark.usefixtures("quiet_dispatch_log")


TestDispatchMachine = DispatchMachine.TestCase
TestDispatchMachine.settings = settings(max_examples=300, stateful_step_count=50, deadline=None)
