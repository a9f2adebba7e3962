"""The composed dispatch path (`dispatch.coordinator`): frontier → transaction → commit.

The parts are tested on their own in test_dispatch_transaction.py and test_watchdog.py; here
each test is one scenario of the master's round as `roles/master.py` runs it (messages, then
`join`, `dispatch`, `sweep`), with real inputs (keyed by the SHA-256 of their bytes), the real
deferred-work journal, a manual clock and a fake send that records or raises.
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest

from symcc_mpi.coverage.pruning import PruningLedger, PruningMode
from symcc_mpi.dispatch.coordinator import UNREADABLE_SOURCE, DispatchCoordinator
from symcc_mpi.dispatch.tables import CommitStart, ResultClass, Table
from symcc_mpi.dispatch.transaction import SendPhase
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

W = 100.0  # watchdog seconds
FAULT_COUNTERS = ("watchdog_timeouts", "worker_recoveries", "protocol_requeued",
                  "protocol_deferred")


def blob(i: int) -> bytes:
    return f"input-{i}\n".encode()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class FakeSend:
    """Records every WORK that went out; raises OSError on the chosen calls (1-based), or on
    every call to the chosen ranks."""

    def __init__(self):
        self.sent: list[tuple[int, Work]] = []
        self.attempts: list[tuple[int, Work]] = []
        self.fail_calls: set[int] = set()
        self.fail_ranks: set[int] = set()

    def __call__(self, rank: int, work: Work) -> None:
        self.attempts.append((rank, work))
        if len(self.attempts) in self.fail_calls or rank in self.fail_ranks:
            raise OSError(5, f"injected failure of WORK send #{len(self.attempts)}")
        self.sent.append((rank, work))

    def last(self, rank: int) -> Work:
        return [work for r, work in self.sent if r == rank][-1]


def make(tmp_path, *, inputs=3, seconds=W, retries=1, max_send_failures=3, pruning=None):
    clock = ManualClock()
    frontier = Frontier()
    store: dict[str, bytes] = {}
    loads: list[str] = []

    def load(digest: str) -> bytes:
        loads.append(digest)
        if digest not in store:
            raise FileNotFoundError(2, "no such corpus file", digest)
        return store[digest]

    journal = DeferredWorkJournal(tmp_path / "deferred.jsonl", clock=clock, fsync=False)
    coord = DispatchCoordinator(frontier, watchdog=WatchdogConfig(seconds, retries),
                                deferrals=journal, load=load, clock=clock,
                                max_send_failures=max_send_failures, pruning=pruning)
    ids = []
    for i in range(inputs):
        store[sha(blob(i))] = blob(i)
        frontier.add(sha(blob(i)))
        ids.append(sha(blob(i)))
    return SimpleNamespace(coord=coord, frontier=frontier, clock=clock, journal=journal,
                           store=store, loads=loads, send=FakeSend(), ids=ids)


def round_(w):
    """Round steps 2-4 as the master runs them: join, dispatch, sweep."""
    report = w.coord.join()
    sent = w.coord.dispatch(w.send)
    return report, sent, w.coord.sweep()


def first_dispatch(w) -> str:
    """Rank 1 asks for work and gets it; the token of that dispatch."""
    w.coord.ready(1, None)
    round_(w)
    return w.send.last(1).token


def commit(w, rank: int, token: str) -> CommitStart:
    """The accepting branch of `ResultJudge` (roles/results.py)."""
    assert w.coord.classify(rank, token) is ResultClass.CURRENT
    with w.coord.boundary(rank):
        start = w.coord.begin_commit(rank, token)
        if start is CommitStart.COMMITTING:
            w.coord.finish(rank, token)
    return start


def faults(w) -> dict[str, int]:
    stats = w.coord.statistics()
    return {name: getattr(stats, name) for name in FAULT_COUNTERS}


def no_faults() -> dict[str, int]:
    return dict.fromkeys(FAULT_COUNTERS, 0)


def snapshot(w) -> tuple:
    in_flight = {tx.worker: tx.token for _, tx in w.coord.tables.transactions()}
    return in_flight, list(w.frontier.pending), set(w.frontier.done), list(w.coord.idle)


def tables_empty(coord) -> bool:
    stats = coord.statistics()
    return coord.in_flight == 0 and (stats.preparing, stats.active,
                                     stats.committing) == (0, 0, 0)


# -- the happy path ------------------------------------------------------------------------


def test_ready_dispatch_result_commit(tmp_path):
    w = make(tmp_path, inputs=1)
    (x,) = w.ids
    assert w.coord.ready(1, None) is ReadyVerdict.IDLE
    assert round_(w)[1] == 1
    (rank, work), = w.send.sent
    assert rank == 1 and work.digest == x
    assert work.objects == {x: blob(0)}  # the input travels as a content-addressed object
    assert w.coord.work_of(1) == x and w.coord.in_flight == 1 and not w.coord.exhausted
    assert w.coord.classify(1, work.token) is ResultClass.CURRENT
    with w.coord.boundary(1):
        assert w.coord.begin_commit(1, work.token) is CommitStart.COMMITTING
        assert w.coord.tables.find(1)[0] is Table.COMMITTING
        w.coord.finish(1, work.token)
    assert w.frontier.done == {x} and w.coord.in_flight == 0 and w.coord.exhausted
    assert w.coord.ready(1, work.token) is ReadyVerdict.IDLE  # its READY after the RESULT
    stats = w.coord.statistics()
    assert (stats.dispatched, stats.committed, stats.objects_shipped) == (1, 1, 1)
    assert stats.object_bytes_shipped == len(blob(0))


def test_a_fault_free_campaign_counts_no_fault(tmp_path):  # F317 §4.4
    w = make(tmp_path, inputs=5)
    for rank in (1, 2):
        w.coord.ready(rank, None)
    while not w.coord.exhausted:
        round_(w)
        for rank in (1, 2):
            tx = w.coord.tables.get(Table.ACTIVE, rank)
            if tx is not None:
                commit(w, rank, tx.token)
                w.coord.ready(rank, tx.token)
    assert w.frontier.done == set(w.ids) and faults(w) == no_faults()
    stats = w.coord.statistics()
    assert (stats.committed, stats.send_failures, stats.invalid_results,
            stats.stale_results, stats.stale_ready, stats.ready_quarantined,
            stats.inputs_dispatched_again) == (5, 0, 0, 0, 0, 0, 0)
    assert w.journal.deferred() == {}


# -- sends that raise: rolled back before the send (F313 D3) -------------------------------


def test_a_failed_send_puts_the_input_back_in_front_and_the_rank_tries_again(tmp_path):
    w = make(tmp_path)
    x, y, z = w.ids
    w.send.fail_calls = {1}
    w.coord.ready(1, None)
    assert w.coord.dispatch(w.send) == 1  # the rank was idle again and got the retry
    assert [(r, work.digest) for r, work in w.send.attempts] == [(1, x), (1, x)]
    assert list(w.frontier.pending) == [y, z]  # x was put back first in line, exactly
    stats = w.coord.statistics()
    assert (stats.send_failures, stats.rolled_back_before_send, stats.dispatched,
            stats.inputs_dispatched_again) == (1, 1, 1, 0)
    assert w.coord.retired == set() and faults(w) == no_faults()


def test_a_rank_whose_sends_keep_failing_is_retired_and_its_work_is_not_lost(tmp_path):
    w = make(tmp_path)
    x, y, z = w.ids
    w.send.fail_ranks = {1}
    w.coord.ready(1, None)
    w.coord.ready(2, None)
    assert w.coord.dispatch(w.send) == 1
    assert w.coord.statistics().retired == [1] and w.coord.parked() == []
    assert [r for r, _ in w.send.attempts].count(1) == 3  # MAX_SEND_FAILURES in a row
    assert [(r, work.digest) for r, work in w.send.sent] == [(2, x)]
    assert list(w.frontier.pending) == [y, z] and 1 not in w.coord.idle
    assert w.coord.ready(1, None) is None  # a retired rank's READY is ignored
    commit(w, 2, w.send.last(2).token)
    w.coord.ready(2, w.send.last(2).token)
    round_(w)
    assert [(r, work.digest) for r, work in w.send.sent] == [(2, x), (2, y)]  # not rank 1


def test_a_send_that_returned_breaks_the_run_of_failures(tmp_path):
    w = make(tmp_path, max_send_failures=3)
    w.send.fail_calls = {1, 2, 4, 5}
    w.coord.ready(1, None)
    w.coord.dispatch(w.send)  # fails twice, then call 3 returns
    token = w.send.last(1).token
    assert w.coord.ready(1, token) is ReadyVerdict.JOIN  # its RESULT was lost
    round_(w)  # joined and requeued; fails twice more, then call 6 returns
    assert w.coord.retired == set() and len(w.send.sent) == 2 and w.coord.in_flight == 1
    assert w.coord.statistics().send_failures == 4


# -- the object cache (F313 §3.5, D7) --------------------------------------------------------


def test_a_failed_send_does_not_make_the_worker_hold_the_object(tmp_path):
    w = make(tmp_path, inputs=1)
    (x,) = w.ids
    w.send.fail_calls = {1}
    w.coord.ready(1, None)
    w.coord.dispatch(w.send)
    failed, retried = (work for _, work in w.send.attempts)
    assert failed.objects == {x: blob(0)} and retried.objects == {x: blob(0)}
    assert failed.token != retried.token
    stats = w.coord.statistics()
    assert (stats.objects_shipped, stats.object_hits) == (1, 0)


def test_a_worker_that_got_the_object_is_not_sent_it_again(tmp_path):
    w = make(tmp_path, inputs=1)
    (x,) = w.ids
    w.coord.ready(1, None)
    round_(w)
    first = w.send.last(1)
    assert first.objects == {x: blob(0)}
    w.coord.ready(1, first.token)  # no RESULT: joined, requeued, the rank is idle
    round_(w)
    again = w.send.last(1)
    assert again.digest == x and again.token != first.token
    assert again.objects == {}  # cache hit: the worker holds x already
    assert w.loads == [x]  # not even loaded again
    stats = w.coord.statistics()
    assert (stats.objects_shipped, stats.object_hits,
            stats.inputs_dispatched_again) == (1, 1, 1)


# -- inputs that cannot be sent --------------------------------------------------------------


@pytest.mark.parametrize("damage", ["missing", "other-bytes"])
def test_an_unreadable_input_is_set_aside_and_the_rank_gets_the_next(tmp_path, damage):
    w = make(tmp_path)
    x, y, z = w.ids
    if damage == "missing":
        del w.store[x]  # load raises FileNotFoundError
    else:
        w.store[x] = b"not input-0\n"  # bytes whose hash is not the id
    w.coord.ready(1, None)
    assert w.coord.dispatch(w.send) == 1
    assert [(r, work.digest) for r, work in w.send.attempts] == [(1, y)]
    assert list(w.frontier.pending) == [z] and x not in w.frontier.done
    (deferred,) = w.journal.deferred().values()
    assert (deferred.work_id, deferred.source) == (x, UNREADABLE_SOURCE)
    assert w.journal.is_persisted(x)
    stats = w.coord.statistics()
    assert (stats.unreadable_inputs, stats.send_failures, stats.dispatched) == (1, 0, 1)
    assert faults(w) == no_faults()  # not a protocol deferral


def test_an_unreadable_input_whose_bytes_are_published_again_goes_out_again(tmp_path):
    w = make(tmp_path, inputs=2)
    x, y = w.ids
    good = w.store.pop(x)
    w.coord.ready(1, None)
    w.coord.dispatch(w.send)
    w.coord.readmit(y)  # not set aside: nothing to do (it is in flight)
    w.store[x] = good  # a parent analysed again yielded it again (commit.py)
    w.coord.readmit(x)
    commit(w, 1, w.send.last(1).token)
    w.coord.ready(1, w.send.last(1).token)
    round_(w)
    assert [work.digest for _, work in w.send.sent] == [y, x]
    assert w.coord.statistics().unreadable_inputs == 0 and not w.frontier.pending


# -- RESULT classification (F315) ------------------------------------------------------------


def test_stale_and_foreign_results_change_nothing(tmp_path):
    w = make(tmp_path)
    for rank in (1, 2):
        w.coord.ready(rank, None)
    round_(w)
    old = w.send.last(1).token
    commit(w, 1, old)
    w.coord.ready(1, old)
    round_(w)
    current, other = w.send.last(1).token, w.send.last(2).token
    before = snapshot(w)
    for rank, token in [(1, old), (1, other), (2, current), (1, "f" * 32), (3, current)]:
        assert w.coord.classify(rank, token) is ResultClass.STALE
        assert w.coord.begin_commit(rank, token) is CommitStart.NOT_ACTIVE
    assert snapshot(w) == before and before[0] == {1: current, 2: other}
    assert not w.coord.reject(1, old)  # a stale RESULT is not even an invalid one
    stats = w.coord.statistics()
    assert (stats.stale_results, stats.committed, stats.invalid_results) == (5, 1, 0)
    assert faults(w) == no_faults()


# -- the F316 join ---------------------------------------------------------------------------


def test_an_unusable_result_is_requeued_once_then_deferred(tmp_path):  # F316, F317 §5.3
    w = make(tmp_path, inputs=1, retries=1)
    (x,) = w.ids
    first = first_dispatch(w)
    assert w.coord.reject(1, first)  # NOT_ANALYSED, or it ran other bytes
    assert w.coord.ready(1, first) is ReadyVerdict.JOIN
    report = w.coord.join()
    (recovery,), ready = report.recoveries, report.ready
    assert (recovery.work_id, recovery.source, recovery.action) == (
        x, RecoverySource.INVALID_RESULT, RecoveryAction.REQUEUED)
    assert ready == (1,) and list(w.frontier.pending) == [x] and list(w.coord.idle) == [1]
    assert faults(w) == {**no_faults(), "protocol_requeued": 1}

    w.coord.dispatch(w.send)
    second = w.send.last(1).token
    assert second != first and w.coord.reject(1, second)
    w.coord.ready(1, second)
    report = w.coord.join()
    (recovery,), ready = report.recoveries, report.ready
    assert recovery.action is RecoveryAction.DEFERRED and recovery.failures == 2
    assert ready == (1,) and list(w.coord.idle) == [1]
    assert not w.frontier.pending and x not in w.frontier.done and w.coord.exhausted
    assert w.journal.deferred()[x].source == RecoverySource.INVALID_RESULT.value
    assert w.journal.is_persisted(x)
    assert faults(w) == {**no_faults(), "protocol_requeued": 1, "protocol_deferred": 1}
    stats = w.coord.statistics()
    assert (stats.invalid_results, stats.invalid_joins) == (2, 2)
    assert w.coord.dispatch(w.send) == 0


def test_a_ready_without_its_result_is_joined(tmp_path):  # F316
    w = make(tmp_path, inputs=2)
    x, y = w.ids
    token = first_dispatch(w)
    assert w.coord.ready(1, token) is ReadyVerdict.JOIN
    assert w.coord.in_flight == 1 and 1 not in w.coord.idle  # the join decides, not READY
    report = w.coord.join()
    (recovery,), ready = report.recoveries, report.ready
    assert recovery.source is RecoverySource.INVALID_RESULT
    assert recovery.rollback.phase is SendPhase.AFTER_SEND
    assert ready == (1,) and list(w.coord.idle) == [1]
    assert list(w.frontier.pending) == [x, y] and w.coord.in_flight == 0  # x first: soon
    assert w.coord.dispatch(w.send) == 1 and w.send.last(1).digest == x
    assert faults(w) == {**no_faults(), "protocol_requeued": 1}


def test_ready_with_another_token_while_holding_a_dispatch_is_stale(tmp_path):
    w = make(tmp_path)
    w.coord.ready(1, None)
    round_(w)
    assert w.coord.ready(1, None) is ReadyVerdict.STALE
    assert w.coord.ready(1, "e" * 32) is ReadyVerdict.STALE
    assert w.coord.ready(1, None, malformed=True) is ReadyVerdict.MALFORMED
    round_(w)
    assert w.coord.in_flight == 1 and len(w.send.sent) == 1 and not w.coord.idle
    assert w.coord.statistics().stale_ready == 2 and faults(w) == no_faults()


# -- the F317 watchdog -----------------------------------------------------------------------


def test_a_timed_out_rank_is_parked_until_its_exact_ready(tmp_path):  # F317 W6-W8
    w = make(tmp_path, inputs=2)
    x, y = w.ids
    retired = first_dispatch(w)
    w.clock.advance(W - 1)
    assert round_(w)[2] == ()
    w.clock.advance(1)
    *_, (timeout,) = round_(w)
    assert (timeout.rank, timeout.token, timeout.work_id) == (1, retired, x)
    assert timeout.source is RecoverySource.WATCHDOG_TIMEOUT
    assert w.coord.parked() == [1] and list(w.frontier.pending) == [x, y]
    assert 1 not in w.coord.idle and w.coord.in_flight == 0
    assert faults(w) == {**no_faults(), "watchdog_timeouts": 1, "protocol_requeued": 1}

    for token, malformed in [(None, False), ("e" * 32, False), (None, True)]:
        assert w.coord.ready(1, token, malformed=malformed) is ReadyVerdict.PARKED
        assert round_(w)[1] == 0  # work waits; the parked rank gets none
    assert w.coord.classify(1, retired) is ResultClass.STALE  # its late RESULT (W8)
    assert w.coord.begin_commit(1, retired) is CommitStart.NOT_ACTIVE
    assert len(w.send.sent) == 1 and w.coord.parked() == [1]
    assert w.coord.statistics().ready_quarantined == 3

    assert w.coord.ready(1, retired) is ReadyVerdict.RECOVERED  # W7
    assert round_(w)[1] == 1 and w.send.last(1).digest == x
    assert w.coord.parked() == []
    assert faults(w) == {**no_faults(), "watchdog_timeouts": 1, "worker_recoveries": 1,
                         "protocol_requeued": 1}


def test_a_ready_seen_this_round_keeps_the_sweep_off(tmp_path):  # F317 W3
    w = make(tmp_path, inputs=1)
    (x,) = w.ids
    token = first_dispatch(w)
    w.clock.advance(2 * W)  # long past the deadline...
    assert w.coord.ready(1, token) is ReadyVerdict.JOIN  # ...but its READY came this round
    report, sent, timeouts = round_(w)
    assert timeouts == () and w.coord.parked() == []
    assert [r.source for r in report.recoveries] == [RecoverySource.INVALID_RESULT]
    assert sent == 1 and w.send.last(1).digest == x  # the rank works on at once
    assert faults(w) == {**no_faults(), "protocol_requeued": 1}


def test_a_result_drained_before_the_sweep_is_committed_not_timed_out(tmp_path):  # W3
    w = make(tmp_path, inputs=1)
    token = first_dispatch(w)
    w.clock.advance(2 * W)
    assert commit(w, 1, token) is CommitStart.COMMITTING
    assert round_(w)[2] == () and w.coord.exhausted and faults(w) == no_faults()


# -- the commit ------------------------------------------------------------------------------


def test_an_input_already_done_is_fenced_not_committed_twice(tmp_path):  # F313 D4
    w = make(tmp_path, inputs=1)
    (x,) = w.ids
    token = first_dispatch(w)
    w.frontier.mark_done(x)  # analysed meanwhile, elsewhere
    assert commit(w, 1, token) is CommitStart.FENCED
    stats = w.coord.statistics()
    assert (stats.fenced, stats.committed, stats.rolled_back_after_send) == (1, 0, 1)
    assert tables_empty(w.coord) and not w.frontier.pending  # not requeued: it is done
    assert w.coord.classify(1, token) is ResultClass.STALE


@pytest.mark.parametrize("after_begin_commit", [False, True])
def test_an_exception_in_the_commit_rolls_back_and_propagates(tmp_path, after_begin_commit):
    w = make(tmp_path, inputs=2)
    x, y = w.ids
    token = first_dispatch(w)
    with pytest.raises(OSError, match="disk full"), w.coord.boundary(1):
        if after_begin_commit:
            assert w.coord.begin_commit(1, token) is CommitStart.COMMITTING
        raise OSError(28, "disk full")
    assert tables_empty(w.coord)
    stats = w.coord.statistics()
    assert (stats.committed, stats.rolled_back_after_send) == (0, 1)
    assert x not in w.frontier.done and list(w.frontier.pending) == [x, y]  # not lost
    assert w.coord.classify(1, token) is ResultClass.STALE


def test_retire_gives_back_what_the_rank_held(tmp_path):  # FATAL
    w = make(tmp_path, inputs=2)
    x, y = w.ids
    w.coord.ready(1, None)
    round_(w)
    w.coord.retire(1, "the target does not start")
    assert tables_empty(w.coord) and list(w.frontier.pending) == [x, y]
    assert w.coord.ready(1, w.send.last(1).token) is None
    w.coord.ready(2, None)
    round_(w)
    assert [r for r, _ in w.send.sent] == [1, 2] and w.send.last(2).digest == x


# -- shutdown --------------------------------------------------------------------------------


def test_shutdown_compensates_what_is_in_flight(tmp_path):
    w = make(tmp_path, inputs=3)
    x, y, z = w.ids
    for rank in (1, 2):
        w.coord.ready(rank, None)
    round_(w)
    tokens = [w.send.last(rank).token for rank in (1, 2)]
    reports = w.coord.shutdown()
    assert [r.worker for r in reports] == [1, 2]
    assert tables_empty(w.coord) and w.coord.in_flight == 0
    assert sorted(w.frontier.pending) == sorted([x, y, z]) and not w.frontier.done
    assert w.coord.shutdown() == ()  # safe twice
    for rank, token in zip((1, 2), tokens, strict=True):
        assert w.coord.classify(rank, token) is ResultClass.STALE
    assert faults(w) == no_faults()


def test_a_seed_is_analysed_unpruned_once_and_only_whole_and_in_the_first_epoch(tmp_path):
    w = make(tmp_path, inputs=4, pruning=PruningLedger(PruningMode.SHARED))
    seed, child = w.ids[0], w.ids[1]
    w.coord.seeds.add(seed)
    for rank in (1, 2):
        w.coord.ready(rank, None)
    round_(w)
    assert {w.send.last(1).digest: w.send.last(1).pruned,
            w.send.last(2).digest: w.send.last(2).pruned} == {seed: False, child: True}
    w.coord.epoch = 1  # a new epoch analyses the corpus again: pruned, the seeds too
    w.frontier.add(w.ids[2])
    w.coord.seeds.add(w.ids[2])
    commit(w, 1, w.send.last(1).token)
    w.coord.ready(1, w.send.last(1).token)
    round_(w)
    assert w.send.last(1).digest == w.ids[2] and w.send.last(1).pruned


def test_without_pruning_every_work_goes_out_as_it_is(tmp_path):
    w = make(tmp_path)
    w.coord.seeds.add(w.ids[0])
    first_dispatch(w)
    assert w.send.last(1).digest == w.ids[0] and w.send.last(1).pruned
