"""DigestTable and Frontier against plain dict/set/deque models, step by step.

The keys come from a small pool, half of it sharing its first 8 bytes (one hash, one probe
chain), plus a `grow` rule adding fresh keys in bulk so runs cross several resizes.
"""

from __future__ import annotations

import hashlib
from collections import deque

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from symcc_mpi.scheduling.digests import DigestTable
from symcc_mpi.scheduling.frontier import Frontier

POOL = ([hashlib.sha256(b"pool %d" % i).digest() for i in range(8)]
        + [b"\xc3" * 8 + hashlib.sha256(b"tail %d" % i).digest()[:24] for i in range(8)])
HEX = [key.hex() for key in POOL]
FLAGS = (1, 2, 4, 128)
keys = st.integers(0, len(POOL) - 1)


def fresh(n: int) -> bytes:
    return hashlib.sha256(b"fresh %d" % n).digest()


class DigestTableMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.table = DigestTable()
        self.order: list[bytes] = []  # entry -> key
        self.rows: dict[bytes, dict] = {}  # key -> {"flags", "depth", "queue_id"}

    def _add(self, key: bytes) -> int:
        entry, created = self.table.add(key)
        assert created == (key not in self.rows)
        if created:
            assert entry == len(self.order)
            self.order.append(key)
            self.rows[key] = {"flags": 0, "depth": 0, "queue_id": None}
        assert self.order[entry] == key
        return entry

    @rule(i=keys)
    def add(self, i):
        self._add(POOL[i])

    @rule(n=st.integers(1, 60))
    def grow(self, n):
        for _ in range(n):
            self._add(fresh(len(self.order)))

    @rule(i=keys)
    def find(self, i):
        key = POOL[i]
        expected = self.order.index(key) if key in self.rows else -1
        assert self.table.find(key) == expected and (key in self.table) == (key in self.rows)

    @rule(i=keys, flag=st.sampled_from(FLAGS), on=st.booleans())
    def flag(self, i, flag, on):
        entry, row = self._add(POOL[i]), self.rows[POOL[i]]
        changed = (self.table.set_flag if on else self.table.clear_flag)(entry, flag)
        assert changed == (bool(row["flags"] & flag) != on)
        row["flags"] = row["flags"] | flag if on else row["flags"] & ~flag

    @rule(i=keys, depth=st.integers(0, 0xFFFF), queue_id=st.none() | st.integers(0, 2**32 - 2))
    def columns(self, i, depth, queue_id):
        entry, row = self._add(POOL[i]), self.rows[POOL[i]]
        self.table.set_depth(entry, depth)
        self.table.set_queue_id(entry, queue_id)
        row["depth"], row["queue_id"] = depth, queue_id

    @invariant()
    def agrees_with_the_model(self):
        table = self.table
        assert len(table) == len(self.order) and len(table) <= table.slots() * 2 // 3 + 1
        for key in POOL:
            entry = table.find(key)
            if key not in self.rows:
                assert entry == -1
                continue
            row = self.rows[key]
            assert table.key(entry) == key and table.flags(entry) == row["flags"]
            assert table.depth(entry) == row["depth"]
            assert table.queue_id(entry) == row["queue_id"]
        for flag in FLAGS:
            expected = [e for e, key in enumerate(self.order) if self.rows[key]["flags"] & flag]
            assert list(table.entries_with(flag)) == expected
            assert table.count(flag) == len(expected)


class FrontierMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.frontier = Frontier()
        # The representation Frontier replaced, plus the master's dicts it absorbs.
        self.pending: deque[str] = deque()
        self.known: set[str] = set()
        self.done: set[str] = set()
        self.seen: set[str] = set()
        self.depth: dict[str, int] = {}
        self.queue_id: dict[str, int | None] = {}
        self.dispatches: dict[str, int] = {}

    @rule(i=keys, done=st.booleans())
    def add(self, i, done):
        digest = HEX[i]
        assert self.frontier.add(digest, done=done) == (digest not in self.known)
        if digest not in self.known:
            self.known.add(digest)
            if done:
                self.done.add(digest)
            else:
                self.pending.append(digest)

    @rule(i=keys)
    def see(self, i):
        digest = HEX[i]
        assert self.frontier.see(digest) == (digest not in self.seen | self.known)
        self.seen.add(digest)

    @rule()
    def take(self):
        if self.pending:
            assert self.frontier.take() == self.pending.popleft()
        else:
            try:
                self.frontier.take()
            except IndexError:
                pass
            else:
                raise AssertionError("took from an empty frontier")

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def take_then_put_back(self, data):
        digest = self.frontier.take()
        assert digest == self.pending.popleft()
        if data.draw(st.booleans()):
            self.frontier.put_back(digest)
            self.pending.appendleft(digest)

    @rule(i=keys)
    def requeue(self, i):
        digest = HEX[i]
        self.frontier.requeue(digest)
        if digest not in self.done:
            self.pending.appendleft(digest)

    @rule(i=keys)
    def mark_done(self, i):
        self.frontier.mark_done(HEX[i])
        self.done.add(HEX[i])

    @rule(i=keys, depth=st.integers(1, 70_000), queue_id=st.none() | st.integers(0, 999))
    def columns(self, i, depth, queue_id):
        self.frontier.set_depth(HEX[i], depth)
        self.frontier.set_queue_id(HEX[i], queue_id)
        self.depth[HEX[i]] = min(depth, 0xFFFF)
        self.queue_id[HEX[i]] = queue_id

    @rule(i=keys)
    def note_dispatch(self, i):
        count = min(self.dispatches.get(HEX[i], 0) + 1, 3)
        assert self.frontier.note_dispatch(HEX[i]) == count
        self.dispatches[HEX[i]] = count

    @invariant()
    def agrees_with_the_model(self):
        f = self.frontier
        assert list(f.pending) == list(self.pending) and len(f) == len(self.pending)
        assert bool(f.pending) == bool(self.pending)
        if self.pending:
            assert f.pending[0] == self.pending[0]
        assert f.known == self.known and f.done == self.done
        assert set(f.known) == self.known and len(f.done) == len(self.done)
        for digest in HEX:
            assert (digest in f.known) == (digest in self.known)
            assert (digest in f.done) == (digest in self.done)
            assert f.seen_before(digest) == (digest in self.seen | self.known)
            assert f.depth(digest) == self.depth.get(digest)
            assert f.queue_id(digest) == self.queue_id.get(digest)
        stats = f.statistics()
        assert (stats.known, stats.done, stats.pending, stats.seen) == (
            len(self.known), len(self.done), len(self.pending), len(self.seen))


TestDigestTableMachine = DigestTableMachine.TestCase
TestDigestTableMachine.settings = settings(max_examples=150, stateful_step_count=40,
                                           deadline=None)
TestFrontierMachine = FrontierMachine.TestCase
TestFrontierMachine.settings = settings(max_examples=200, stateful_step_count=50,
                                        deadline=None)
