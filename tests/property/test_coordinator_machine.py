"""The composed dispatch path under random faults: `DispatchCoordinator` against a model.

The machine plays the master's round (messages, then `join`, `dispatch`, `sweep`: F317 §4.2)
on up to four worker ranks, and plays the workers: each keeps the WORKs it received in order,
finishes the oldest by returning its RESULT, a RESULT that cannot be used, or nothing (lost),
and sends READYs with its last token, with none, with an old or foreign one, or undecodable.
Faults are rules or draws: a send that raises before delivering or after (ambiguous, F313 §4),
a commit that raises inside the boundary, an unreadable corpus input, the clock jumping past
the deadline, a FATAL rank, shutdown.

A model of the master's view (which ranks are idle, parked, retired; which dispatch each rank
holds; what the join and the sweep must recover) runs beside the coordinator and must agree
with it after every step. Properties: every known input is in exactly one place (nothing lost,
nothing duplicated), nothing is committed twice, a parked or retired rank never gets WORK, a
rank holds at most one transaction and an idle one none, the object cache never claims an
object the worker lacks, the counters match, and shutdown leaves the tables empty.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

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

from symcc_mpi.dispatch.coordinator import UNREADABLE_SOURCE, DispatchCoordinator
from symcc_mpi.dispatch.tables import CommitStart, ResultClass, Table
from symcc_mpi.dispatch.watchdog import (
    ReadyVerdict,
    RecoveryAction,
    RecoverySource,
    WatchdogConfig,
)
from symcc_mpi.durable.clock import ManualClock
from symcc_mpi.durable.deferred import DeferredWorkJournal
from symcc_mpi.scheduling.frontier import Frontier
from symcc_mpi.wire.protocol import Work

RANKS = (1, 2, 3, 4)
WATCHDOG = 50.0
RETRIES = 2
MAX_SEND_FAILURES = 3
BLOBS = [f"input-{i}\n".encode() for i in range(8)]
IDS = [hashlib.sha256(b).hexdigest() for b in BLOBS]
MISSING, CORRUPT = IDS[6], IDS[7]  # the corpus file is gone / holds other bytes
UNREADABLE = frozenset({MISSING, CORRUPT})
FOREIGN = "f" * 32

SEND_FAULTS = st.sampled_from([None] * 8 + ["lost", "delivered"])
READY_AFTER = st.sampled_from([True, True, True, False])  # the worker's READY follows at once


class Injected(Exception):
    """A commit step that raised (triage, promote, the done journal)."""


OBJECT_CAPACITY = 2  # small, so that both sides' windows evict often


@dataclass
class Worker:
    running: list[str] = field(default_factory=list)  # WORK tokens received, oldest first
    last: str | None = None  # token of the dispatch it finished last
    # The objects it received and still keeps: the last OBJECT_CAPACITY, as the worker's
    # ObjectStore (dispatch/objects.py) keeps them (oldest first).
    objects: dict[str, None] = field(default_factory=dict)

    def receive(self, digests) -> None:
        for digest in digests:
            self.objects.pop(digest, None)
            self.objects[digest] = None
            while len(self.objects) > OBJECT_CAPACITY:
                del self.objects[next(iter(self.objects))]


@dataclass(frozen=True)
class Live:
    token: str
    work_id: str
    sent_at: float


class CoordinatorMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.clock = ManualClock()
        self.frontier = Frontier()
        self.store = {d: b for d, b in zip(IDS, BLOBS, strict=True) if d != MISSING}
        self.store[CORRUPT] = b"not what its name says\n"
        self.journal = DeferredWorkJournal(Path(self.tmp.name) / "deferred.jsonl",
                                           clock=self.clock, fsync=False)
        self.coord = DispatchCoordinator(
            self.frontier, watchdog=WatchdogConfig(WATCHDOG, RETRIES), deferrals=self.journal,
            load=self._load, clock=self.clock, max_send_failures=MAX_SEND_FAILURES,
            object_capacity=OBJECT_CAPACITY)
        self.workers = {rank: Worker() for rank in RANKS}
        # The model of the master's view.
        self.known: set[str] = set()
        self.done_at_start: set[str] = set()
        self.elsewhere: set[str] = set()  # marked done while in flight
        self.commits: Counter[str] = Counter()
        self.live: dict[int, Live] = {}
        self.idle: set[int] = set()
        self.parked: dict[int, str] = {}
        self.retired: set[int] = set()
        self.invalid: dict[int, str] = {}  # rank → token of a rejected current RESULT
        self.ready_seen: dict[int, str] = {}  # rank → token of a READY echoing its dispatch
        self.failures: Counter[str] = Counter()  # protocol failures per input
        self.deferred: set[str] = set()
        self.in_a_row: Counter[int] = Counter()  # send failures
        self.old_tokens: list[str] = []
        self.timeouts = self.recovered = self.requeued = self.deferrals = 0

    def teardown(self):
        try:
            self.coord.shutdown()
            assert self.coord.in_flight == 0 and list(self.coord.tables.transactions()) == []
            assert self.coord.shutdown() == ()
        finally:
            self.journal.close()
            self.tmp.cleanup()

    def _load(self, digest: str) -> bytes:
        if digest not in self.store:
            raise FileNotFoundError(2, "no such corpus file", digest)
        return self.store[digest]

    # -- the model's steps ---------------------------------------------------------------

    def _expect_ready(self, rank: int, token: str | None, malformed: bool) -> ReadyVerdict | None:
        if rank in self.retired:
            return None
        if rank in self.parked:
            if malformed or token != self.parked[rank]:
                return ReadyVerdict.PARKED
            del self.parked[rank]
            self.recovered += 1
            self.idle.add(rank)
            return ReadyVerdict.RECOVERED
        if malformed:
            return ReadyVerdict.MALFORMED
        if rank not in self.live:
            self.idle.add(rank)
            return ReadyVerdict.IDLE
        if token == self.live[rank].token:
            self.ready_seen[rank] = token
            return ReadyVerdict.JOIN
        return ReadyVerdict.STALE

    def _recover(self, rank: int, source: RecoverySource) -> RecoveryAction:
        """F317 §4.2: requeue the first `RETRIES` failures of an input, then defer it."""
        live = self.live.pop(rank)
        self.old_tokens.append(live.token)
        self.failures[live.work_id] += 1
        if self.failures[live.work_id] <= RETRIES:
            self.requeued += 1
            return RecoveryAction.REQUEUED
        self.deferrals += 1
        self.deferred.add(live.work_id)
        return RecoveryAction.DEFERRED

    def _join(self) -> None:
        expected = []
        for rank, token in sorted(self.invalid.items()):
            if rank in self.live and self.live[rank].token == token:
                expected.append((rank, self._recover(rank, RecoverySource.INVALID_RESULT)))
        ready = []
        for rank, token in sorted(self.ready_seen.items()):
            if rank in self.live and self.live[rank].token == token:
                expected.append((rank, self._recover(rank, RecoverySource.INVALID_RESULT)))
            if rank not in self.parked:
                ready.append(rank)
        self.invalid.clear()
        self.ready_seen.clear()
        self.idle.update(r for r in ready if r not in self.retired)
        report = self.coord.join()
        assert [(r.rank, r.action) for r in report.recoveries] == expected
        assert all(r.source is RecoverySource.INVALID_RESULT for r in report.recoveries)
        assert list(report.ready) == ready
        for _ in report.recoveries:
            event("join recovery")

    def _send(self, data):
        def send(rank: int, work: Work) -> None:
            assert rank in self.idle and rank not in self.live, f"rank {rank} is not idle"
            assert rank not in self.parked and not self.coord.gate.is_parked(rank), \
                f"parked rank {rank} got WORK"
            assert rank not in self.retired, f"retired rank {rank} got WORK"
            assert work.digest not in UNREADABLE and work.digest not in self.frontier.done
            worker = self.workers[rank]
            for digest, content in work.objects.items():
                assert hashlib.sha256(content).hexdigest() == digest
            assert work.digest in work.objects or work.digest in worker.objects, \
                "WORK without content the worker does not hold (false cache hit)"
            fault = data.draw(SEND_FAULTS)
            if fault != "lost":  # delivered, whatever the send then says
                worker.running.append(work.token)
                worker.receive(work.objects)
            if fault is not None:
                event(f"send raised, {fault}")
                self.old_tokens.append(work.token)
                self.in_a_row[rank] += 1
                if self.in_a_row[rank] >= MAX_SEND_FAILURES:
                    self.retired.add(rank)
                    self.idle.discard(rank)
                raise OSError(5, "injected WORK send failure")
            self.in_a_row.pop(rank, None)
            self.idle.discard(rank)
            self.live[rank] = Live(work.token, work.digest, self.clock.monotonic())

        return send

    def _finish_oldest(self, rank: int) -> str:
        worker = self.workers[rank]
        token = worker.running.pop(0)
        worker.last = token
        return token

    def _classify(self, rank: int, token: str) -> ResultClass:
        verdict = self.coord.classify(rank, token)
        current = rank in self.live and self.live[rank].token == token
        assert verdict is (ResultClass.CURRENT if current else ResultClass.STALE)
        event(f"RESULT {verdict.value}")
        return verdict

    # -- rules: the corpus ---------------------------------------------------------------

    @initialize(n=st.integers(1, len(IDS)), ready=st.sets(st.sampled_from(RANKS), min_size=1))
    def campaign_starts(self, n, ready):
        """Seeds in the frontier; the ranks that are up say READY(None)."""
        for i in range(n):
            self.add_input(i, False)
        for rank in sorted(ready):
            assert self.coord.ready(rank, None) is self._expect_ready(rank, None, False)

    @rule(i=st.integers(0, len(IDS) - 1), done=st.sampled_from([False, False, False, True]))
    def add_input(self, i, done):
        digest = IDS[i]
        assert self.frontier.add(digest, done=done) == (digest not in self.known)
        if digest not in self.known:
            self.known.add(digest)
            if done:
                self.done_at_start.add(digest)

    # -- rules: messages from the workers (round step 1) ---------------------------------

    @rule(rank=st.sampled_from(RANKS), kind=st.sampled_from(["last", "none", "old", "malformed"]),
          data=st.data())
    def ready(self, rank, kind, data):
        token = None
        if kind == "last":
            token = self.workers[rank].last
        elif kind == "old":
            token = data.draw(st.sampled_from(self.old_tokens + [FOREIGN]))
        self._ready(rank, token, kind, malformed=kind == "malformed")

    def _ready(self, rank: int, token: str | None, kind: str, *, malformed: bool = False) -> None:
        expected = self._expect_ready(rank, token, malformed)
        verdict = self.coord.ready(rank, token, malformed=malformed)
        assert verdict is expected, (verdict, expected)
        event(f"READY {kind}: {verdict.value if verdict else 'retired'}")

    @precondition(lambda self: any(w.running for w in self.workers.values()))
    @rule(data=st.data(), fails=st.sampled_from([None] * 6 + ["before", "after"]),
          ready=READY_AFTER)
    def worker_returns_result(self, data, fails, ready):
        """`ResultJudge` (roles/results.py), accepting branch; the commit may raise."""
        rank = data.draw(st.sampled_from([r for r in RANKS if self.workers[r].running]))
        token = self._finish_oldest(rank)
        if self._classify(rank, token) is ResultClass.CURRENT:
            self._commit(rank, token, fails)
        if ready:
            self._ready(rank, token, "after RESULT")

    def _commit(self, rank: int, token: str, fails: str | None) -> None:
        """Inside the boundary, as the master does; `fails` raises before or after the fence.
        An input already done (analysed elsewhere) must be fenced, not committed again."""
        work_id = self.live.pop(rank).work_id
        self.old_tokens.append(token)
        expected = CommitStart.FENCED if work_id in self.frontier.done else CommitStart.COMMITTING
        raises = fails == "before" or (fails == "after" and expected is CommitStart.COMMITTING)
        try:
            with self.coord.boundary(rank):
                if fails == "before":
                    raise Injected("verifying the staged files failed")
                start = self.coord.begin_commit(rank, token)
                assert start is expected, (start, expected)
                if start is CommitStart.COMMITTING:
                    if fails == "after":
                        raise Injected("triage failed")
                    self.coord.finish(rank, token)
                    self.commits[work_id] += 1
        except Injected:
            assert raises
            event(f"commit raised {fails} begin_commit")
        else:
            assert not raises
            event(f"commit: {expected.value}")
        assert not self.coord.tables.holds(rank)

    @precondition(lambda self: any(w.running for w in self.workers.values()))
    @rule(data=st.data())
    def workers_work(self, data):
        """Meanwhile, each busy worker may finish its oldest WORK (or still be at it), and
        its RESULT and READY arrive in that order."""
        for rank in RANKS:
            if not self.workers[rank].running:
                continue
            how = data.draw(st.sampled_from([None, "ok", "ok", "ok", "ok", "unusable", "lost"]))
            if how is None:
                continue
            token = self._finish_oldest(rank)
            if how != "lost" and self._classify(rank, token) is ResultClass.CURRENT:
                if how == "ok":
                    self._commit(rank, token, None)
                else:
                    assert self.coord.reject(rank, token)
                    self.invalid[rank] = token
            self._ready(rank, token, f"after {how} RESULT")

    @precondition(lambda self: any(w.running for w in self.workers.values()))
    @rule(data=st.data(), ready=READY_AFTER)
    def worker_returns_unusable_result(self, data, ready):
        """NOT_ANALYSED, or it ran other bytes: rejected, recovered at the join (F316)."""
        rank = data.draw(st.sampled_from([r for r in RANKS if self.workers[r].running]))
        token = self._finish_oldest(rank)
        if self._classify(rank, token) is ResultClass.CURRENT:
            assert self.coord.reject(rank, token)
            self.invalid[rank] = token
        else:
            assert not self.coord.reject(rank, token)
        if ready:
            self._ready(rank, token, "after unusable RESULT")

    @precondition(lambda self: any(w.running for w in self.workers.values()))
    @rule(data=st.data(), ready=READY_AFTER)
    def worker_result_is_lost(self, data, ready):
        """F316: its READY will come without the RESULT (or nothing comes: a hang)."""
        rank = data.draw(st.sampled_from([r for r in RANKS if self.workers[r].running]))
        token = self._finish_oldest(rank)
        if ready:
            self._ready(rank, token, "after lost RESULT")

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def analysed_elsewhere(self, data):
        """An input in flight is found done meanwhile (another coordinator, a replayed done
        journal): its RESULT must be fenced (F313 D4)."""
        rank = data.draw(st.sampled_from(sorted(self.live)))
        self.frontier.mark_done(self.live[rank].work_id)
        self.elsewhere.add(self.live[rank].work_id)

    @rule(rank=st.sampled_from(RANKS), data=st.data())
    def stale_result(self, rank, data):
        """An old RESULT, or one carrying another rank's live token: it changes nothing."""
        others = [live.token for r, live in self.live.items() if r != rank]
        token = data.draw(st.sampled_from(self.old_tokens + others + [FOREIGN]))
        before = self.snapshot()
        assert self._classify(rank, token) is ResultClass.STALE
        with self.coord.boundary(rank):
            assert self.coord.begin_commit(rank, token) is CommitStart.NOT_ACTIVE
        assert not self.coord.reject(rank, token)
        assert self.snapshot() == before

    @precondition(lambda self: len(self.retired) < len(RANKS) // 2)
    @rule(rank=st.sampled_from(RANKS), now=st.integers(0, 3))
    def rank_is_fatal(self, rank, now):
        if now:  # rarer than the other faults, so that most runs keep ranks to work with
            return
        self.coord.retire(rank, "FATAL: the target does not start")
        if rank not in self.retired:
            self.retired.add(rank)
            self.idle.discard(rank)
            if rank in self.live:
                self.old_tokens.append(self.live.pop(rank).token)  # requeued, not a failure

    # -- rules: time and the rest of the round -------------------------------------------

    @rule(seconds=st.sampled_from([1.0, WATCHDOG / 2, WATCHDOG]))
    def time_passes(self, seconds):
        self.clock.advance(seconds)

    @rule(data=st.data())
    def dispatch(self, data):
        """Round steps 2-3: the join always runs before the dispatch (a rank it frees gets
        work in the same round)."""
        self._join()
        self.coord.dispatch(self._send(data))
        assert not self.coord.idle or not self.frontier.pending

    @rule()
    def end_of_round(self):
        """Round steps 2 and 4: the join, then the deadline sweep (W3)."""
        self._join()
        self._sweep()

    @rule(data=st.data())
    def master_round(self, data):
        """Round steps 2-4 exactly as `Master.run` does them: join, dispatch, sweep."""
        self.dispatch(data)
        self._sweep()

    def _sweep(self) -> None:
        now = self.clock.monotonic()
        due = {r: live.token for r, live in self.live.items() if now >= live.sent_at + WATCHDOG}
        expected = []
        for rank in sorted(due):
            self.parked[rank] = due[rank]
            expected.append((rank, due[rank], self._recover(rank, RecoverySource.WATCHDOG_TIMEOUT)))
            self.timeouts += 1
        recoveries = self.coord.sweep()
        assert [(r.rank, r.token, r.action) for r in recoveries] == expected
        assert all(r.source is RecoverySource.WATCHDOG_TIMEOUT for r in recoveries)
        for _ in recoveries:
            event("watchdog timeout")

    @rule()
    def shutdown(self):
        reports = self.coord.shutdown()
        assert [r.worker for r in reports] == sorted(self.live)
        assert self.coord.in_flight == 0 and list(self.coord.tables.transactions()) == []
        assert self.coord.shutdown() == ()
        self.old_tokens.extend(live.token for live in self.live.values())
        self.live.clear()

    # -- invariants -----------------------------------------------------------------------

    def snapshot(self) -> tuple:
        return (self.in_flight(), list(self.frontier.pending), set(self.frontier.done),
                list(self.coord.idle), self.coord.parked(), set(self.coord.retired),
                self.coord.recovery.deferred())

    def in_flight(self) -> dict[int, tuple[Table, str, str]]:
        return {tx.worker: (table, tx.token, tx.work_id)
                for table, tx in self.coord.tables.transactions()}

    @invariant()
    def nothing_is_lost_or_duplicated(self):
        done = self.frontier.done
        # An input analysed elsewhere is done, whatever else still refers to it.
        places = (list(self.frontier.pending)
                  + [work_id for _, _, work_id in self.in_flight().values() if work_id not in done]
                  + list(done) + [w for w in self.coord.recovery.deferred() if w not in done]
                  + list(self.coord.unreadable))
        assert Counter(places) == Counter(self.known), "an input is lost or in two places"

    @invariant()
    def nothing_is_committed_twice(self):
        assert all(n == 1 for n in self.commits.values())
        assert set(self.commits) == self.frontier.done - self.done_at_start - self.elsewhere
        assert self.coord.statistics().committed == sum(self.commits.values())

    @invariant()
    def the_coordinator_agrees_with_the_model(self):
        assert self.in_flight() == {r: (Table.ACTIVE, live.token, live.work_id)
                                    for r, live in self.live.items()}
        assert len(set(self.coord.idle)) == len(self.coord.idle)
        assert set(self.coord.idle) == self.idle
        assert self.coord.gate.parked() == self.parked
        assert self.coord.retired == self.retired
        assert self.coord.recovery.deferred() == self.deferred

    @invariant()
    def a_rank_holds_at_most_one_transaction_and_an_idle_one_none(self):  # F313 D1
        for rank in RANKS:
            assert sum(rank in self.coord.tables.workers(t) for t in Table) <= 1
        for rank in self.coord.idle:
            assert not self.coord.tables.holds(rank)
            assert not self.coord.gate.is_parked(rank) and rank not in self.coord.retired
        for rank in self.coord.gate.parked():
            assert not self.coord.tables.holds(rank)

    @invariant()
    def deferrals_are_in_the_journal(self):
        assert self.coord.unreadable <= UNREADABLE
        journal = self.journal.deferred()
        assert set(journal) == self.deferred | self.coord.unreadable
        assert all(self.journal.is_persisted(work_id) for work_id in journal)
        for work_id in self.coord.unreadable:
            assert journal[work_id].source == UNREADABLE_SOURCE

    @invariant()
    def the_cache_never_claims_an_object_the_worker_lacks(self):  # F313 D7
        for rank in RANKS:
            assert self.coord.objects.held(rank) <= self.workers[rank].objects.keys()

    @invariant()
    def the_counters_match(self):  # F317 §4.4
        stats = self.coord.statistics()
        assert stats.watchdog_timeouts == self.timeouts
        assert stats.worker_recoveries == self.recovered
        assert stats.protocol_requeued == self.requeued
        assert stats.protocol_deferred == self.deferrals
        assert stats.parked == sorted(self.parked)
        assert stats.unreadable_inputs == len(self.coord.unreadable)


pytestmark = pytest.mark.usefixtures("quiet_dispatch_log")


TestCoordinatorMachine = pytest.mark.slow(CoordinatorMachine.TestCase)
TestCoordinatorMachine.settings = settings(max_examples=500, stateful_step_count=60,
                                           deadline=None)
