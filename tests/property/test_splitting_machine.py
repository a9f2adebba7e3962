"""A stateful machine over splitting.WorkSource: inputs arrive, are traced or sent whole, their
groups go out, come back, are put back before a send, taken back after it, set aside, and
another master holds targets that the shared admission refuses. After every step: no target
in two groups in flight, the reserve is exactly the targets in flight, every input is in
exactly one place, and an input is done only once all its parts are."""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from symcc_mpi.scheduling.frontier import Frontier
from symcc_mpi.scheduling.splitting import TRACE, WorkSource, parse_work_id

TARGETS = st.integers(min_value=1, max_value=4)


class SplittingMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.external: set[int] = set()  # targets another master holds
        self.source = WorkSource(Frontier(), split=True,
                                 shared_admission=lambda w, t, r: not self.external & set(t))
        self.inputs: list[str] = []
        self.sent: dict[str, str] = {}  # work id -> input, sent and not yet back
        self.set_aside: set[str] = set()
        self.finished_parts: Counter[str] = Counter()

    @rule(name=st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f"]))
    def add_input(self, name):
        digest = hashlib.sha256(name).hexdigest()
        if self.source.frontier.add(digest):
            self.inputs.append(digest)

    @rule(free=st.integers(min_value=1, max_value=4), undelivered=st.integers(0, 4))
    def dispatch(self, free, undelivered):
        """As the coordinator does with `free` idle workers: work for each while there is
        some; the `undelivered`-th send (if any) fails and is put back."""
        for attempt in range(1, free + 1):
            work = self.source.peek(free - attempt + 1)
            if work is None:
                return
            assert work not in self.sent
            self.source.take(work)
            if attempt == undelivered:
                self.source.put_back(work)
            else:
                self.sent[work] = parse_work_id(work)[0]

    @rule(path=st.lists(TARGETS, unique=True, min_size=1, max_size=4),
          free=st.integers(min_value=2, max_value=4))
    def split_the_next_input(self, path, free):
        """A trace out and back in one step (the frontier thin for `free` workers): splits
        come often enough for groups of two inputs to meet in flight."""
        if self.source.waiting or not 0 < len(self.source.frontier.pending) < free:
            return
        work = self.source.peek(free)
        self.source.take(work)
        completes = self.source.completes_input(work, path)
        self.source.finish(work, path, (), free)
        assert not completes and parse_work_id(work)[0] in self.source.open

    @precondition(lambda self: self.sent)
    @rule(data=st.data(), path=st.lists(TARGETS, unique=True, max_size=6))
    def finish(self, data, path):
        work = data.draw(st.sampled_from(sorted(self.sent)))
        digest = self.sent.pop(work)
        part = parse_work_id(work)[1]
        if part is not None and part != TRACE and digest in self.set_aside:
            return  # its input was set aside: its commit is fenced, nothing to finish
        targets = self.source.job(work)[1]
        solved = [t for t in path if targets is None or t in targets]
        completes = self.source.completes_input(work, path)
        self.source.finish(work, path, solved, free=data.draw(st.integers(1, 4)))
        assert (digest in self.source.frontier.done) == completes
        self.finished_parts[digest] += 1

    @precondition(lambda self: self.sent)
    @rule(data=st.data())
    def take_back(self, data):
        work = data.draw(st.sampled_from(sorted(self.sent)))
        digest = self.sent.pop(work)
        if digest not in self.set_aside:
            self.source.requeue(work)

    @precondition(lambda self: any(parse_work_id(w)[1] for w in self.sent))
    @rule(data=st.data())
    def set_aside_a_group(self, data):
        work = data.draw(st.sampled_from(sorted(w for w in self.sent
                                                if parse_work_id(w)[1])))
        digest = self.source.set_aside(work)
        self.set_aside.add(digest)
        self.sent.pop(work)
        for other in [w for w, d in self.sent.items() if d == digest]:
            self.sent.pop(other)  # in flight still; fenced when it comes back

    @rule(held=st.sets(TARGETS, max_size=3))  # `targets` is a keyword of `rule`
    def another_master_holds(self, held):
        self.external = held

    @invariant()
    def no_target_in_two_groups_in_flight(self):
        held = Counter(t for targets in self.source.in_flight.values() for t in targets)
        assert all(count == 1 for count in held.values()), held
        assert +self.source.reserved == held

    @invariant()
    def in_flight_groups_are_sent_or_just_peeked(self):
        for work in self.source.in_flight:
            assert work in self.sent or work == self.source.peeked

    @invariant()
    def every_input_is_in_one_place(self):
        source = self.source
        pending = Counter(source.frontier.pending)
        for digest in self.inputs:
            places = [pending[digest] > 0, digest in source.open,
                      digest in source.frontier.done, digest in self.set_aside]
            in_flight_whole = any(d == digest and parse_work_id(w)[1] is None
                                  for w, d in self.sent.items())
            assert sum(places) + in_flight_whole == 1, (digest[:8], places, in_flight_whole)

    @invariant()
    def an_open_input_s_parts_are_waiting_or_out(self):
        source = self.source
        for digest, parts in source.open.items():
            out = {parse_work_id(w)[1] for w, d in self.sent.items() if d == digest}
            waiting = {parse_work_id(w)[1] for w in source.waiting
                       if parse_work_id(w)[0] == digest}
            assert parts == out | waiting, (parts, out, waiting)


TestSplitting = pytest.mark.slow(SplittingMachine.TestCase)
TestSplitting.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)
