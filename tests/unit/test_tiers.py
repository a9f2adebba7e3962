"""The tiers past the interesting frontier (tiers/): the schedule between the aside pool and
the epochs, the pool on its packs, and the frontier's epochs. Real packs on disk, no MPI."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from symcc_mpi.config import AsideBounds, UsageError, aside_bounds
from symcc_mpi.scheduling.frontier import Frontier
from symcc_mpi.scheduling.tiers.pool import AsidePool, Promise
from symcc_mpi.scheduling.tiers.schedule import Tier, TierSchedule
from symcc_mpi.wire.staging import Pack, write_entries


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- the schedule ----------------------------------------------------------------------------


def test_without_a_budget_no_lower_tier_is_used():
    schedule = TierSchedule(enabled=False, aside=True, rerun=True)
    assert not schedule.enabled
    assert schedule.source(pool=5, reruns=5, corpus=5) is None
    assert not schedule.epoch_due(pool=0, reruns=0, corpus=5)
    assert not schedule.has_work(pool=5, reruns=0, corpus=5)


def test_the_pool_until_it_stops_paying_then_an_epoch_then_the_pool_again():
    schedule = TierSchedule(enabled=True, aside=True, rerun=True, patience_floor=3)
    sizes = {"pool": 10, "reruns": 0, "corpus": 2}
    for _ in range(2):
        assert schedule.source(**sizes) is Tier.ASIDE
        schedule.committed(Tier.ASIDE, finds=0, edges=0, seconds=0.0)
    schedule.committed(Tier.ASIDE, finds=1, edges=4, seconds=0.0)  # a find: patience anew
    for _ in range(3):
        assert schedule.source(**sizes) is Tier.ASIDE
        schedule.committed(Tier.ASIDE, finds=0, edges=0, seconds=0.0)
    assert schedule.source(**sizes) is None and schedule.epoch_due(**sizes)
    assert schedule.begin_epoch() == 1
    assert schedule.source(pool=10, reruns=2, corpus=2) is Tier.RERUN
    schedule.committed(Tier.RERUN, finds=0, edges=0, seconds=0.0)
    # The re-run over, the pool comes back with its patience whole.
    assert schedule.source(pool=10, reruns=0, corpus=2) is Tier.ASIDE
    assert schedule.since_find == 0
    figures = schedule.statistics().per_tier
    assert figures[2] == {"executions": 6, "finds": 1, "edges": 4, "seconds": 0.0}
    assert figures[3]["executions"] == 1


def test_patience_is_the_corpus_size_past_its_floor():
    schedule = TierSchedule(enabled=True, aside=True, rerun=True, patience_floor=2)
    for _ in range(5):
        schedule.committed(Tier.ASIDE, finds=0, edges=0, seconds=0.0)
    assert schedule.source(pool=1, reruns=0, corpus=6) is Tier.ASIDE
    schedule.committed(Tier.ASIDE, finds=0, edges=0, seconds=0.0)
    assert schedule.source(pool=1, reruns=0, corpus=6) is None


def test_the_pool_also_gets_the_worker_seconds_a_rerun_of_the_corpus_would_cost():
    schedule = TierSchedule(enabled=True, aside=True, rerun=True, patience_floor=1)
    for _ in range(4):  # tier 1's runs: 50 ms each, so a re-run of 4 inputs costs 0.2 s
        schedule.committed(Tier.INTERESTING, finds=1, edges=1, seconds=0.05)
    sizes = {"pool": 100, "reruns": 0, "corpus": 4}
    for _ in range(19):  # past the 4 executions of patience, 0.19 s of 0.2
        schedule.committed(Tier.ASIDE, finds=0, edges=0, seconds=0.01)
        assert schedule.source(**sizes) is Tier.ASIDE
    schedule.committed(Tier.ASIDE, finds=0, edges=0, seconds=0.01)
    assert schedule.source(**sizes) is None and schedule.epoch_due(**sizes)
    schedule.begin_epoch()
    for _ in range(4):  # the re-run's own runs, 0.1 s each, are the estimate from now on
        assert schedule.source(pool=100, reruns=1, corpus=4) is Tier.RERUN
        schedule.committed(Tier.RERUN, finds=0, edges=0, seconds=0.1)
    assert schedule.rerun_cost(4) == pytest.approx(0.4)
    for _ in range(39):
        assert schedule.source(**sizes) is Tier.ASIDE
        schedule.committed(Tier.ASIDE, finds=0, edges=0, seconds=0.01)
    assert schedule.source(**sizes) is Tier.ASIDE
    schedule.committed(Tier.ASIDE, finds=1, edges=2, seconds=0.01)  # a find: patience anew
    assert schedule.since_find == 0 and schedule.since_find_seconds == 0.0


def test_an_empty_pool_makes_an_epoch_due_and_finds_in_tier_one_reset_patience():
    schedule = TierSchedule(enabled=True, aside=True, rerun=True, patience_floor=1)
    assert schedule.epoch_due(pool=0, reruns=0, corpus=3)
    schedule.committed(Tier.ASIDE, finds=0, edges=0, seconds=0.0)
    schedule.committed(Tier.INTERESTING, finds=1, edges=1, seconds=0.0)
    assert schedule.source(pool=1, reruns=0, corpus=0) is Tier.ASIDE


def test_without_pruning_there_is_no_epoch_and_the_pool_is_used_to_its_end():
    schedule = TierSchedule(enabled=True, aside=True, rerun=False, patience_floor=1)
    for _ in range(10):
        schedule.committed(Tier.ASIDE, finds=0, edges=0, seconds=0.0)
    assert schedule.source(pool=1, reruns=0, corpus=9) is Tier.ASIDE
    assert not schedule.has_work(pool=0, reruns=0, corpus=9)


def test_without_triage_the_epochs_follow_each_other():
    schedule = TierSchedule(enabled=True, aside=False, rerun=True)
    assert schedule.epoch_due(pool=0, reruns=0, corpus=4)
    schedule.begin_epoch()
    assert schedule.source(pool=0, reruns=4, corpus=4) is Tier.RERUN
    assert schedule.epoch_due(pool=0, reruns=0, corpus=4)
    assert not schedule.epoch_due(pool=0, reruns=0, corpus=0)  # nothing to analyse again


# -- the pool --------------------------------------------------------------------------------


class Packs:
    """Staged packs as a worker leaves them, in a staging directory of their own."""

    def __init__(self, root: Path):
        self.staging = root / "staging"
        self.staging.mkdir()
        self.made = 0

    def make(self, *children: bytes) -> tuple[str, list]:
        self.made += 1
        token = f"{self.made:032x}"
        write_entries(self.staging / token, [(digest(c), c) for c in children])
        with Pack(str(self.staging / token)) as pack:
            return token, pack.entries


def promise(size: int, arrival: int, *, repeated: bool = False, rarity: int = 0) -> Promise:
    return Promise(repeated, rarity, size, arrival)


def test_a_pack_moves_into_the_pool_with_the_children_it_sets_aside(tmp_path):
    packs = Packs(tmp_path)
    pool = AsidePool(tmp_path / "aside")
    token, entries = packs.make(b"kept child", b"dull child", b"other dull child")
    pool.offer(entries[1], promise(10, 2))
    pool.offer(entries[2], promise(16, 1, repeated=True))
    assert pool.adopt(token, str(packs.staging / token)) == [entries[1].digest,
                                                            entries[2].digest]
    assert not (packs.staging / token).exists() and (tmp_path / "aside" / token).is_file()
    assert len(pool) == 2 and pool.best() == entries[1].digest  # a new path first
    pool.take(entries[1].digest)
    assert pool.read(entries[1].digest) == b"dull child"
    assert entries[1].digest in pool and pool.best() == entries[2].digest
    pool.finished(entries[1].digest)
    pool.collect()
    assert (tmp_path / "aside" / token).is_file()  # the other child still needs it
    pool.take(entries[2].digest)
    pool.finished(entries[2].digest)
    pool.collect()
    assert not (tmp_path / "aside" / token).exists()
    stats = pool.statistics()
    assert (stats.pending, stats.in_flight, stats.set_aside, stats.explored) == (0, 0, 2, 2)


def test_a_commit_that_sets_nothing_aside_leaves_its_pack_to_its_worker(tmp_path):
    packs = Packs(tmp_path)
    pool = AsidePool(tmp_path / "aside")
    token, _ = packs.make(b"kept")
    assert pool.adopt(token, str(packs.staging / token)) == []
    assert (packs.staging / token).is_file()


def test_pooled_bytes_are_checked_when_read(tmp_path):
    packs = Packs(tmp_path)
    pool = AsidePool(tmp_path / "aside")
    token, entries = packs.make(b"child")
    pool.offer(entries[0], promise(5, 1))
    pool.adopt(token, str(packs.staging / token))
    write_entries(tmp_path / "aside" / token, [(entries[0].digest, b"chilD")])
    pool.take(entries[0].digest)
    with pytest.raises(OSError, match="do not match"):
        pool.read(entries[0].digest)


def test_past_its_bounds_the_pool_drops_the_least_promising_and_their_packs(tmp_path):
    packs = Packs(tmp_path)
    pool = AsidePool(tmp_path / "aside", max_inputs=3, max_bytes=1 << 20)
    tokens = []
    for number in range(5):
        token, entries = packs.make(b"child %d" % number)
        pool.offer(entries[0], promise(size=number, arrival=number))
        pool.adopt(token, str(packs.staging / token))
        tokens.append(token)
    pool.collect()
    # The fourth offer passed the bound: down to 3 / 1.1 = 2 inputs, the most promising
    # (smallest) of the four; the fifth came in after.
    assert len(pool) == 3 and pool.statistics().dropped == 2
    assert sorted(os.listdir(tmp_path / "aside")) == [tokens[0], tokens[1], tokens[4]]
    assert pool.best() == digest(b"child 0")


def test_a_byte_bound_counts_packs_and_spares_work_in_flight(tmp_path):
    packs = Packs(tmp_path)
    pool = AsidePool(tmp_path / "aside", max_bytes=300)  # a pack: its bytes, index, footer
    big, entries = packs.make(b"x" * 150)
    pool.offer(entries[0], promise(150, 1))
    pool.adopt(big, str(packs.staging / big))
    pool.take(entries[0].digest)
    small, entries = packs.make(b"y" * 100)
    pool.offer(entries[0], promise(100, 2))
    pool.adopt(small, str(packs.staging / small))
    pool.collect()
    assert os.listdir(tmp_path / "aside") == [big]  # in flight: kept; the new one over budget
    assert len(pool) == 0 and pool.statistics().dropped == 1


def test_a_resumed_pool_is_rebuilt_from_its_packs(tmp_path):
    packs = Packs(tmp_path)
    pool = AsidePool(tmp_path / "aside")
    token, entries = packs.make(b"analysed", b"waiting", b"kept")
    for entry in entries:
        pool.offer(entry, promise(entry.size, 0))
    pool.adopt(token, str(packs.staging / token))
    (tmp_path / "aside" / "not-a-pack").write_bytes(b"junk")
    seen = {entries[0].digest, entries[2].digest}
    again = AsidePool(tmp_path / "aside")
    assert again.load(seen.__contains__) == 1
    assert again.best() == entries[1].digest and again.read(entries[1].digest) == b"waiting"
    assert sorted(os.listdir(tmp_path / "aside")) == [token]  # the junk is gone


def test_pool_bounds_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("SYMCC_ASIDE_MAX_INPUTS", "7")
    monkeypatch.setenv("SYMCC_ASIDE_MAX_MB", "3")
    assert aside_bounds() == AsideBounds(7, 3 << 20)
    monkeypatch.setenv("SYMCC_ASIDE_MAX_MB", "lots")
    with pytest.raises(UsageError, match="SYMCC_ASIDE_MAX_MB='lots'"):
        aside_bounds()


class PoolMachine(RuleBasedStateMachine):
    """The pool against a model: what is pending, in flight, and which packs must stay."""

    def __init__(self):
        super().__init__()
        import tempfile

        self.root = Path(tempfile.mkdtemp(prefix="pool-machine-"))
        self.packs = Packs(self.root)
        self.pool = AsidePool(self.root / "aside", max_inputs=6, max_bytes=1 << 20)
        self.pending: dict[str, tuple[Promise, str]] = {}  # model: digest -> (rank, pack)
        self.taken: dict[str, str] = {}
        self.arrival = 0

    @rule(children=st.lists(st.binary(min_size=1, max_size=8), min_size=1, max_size=3,
                            unique=True), sizes=st.lists(st.integers(0, 9), min_size=3,
                                                         max_size=3))
    def commit(self, children, sizes):
        token, entries = self.packs.make(*[b"%d:" % self.arrival + c for c in children])
        for entry, size in zip(entries, sizes, strict=False):
            self.arrival += 1
            rank = promise(size, self.arrival)
            self.pool.offer(entry, rank)
            self.pending[entry.digest] = (rank, token)
        self.pool.adopt(token, str(self.packs.staging / token))
        # The model's bound: the pool may drop the least promising, never one in flight.
        self.pending = {d: v for d, v in self.pending.items() if d in self.pool}

    @precondition(lambda self: self.pending)
    @rule()
    def take_best(self):
        best = self.pool.best()
        assert best == min(self.pending, key=lambda d: self.pending[d][0])
        self.pool.take(best)
        self.taken[best] = self.pending.pop(best)[1]

    @precondition(lambda self: self.taken)
    @rule(data=st.data())
    def finish(self, data):
        chosen = data.draw(st.sampled_from(sorted(self.taken)))
        self.pool.finished(chosen)
        del self.taken[chosen]

    @rule()
    def collect(self):
        self.pool.collect()

    @invariant()
    def agrees_with_the_model(self):
        stats = self.pool.statistics()
        assert stats.pending == len(self.pending) <= self.pool.max_inputs
        assert stats.in_flight == len(self.taken)
        on_disk = set(os.listdir(self.root / "aside")) if (self.root / "aside").exists() \
            else set()
        needed = {token for _, token in self.pending.values()} | set(self.taken.values())
        assert needed <= on_disk  # no pack goes while an entry needs it
        for chosen in list(self.taken)[:1]:
            assert self.pool.read(chosen)  # and its bytes read back

    def teardown(self):
        import shutil

        shutil.rmtree(self.root, ignore_errors=True)


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


# -- the frontier's epochs -------------------------------------------------------------------


def test_an_epoch_makes_every_corpus_input_pending_again_in_queue_order():
    frontier = Frontier()
    corpus = [digest(b"%d" % n) for n in range(4)]
    for queue_id, item in reversed(list(enumerate(corpus))):
        frontier.add(item)
        frontier.set_queue_id(item, queue_id)
    while len(frontier):
        frontier.mark_done(frontier.take())
    aside = digest(b"dull child")
    frontier.set_aside(aside)
    frontier.mark_done(aside)
    assert frontier.tier_of(aside) == 2 and frontier.tier_of(corpus[0]) == 1
    assert frontier.begin_epoch() == 4
    assert len(frontier.done) == 0 and frontier.reruns_pending == 4 and len(frontier) == 0
    assert frontier.tier_of(corpus[2]) == 3 and frontier.tier_of(aside) == 2
    order = []
    while frontier.next_rerun() is not None:
        order.append(frontier.take_rerun())
        frontier.mark_done(order[-1])
    assert order == corpus
    assert frontier.seen_before(aside) and not frontier.awaits_aside(digest(b"other"))


def test_an_input_analysed_again_by_another_path_is_skipped_by_the_rerun():
    frontier = Frontier()
    items = [digest(b"a"), digest(b"b")]
    for queue_id, item in enumerate(items):
        frontier.add(item, done=True)
        frontier.set_queue_id(item, queue_id)
    frontier.begin_epoch()
    frontier.mark_done(items[0])  # requeued and analysed from the frontier's front
    assert frontier.next_rerun() == items[1]


def test_a_frontier_restored_from_its_dump_is_the_same():
    frontier = Frontier()
    items = [digest(b"%d" % n) for n in range(300)]
    for queue_id, item in enumerate(items):
        frontier.add(item, done=queue_id % 3 == 0)
        frontier.set_queue_id(item, queue_id)
        frontier.set_depth(item, 1 + queue_id % 5)
    frontier.see(digest(b"a child not kept"))
    again = Frontier()
    again.restore(frontier.dump())
    assert list(again.pending) == list(frontier.pending)
    assert set(again.done) == set(frontier.done) and set(again.known) == set(frontier.known)
    assert all(again.queue_id(i) == frontier.queue_id(i) and again.depth(i) == frontier.depth(i)
               for i in items)
    assert again.seen_before(digest(b"a child not kept"))
    again.add(digest(b"new"))  # and it goes on growing
    assert again.pending[-1] == digest(b"new")
