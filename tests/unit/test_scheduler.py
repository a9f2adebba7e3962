"""The master's dispatch state machine, without MPI."""

from symcc_mpi.protocol import Result
from symcc_mpi.scheduler import Scheduler, Verdict


def digest(i: int) -> str:
    return f"{i:064x}"


def result_for(dispatch, *, token=None, input_hash=None) -> Result:
    return Result(token=token or dispatch.token, input_hash=input_hash or dispatch.input_hash,
                  outcome="ok", exit_status=0, wall_time=0.0, solver_time=0.0, staged=[],
                  generated=0)


def test_an_input_is_known_once():
    s = Scheduler()
    assert s.add_input(digest(1))
    assert not s.add_input(digest(1))
    assert list(s.frontier) == [digest(1)]


def test_dispatch_needs_an_idle_worker_and_work():
    s = Scheduler()
    s.add_input(digest(1))
    assert s.next_dispatches() == []
    s.worker_ready(1, None)
    (d,) = s.next_dispatches()
    assert (d.rank, d.input_hash) == (1, digest(1))
    assert s.active == {1: d}


def test_tokens_are_unique_per_dispatch():
    s = Scheduler()
    for i in range(50):
        s.add_input(digest(i))
    tokens = set()
    for _ in range(50):
        s.worker_ready(1, None)
        (d,) = s.next_dispatches()
        tokens.add(d.token)
        s.judge_result(1, result_for(d))
    assert len(tokens) == 50


def test_stale_token_is_dropped_and_changes_nothing():
    s = Scheduler()
    s.add_input(digest(1))
    s.worker_ready(1, None)
    (d,) = s.next_dispatches()
    assert s.judge_result(1, result_for(d, token="f" * 32)) is Verdict.STALE
    assert s.judge_result(2, result_for(d)) is Verdict.STALE  # foreign rank
    assert s.active == {1: d}
    assert s.stats.stale_results == 2
    assert s.judge_result(1, result_for(d)) is Verdict.ACCEPT
    assert s.judge_result(1, result_for(d)) is Verdict.STALE  # a duplicate is late


def test_hash_mismatch_requeues():
    s = Scheduler()
    s.add_input(digest(1))
    s.worker_ready(1, None)
    (d,) = s.next_dispatches()
    assert s.judge_result(1, result_for(d, input_hash=digest(9))) is Verdict.HASH_MISMATCH
    assert list(s.frontier) == [digest(1)]


def test_ready_with_current_token_joins_a_lost_result():
    s = Scheduler()
    s.add_input(digest(1))
    s.worker_ready(1, None)
    (d,) = s.next_dispatches()
    s.worker_ready(1, d.token)  # its RESULT was malformed and dropped
    assert list(s.frontier) == [digest(1)]
    assert s.stats.ready_without_result == 1
    assert list(s.idle) == [1]


def test_repeated_failure_defers_instead_of_looping():
    s = Scheduler(max_attempts=2)
    s.add_input(digest(1))
    for _ in range(2):
        s.worker_ready(1, None)
        (d,) = s.next_dispatches()
        s.judge_result(1, result_for(d, input_hash=digest(2)))
    assert s.deferred == [digest(1)]
    assert s.exhausted


def test_send_failure_is_an_exact_undo():
    s = Scheduler()
    s.add_input(digest(1))
    s.worker_ready(1, None)
    (d,) = s.next_dispatches()
    s.send_failed(d)
    assert s.attempts[digest(1)] == 0 and s.stats.dispatched == 0
    assert list(s.frontier) == [digest(1)] and not s.active


def test_retired_rank_gets_nothing_and_returns_its_work():
    s = Scheduler()
    s.add_input(digest(1))
    s.worker_ready(1, None)
    s.next_dispatches()
    s.retire(1)
    s.worker_ready(1, None)
    assert not s.idle and list(s.frontier) == [digest(1)]


def test_lost_result_is_returned_for_cleanup():
    s = Scheduler()
    s.add_input(digest(1))
    s.worker_ready(1, None)
    (d,) = s.next_dispatches()
    assert s.is_active_token(d.token)
    assert s.worker_ready(1, d.token) == d
    assert not s.is_active_token(d.token)
    assert s.worker_ready(1, d.token) is None
