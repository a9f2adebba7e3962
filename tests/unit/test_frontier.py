"""The frontier (`frontier.Frontier`): pending order, known/done views, per-input state."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from symcc_mpi.scheduling import frontier as frontier_module
from symcc_mpi.scheduling.frontier import Frontier, FrontierStatistics


def d(i: int) -> str:
    return hashlib.sha256(b"input %d" % i).hexdigest()


def test_add_is_fifo_and_a_known_digest_is_a_no_op():
    f = Frontier()
    assert f.add(d(1)) and f.add(d(2)) and f.add(d(3))
    assert not f.add(d(2)) and not f.add(d(1), done=True)  # known: nothing changes
    assert list(f.pending) == [d(1), d(2), d(3)] and len(f) == 3
    assert not f.done and f.known == {d(1), d(2), d(3)}
    assert [f.take(), f.take()] == [d(1), d(2)]
    assert not f.add(d(1))  # taken, still known: it never comes back by add
    assert list(f.pending) == [d(3)] and f.known == {d(1), d(2), d(3)}


def test_add_done_is_known_but_not_pending():
    f = Frontier()
    assert f.add(d(1), done=True) and f.add(d(2))
    assert list(f.pending) == [d(2)] and f.done == {d(1)} and set(f.done) == {d(1)}
    assert d(1) in f.known and d(1) in f.done and d(2) not in f.done


def test_another_masters_input_is_known_not_queued_until_requeued():
    f = Frontier()
    f.mine = lambda digest: digest != d(2)
    assert f.add(d(1)) and f.add(d(2)) and f.add(d(3))
    assert list(f.pending) == [d(1), d(3)] and d(2) in f.known
    assert not f.add(d(2))  # known: its owner changed or not, add does not queue it
    f.requeue(d(2))  # this master owns it now, or took its lease over
    assert list(f.pending) == [d(2), d(1), d(3)]


def test_put_back_and_requeue_go_first():
    f = Frontier()
    for i in range(4):
        f.add(d(i))
    x, y = f.take(), f.take()
    f.put_back(y)
    f.put_back(x)  # undone in reverse order: exactly where they were
    assert list(f.pending) == [d(0), d(1), d(2), d(3)]
    x = f.take()
    f.requeue(x)
    assert f.pending[0] == x and list(f.pending) == [d(0), d(1), d(2), d(3)]
    f.take()
    f.requeue(d(3))  # the old deque allowed an input twice in line; so does this
    assert list(f.pending) == [d(3), d(1), d(2), d(3)] and len(f) == 4


def test_requeue_of_a_done_digest_is_a_no_op():
    f = Frontier()
    f.add(d(1))
    f.add(d(2))
    x = f.take()
    f.mark_done(x)
    f.requeue(x)
    assert list(f.pending) == [d(2)] and f.done == {x}


def test_the_old_edge_cases_are_kept():
    """Semantics of the sets and deque this replaced, however odd."""
    f = Frontier()
    f.add(d(1))
    f.mark_done(d(1))  # done does not leave the line by itself
    assert list(f.pending) == [d(1)] and f.take() == d(1)
    f.mark_done(d(2))  # done though never known
    assert d(2) in f.done and d(2) not in f.known and len(f.done) == 2
    assert f.add(d(2)) and list(f.pending) == [d(2)]  # added later: joins the line
    f.put_back(d(3))  # put back though never known: pending, still not known
    f.requeue(d(4))
    assert list(f.pending) == [d(4), d(3), d(2)] and d(3) not in f.known


def test_take_from_an_empty_frontier():
    f = Frontier()
    with pytest.raises(IndexError):
        f.take()
    with pytest.raises(IndexError):
        f.pending[0]
    assert not f.pending and len(f) == 0 and list(f.pending) == []


def test_pending_view_indexing():
    f = Frontier()
    for i in range(3):
        f.add(d(i))
    f.requeue(d(9))
    assert f.pending[0] == d(9) and f.pending[1] == d(0) and f.pending[-1] == d(2)
    assert d(1) in f.pending and sorted(f.pending) == sorted([d(9), d(0), d(1), d(2)])
    with pytest.raises(IndexError):
        f.pending[4]
    with pytest.raises(TypeError):
        f.pending[0:1]
    snapshot = iter(f.pending)
    f.take()
    assert list(snapshot) == [d(9), d(0), d(1), d(2)]  # iteration copies the order first


def test_views_are_sets_of_hex_strings():
    f = Frontier()
    for i in range(5):
        f.add(d(i), done=i % 2 == 0)
    assert f.done == {d(0), d(2), d(4)} and {d(0), d(2), d(4)} == f.done
    assert f.done != {d(0)} and len(f.known) == 5
    difference = f.done - {d(0)}
    assert type(difference) is set and difference == {d(2), d(4)}
    assert (f.known & {d(1), d(7)}) == {d(1)}
    for not_a_digest in (d(1).upper(), d(1)[:-1], "x" * 64, 7, None, b"\0" * 32):
        assert not_a_digest not in f.known
    for bad in (d(1).upper(), "xyz", " " + d(1)[1:]):
        with pytest.raises(ValueError):
            f.add(bad)


def test_order_survives_compaction_of_the_queue():
    f = Frontier()
    taken, model = [], []
    n = 3 * frontier_module._COMPACT_AT
    for i in range(n):
        f.add(d(i))
        model.append(d(i))
        if i % 3 == 2:  # take two for every three added: the consumed head grows
            taken += [f.take(), f.take()]
    assert taken == model[:len(taken)] and list(f.pending) == model[len(taken):]
    assert len(f._queue) < n  # the consumed prefix was cut off at least once
    f.put_back(taken[-1])
    rest = [f.take() for _ in range(len(f))]
    assert rest == [taken[-1]] + model[len(taken):] and not f.pending


def test_see_remembers_generated_children():
    f = Frontier()
    f.add(d(1))
    assert not f.see(d(1))  # known already
    assert f.see(d(2)) and not f.see(d(2))
    assert f.seen_before(d(1)) and f.seen_before(d(2)) and not f.seen_before(d(3))
    assert not f.seen_before("not a digest")
    assert d(2) not in f.known and not f.done and list(f.pending) == [d(1)]
    assert f.add(d(2))  # a child seen first, kept later: it becomes known and pending
    assert list(f.pending) == [d(1), d(2)] and not f.see(d(2))
    assert f.statistics().seen == 2


def test_depth_queue_id_and_dispatch_counts():
    f = Frontier()
    assert f.depth(d(1)) is None and f.queue_id(d(1)) is None and f.depth("junk") is None
    f.set_depth(d(1), 3)  # set before the add, as the master does
    f.set_queue_id(d(1), 0)
    assert d(1) not in f.known and f.add(d(1))
    assert f.depth(d(1)) == 3 and f.queue_id(d(1)) == 0
    f.set_depth(d(1), 10**6)
    assert f.depth(d(1)) == 0xFFFF  # a statistic: saturates
    f.set_queue_id(d(1), None)
    assert f.queue_id(d(1)) is None
    with pytest.raises(ValueError):
        f.set_depth(d(1), 0)
    with pytest.raises(ValueError):
        f.set_queue_id(d(1), 0xFFFFFFFF)
    assert [f.note_dispatch(d(1)) for _ in range(5)] == [1, 2, 3, 3, 3]
    assert f.note_dispatch(d(2)) == 1 and f.depth(d(1)) == 0xFFFF  # other bits untouched
    assert d(1) in f.known and d(1) not in f.done and list(f.pending) == [d(1)]


def test_queued_from_lists_the_inputs_from_a_queue_id_on_in_queue_order():
    f = Frontier()
    for number, queue_id in ((1, 2), (2, None), (3, 0), (4, 5), (5, 3)):
        f.add(d(number))
        f.set_queue_id(d(number), queue_id)
    assert f.queued_from(2) == [d(1), d(5), d(4)]
    assert f.queued_from(0) == [d(3), d(1), d(5), d(4)] and f.queued_from(6) == []


def test_statistics_and_memory():
    f = Frontier()
    for i in range(100):
        f.add(d(i), done=i < 10)
    for i in range(100, 400):
        f.see(d(i))
    f.take()
    stats = f.statistics()
    assert stats == FrontierStatistics(known=100, done=10, pending=89, seen=300,
                                       memory_bytes=f.memory_bytes())
    assert 0 < f.memory_bytes() < 400 * 200
    assert "known=100" in repr(f)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "take", "requeue", "rank"]),
                          st.integers(0, 30)), max_size=60))
def test_the_head_of_the_pending_inputs_is_their_order(steps):
    f = Frontier()
    for step, i in steps:
        if step == "add":
            f.add(d(i))
        elif step == "take" and len(f):
            f.take()
        elif step == "requeue":
            f.requeue(d(i))
        elif step == "rank":
            f.rank_by(lambda digest, at=i % 64: (digest[at],))
        assert list(f.pending.head()) == list(f.pending)
