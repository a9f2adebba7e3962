"""Stateful property test: random READY / RESULT / stale / lost-result / retire interleavings
against a model. Nothing is lost, nothing is analysed twice, a retired rank gets no work."""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from symcc_mpi.protocol import Result
from symcc_mpi.scheduler import Scheduler, Verdict

RANKS = st.integers(min_value=1, max_value=4)


def digest(i: int) -> str:
    return f"{i:064x}"


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.s = Scheduler(max_attempts=3)
        self.inputs: set[str] = set()
        self.analysed: list[str] = []
        self.last_token: dict[int, str | None] = {}

    @rule(i=st.integers(min_value=0, max_value=30))
    def add(self, i):
        self.s.add_input(digest(i))
        self.inputs.add(digest(i))

    @rule(rank=RANKS)
    def ready(self, rank):
        self.s.worker_ready(rank, self.last_token.get(rank))
        for d in self.s.next_dispatches():
            assert d.rank not in self.s.retired
            self.last_token[d.rank] = None

    @precondition(lambda self: self.s.active)
    @rule(data=st.data())
    def finish(self, data):
        rank = data.draw(st.sampled_from(sorted(self.s.active)))
        d = self.s.active[rank]
        verdict = self.s.judge_result(rank, _result(d.token, d.input_hash))
        assert verdict is Verdict.ACCEPT
        self.s.mark_done(d.input_hash)
        self.analysed.append(d.input_hash)
        self.last_token[rank] = d.token

    @precondition(lambda self: self.s.active)
    @rule(data=st.data())
    def lose_result(self, data):
        rank = data.draw(st.sampled_from(sorted(self.s.active)))
        self.last_token[rank] = self.s.active[rank].token  # READY follows, RESULT is gone

    @rule(rank=RANKS, i=st.integers(min_value=0, max_value=30))
    def stale_result(self, rank, i):
        before = dict(self.s.active)
        assert self.s.judge_result(rank, _result("e" * 32, digest(i))) is Verdict.STALE
        assert self.s.active == before

    @rule(rank=RANKS)
    def retire(self, rank):
        self.s.retire(rank)

    @invariant()
    def nothing_analysed_twice(self):
        assert len(self.analysed) == len(set(self.analysed))

    @invariant()
    def nothing_lost(self):
        in_flight = {d.input_hash for d in self.s.active.values()}
        accounted = set(self.s.frontier) | in_flight | self.s.done | set(self.s.deferred)
        assert accounted == self.inputs

    @invariant()
    def an_input_is_in_one_place(self):
        places = (list(self.s.frontier) + [d.input_hash for d in self.s.active.values()]
                  + list(self.s.done) + self.s.deferred)
        assert len(places) == len(set(places))

    @invariant()
    def a_worker_holds_one_dispatch_and_is_not_idle_meanwhile(self):
        assert not set(self.s.idle) & set(self.s.active)


def _result(token, input_hash):
    return Result(token=token, input_hash=input_hash, outcome="ok", exit_status=0,
                  wall_time=0.0, solver_time=0.0, staged=[], generated=0)


TestScheduler = SchedulerMachine.TestCase
TestScheduler.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
