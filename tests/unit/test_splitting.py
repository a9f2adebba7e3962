"""splitting.WorkSource: whole inputs, traces and target groups; local reserve and the
shared admission (F311 §6–7, regression cases 4, 5 and 7 of §10)."""

from __future__ import annotations

import array
import hashlib
from dataclasses import replace

import pytest

from symcc_mpi.coverage.pruning import Delta, PruningLedger, PruningMode
from symcc_mpi.dispatch.coordinator import DispatchCoordinator
from symcc_mpi.dispatch.tables import CommitStart
from symcc_mpi.dispatch.watchdog import WatchdogConfig
from symcc_mpi.durable.deferred import DeferredWorkJournal
from symcc_mpi.scheduling.frontier import Frontier
from symcc_mpi.scheduling.splitting import (
    MAX_GROUP,
    SPLIT_ANEW,
    TRACE,
    Job,
    WorkSource,
    deal,
    keep_targets,
    parse_work_id,
    part_id,
)
from symcc_mpi.wire.protocol import Work


def digest(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


A, B, C = digest("a"), digest("b"), digest("c")


def source_with(*inputs: str, **options) -> WorkSource:
    frontier = Frontier()
    for d in inputs:
        frontier.add(d)
    return WorkSource(frontier, split=True, **options)


def split(source: WorkSource, d: str, targets, free: int) -> list[str]:
    """Trace `d` and commit the trace with `targets` on its path: its groups' ids."""
    trace = source.peek(free)
    assert trace == part_id(d, TRACE)
    source.take(trace)
    source.finish(trace, targets, (), free)
    return [w for w in source.waiting if parse_work_id(w)[0] == d]


def test_work_ids():
    assert parse_work_id(A) == (A, None)
    assert parse_work_id(part_id(A, 3)) == (A, 3)


@pytest.mark.parametrize(("count", "groups", "sizes"), [
    (10, 3, [4, 3, 3]), (2, 4, [1, 1]), (0, 3, []), (130, 1, [44, 43, 43]),
])
def test_deal_is_round_robin_without_empty_groups_and_at_most_64(count, groups, sizes):
    dealt = deal(range(1, count + 1), groups)
    assert [len(g) for g in dealt] == sizes
    assert sorted(t for g in dealt for t in g) == list(range(1, count + 1))
    assert all(len(g) <= MAX_GROUP for g in dealt)
    if dealt and len(dealt[0]) > 1:
        assert dealt[0][:2] == (1, 1 + len(dealt))  # round-robin, not contiguous


def test_a_thin_frontier_traces_and_a_wide_one_does_not():
    source = source_with(A, B)
    assert source.peek(free=3) == part_id(A, TRACE)  # 2 inputs, 3 free workers
    assert source.peek(free=2) == A
    assert source.peek(free=1) == A  # one worker: nothing to split with
    assert WorkSource(source.frontier, split=False).peek(free=8) == A


def test_an_input_is_done_only_when_its_last_group_commits():
    source = source_with(A)
    groups = split(source, A, [11, 22, 33, 44, 55], free=2)
    assert [source.job(g) for g in groups] == [(A, (11, 33, 55)), (A, (22, 44))]
    assert A not in source.frontier.done and not source.completes_input(groups[0], None)
    first = source.peek(free=2)
    source.take(first)
    second = source.peek(free=1)
    source.take(second)
    source.finish(first, None, (11, 33), free=1)
    assert A not in source.frontier.done and source.completes_input(second, None)
    source.finish(second, None, (22,), free=2)
    assert A in source.frontier.done and not source.has_pending
    assert source.stats.figures()["targets_solved"] == 3
    assert source.is_done(first) and source.is_done(second)


def test_a_trace_with_no_targets_completes_its_input():
    source = source_with(A)
    trace = source.peek(free=2)
    assert source.completes_input(trace, []) and source.completes_input(trace, None)
    source.take(trace)
    source.finish(trace, [], (), free=2)
    assert A in source.frontier.done and not source.open


def test_a_group_whose_target_is_in_flight_waits_and_the_next_goes_out():
    source = source_with(A, B)
    groups = split(source, A, [1, 2, 3, 4], free=3)
    assert [source.job(g)[1] for g in groups] == [(1, 4), (2,), (3,)]
    for work in groups:
        assert source.peek(free=3) == work
        source.take(work)
    b_group, = split(source, B, [3], free=2)  # target 3: in A's last group, in flight
    assert source.peek(free=1) is None
    assert source.stats.local_conflicts == 1
    source.finish(groups[2], None, (3,), free=1)
    assert source.peek(free=1) == b_group


def test_put_back_undoes_take_exactly_and_requeue_goes_first():
    source = source_with(A)
    groups = split(source, A, [1, 2, 3], free=3)
    work = source.peek(free=3)
    source.take(work)
    source.put_back(work)
    assert list(source.waiting) == groups and not source.reserved and not source.in_flight
    assert source.stats.split_dispatches == 0
    for w in groups:
        assert source.peek(free=3) == w
        source.take(w)
    source.requeue(groups[2])
    assert source.peek(free=1) == groups[2]


def test_set_aside_drops_the_input_s_other_parts():
    source = source_with(A)
    groups = split(source, A, [1, 2, 3], free=3)
    source.take(source.peek(free=3))
    assert source.set_aside(groups[1]) == A
    assert not source.waiting and not source.reserved and A not in source.open
    assert A not in source.frontier.done  # deferred, not analysed


def test_an_input_back_in_the_frontier_while_its_parts_are_out_is_not_traced_again():
    source = source_with(A, B)
    groups = split(source, A, [1, 2, 3], free=3)
    source.frontier.requeue(A)  # its expired lease recovered by this same master
    for group in groups:
        assert source.peek(free=3) == group
        source.take(group)
    assert source.peek(free=3) == part_id(B, TRACE)
    assert source.open[A] == {1, 2, 3} and sorted(source.groups) == sorted(groups)


def test_a_group_whose_input_cannot_be_read_is_discarded_with_no_dispatch_counted():
    source = source_with(A)
    groups = split(source, A, [1, 2, 3], free=3)
    assert source.peek(free=3) == groups[0]
    source.discard(groups[0])  # F313 D3: nothing went out, so nothing is counted
    assert source.stats.split_dispatches == 0
    assert not source.waiting and not source.reserved and A not in source.open


def test_a_deferred_part_takes_back_the_parts_its_input_committed(tmp_path):
    # F317 §4.2: the input goes whole to the deferred journal. Its trace and first group
    # committed already: on record as taken back now, they go out again when a resume splits
    # it anew (a snapshot taken meanwhile leaves their commits unread).
    source = source_with(A)
    announced = []
    coordinator = DispatchCoordinator(
        source.frontier, watchdog=WatchdogConfig(seconds=60.0, protocol_retries=0),
        deferrals=DeferredWorkJournal(tmp_path / "deferred.jsonl", fsync=False),
        load=lambda d: b"a", source=source,
        on_requeue=lambda work, why: announced.append((work, why)))
    coordinator.workers = 1
    groups = split(source, A, [1, 2, 3, 4], free=2)
    source.take(source.peek(free=1))
    source.finish(groups[0], None, (1, 3), free=1)
    assert source.committed_parts(groups[1]) == [part_id(A, TRACE), groups[0]]
    coordinator.ready(1, None)
    sent: list[Work] = []
    assert coordinator.dispatch(lambda rank, work: sent.append(work)) == 1
    assert coordinator.reject(1, sent[0].token)
    coordinator.ready(1, sent[0].token)
    coordinator.join()
    assert announced == [(groups[1], "deferred"), (part_id(A, TRACE), SPLIT_ANEW),
                         (groups[0], SPLIT_ANEW)]
    assert not source.open and not source.committed and A not in source.frontier.done
    assert source.committed_parts(groups[1]) == []


class _LeaseLostAfterDispatch:
    """Several masters' admission (coordinator.Admission): every input admitted, then its
    lease taken over by another master before the result commits."""

    held = True

    def claim_ahead(self, pending, count):
        pass

    def admit(self, digest):
        return True

    def holds(self, digest):
        return self.held

    def begin_commit(self, digest, pending=(), count=0):
        return self.held

    def fence(self, digests, pending=(), count=0):
        return frozenset()

    def complete(self, digest):
        pass

    def abandon(self, digest):
        pass


def test_a_part_fenced_by_a_lost_lease_takes_back_the_parts_its_input_committed():
    # Found by the simulation (seed 1466): the input came back to this master, which split it
    # anew and sent its trace again with no take-back of the first trace on record (verify).
    source = source_with(A)
    announced = []
    admission = _LeaseLostAfterDispatch()
    coordinator = DispatchCoordinator(
        source.frontier, watchdog=WatchdogConfig(seconds=60.0, protocol_retries=0),
        deferrals=None,
        load=lambda d: b"a", source=source, admission=admission,
        on_requeue=lambda work, why: announced.append((work, why)))
    coordinator.workers = 1
    groups = split(source, A, [1, 2, 3, 4], free=2)
    source.take(source.peek(free=1))
    source.finish(groups[0], None, (1, 3), free=1)
    coordinator.ready(1, None)
    sent: list[Work] = []
    assert coordinator.dispatch(lambda rank, work: sent.append(work)) == 1
    admission.held = False
    assert coordinator.begin_commit(1, sent[0].token, completes_input=False) \
        is CommitStart.FENCED
    assert announced == [(groups[1], "analysed, whose lease another master took over"),
                         (part_id(A, TRACE), SPLIT_ANEW), (groups[0], SPLIT_ANEW)]
    assert not source.open and not source.committed


def test_a_master_that_withdraws_gives_up_its_split_inputs_and_their_claims():
    released = []
    source = source_with(A, B, shared_admission=lambda w, t, r: True,
                         on_release=released.append)
    groups = split(source, A, [1, 2, 3], free=3)
    assert source.peek(free=3) == groups[0]  # admitted: its claim held
    assert source.give_up_splits() == [A]
    assert released == [groups[0]]
    assert not source.waiting and not source.open and not source.groups
    assert not source.reserved and source.peeked is None
    assert A not in source.frontier.done  # its new owner analyses it whole
    assert source.give_up_splits() == []


def test_a_trace_taken_back_after_its_send_lets_the_input_be_split_anew():
    source = source_with(A)
    trace = source.peek(free=2)
    source.take(trace)
    source.requeue(trace)
    assert A not in source.open and source.peek(free=2) == trace


# -- F311 §10, the admission cases ------------------------------------------------------------


def test_f311_4_shared_refusal_of_target_77_is_backfilled_by_target_88_with_nothing_committed():
    refused = []

    def shared(work_id, targets, worker):
        if 77 in targets:
            refused.append(work_id)
            return False
        return True

    source = source_with(A, B, shared_admission=shared)
    rejected, = split(source, A, [77], free=3)
    accepted, = split(source, B, [88], free=3)  # B's trace itself backfilled the refusal
    for _ in range(3):  # refused again and again, and backfilled each time
        assert source.peek(free=1) == accepted
    source.take(accepted)
    assert refused == [rejected] * 4
    # The refused group: no attempt, no reserve, still first in line; its input not done.
    assert source.dispatches[rejected] == 0 and source.note_dispatch(accepted) == 1
    assert list(source.waiting) == [rejected] and not source.reserved[77]
    assert A not in source.frontier.done
    assert source.stats.shared_conflicts == 4 and source.stats.backfills == 4
    assert source.stats.split_dispatches == 1


def test_f311_4_with_a_proposal_limit_of_one_a_refusal_is_not_backfilled():
    source = source_with(A, B, shared_admission=lambda w, t, r: 77 not in t,
                         proposal_limit=1)
    split(source, A, [77], free=3)
    split(source, B, [88], free=3)
    assert source.peek(free=1) is None  # F310's problem: the worker would idle


def test_f311_5_after_every_group_is_refused_the_frontier_s_input_goes_out_and_no_cursor_moves():
    source = source_with(A, B, C, shared_admission=lambda w, t, r: False)
    groups = split(source, A, [1, 2], free=4)
    before = (list(source.waiting), dict(source.dispatches), source.stats.split_dispatches)
    work = source.peek(free=2)
    assert work == B  # the fallback: the next input, whole (2 waiting, 2 free: no trace)
    assert (list(source.waiting), dict(source.dispatches),
            source.stats.split_dispatches) == before
    assert not source.reserved and not source.in_flight and source.peeked is None
    assert list(source.frontier.pending) == [B, C]  # nothing taken before `take`
    assert groups == before[0]


def test_a_claim_peeked_and_not_taken_is_released_at_the_next_peek():
    released = []
    source = source_with(A, shared_admission=lambda w, t, r: True,
                         on_release=released.append)
    groups = split(source, A, [1, 2], free=2)
    assert source.peek(free=2) == groups[0]
    assert source.peek(free=2) == groups[0]  # the first claim let go, then made again
    assert released == [groups[0]]
    source.take(groups[0])
    source.finish(groups[0], None, (1,), free=2)
    assert released == [groups[0], groups[0]]


def test_f311_7_an_adjuster_may_change_parameters_never_the_targets():
    frontier = Frontier()
    frontier.add(A)
    source = WorkSource(frontier, split=True)
    ledger = PruningLedger(PruningMode.SHARED)
    ledger.merge(3, Delta(array.array("I", [7]).tobytes(), b"\x01"))  # bits worker 1 lacks
    coordinator = DispatchCoordinator(
        frontier, watchdog=WatchdogConfig(seconds=60.0, protocol_retries=1), deferrals=None,
        load=lambda d: b"a", source=source, pruning=ledger)
    coordinator.workers = 2
    coordinator.adjusters.append(lambda rank, job: replace(job, targets=(999,)))  # a hint
    sent: list[Work] = []
    coordinator.ready(1, None)
    coordinator.ready(2, None)
    assert coordinator.dispatch(lambda rank, work: sent.append(work)) == 1
    assert sent[0].targets == []  # the trace stays a trace
    assert sent[0].pruning  # what the pruning adjuster attached stays attached
    adjusted = keep_targets(Job("w", A, (999,), shipment="strategy"), (1, 2))
    assert adjusted.targets == (1, 2) and adjusted.shipment == "strategy"
    assert keep_targets(Job("w", A, (999,)), None).targets is None
