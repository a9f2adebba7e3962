"""The ULFM recovery (`ulfm.runtime.recover`) of N survivors against a fake communicator,
with ranks killed at any step, the master too, and faults in the generation log's writes.

Each survivor runs the real `recover` in a thread of its own, on its own handle of a fake
communicator (`FakeComm`) and its own `GenerationLog` on one shared file (flock arbitrates
between threads as between processes). The fake models what recovery relies on, as ULFM
specifies it: `Revoke`; `Shrink` (the survivors that reach it, in the old order, none of the
dead); `allgather` (fails where a member died before all arrived); `Agree` (uniform: the AND
of the flags, or ERR_PROC_FAILED on every survivor alike when a member died since the
shrink). A rank dies when it reaches a point chosen by the machine (before or after a
collective, inside an append to the log), which keeps runs reproducible; its thread unwinds
with `Died`. A survivor whose `recover` raises ends the job as production does (`Abort`).

F443 §5's recovery rows: a survivor dies after the prepare is persisted (the plan is reused,
no second prepare); a commit whose outcome is unknown (the append landed, the writer raised:
the retry reconciles); another plan for the same generation (the fork is refused and the job
ends with nothing committed). After every step: each survivor that returns has the same next
generation (number, members in the same order, failed set); the number goes up by exactly one
per committed recovery, with one prepare and one commit each; the log replays; no stranger
is ever a member.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)
from mpi4py import MPI

from symcc_mpi.durable.lines import write_all
from symcc_mpi.ulfm.generations import ForkRefused, GenerationLog, RecordKind, digest_of
from symcc_mpi.ulfm.runtime import Generation, recover

STUCK_FOR = 120.0  # a wait this long is a hang of the fake's bookkeeping, not a slow machine


class Died(BaseException):
    """This process was killed: its thread unwinds (nothing in recover may catch it)."""


class Aborted(BaseException):
    """Another rank ended the job (MPI_Abort)."""


class Deadlock(Exception):
    """Every survivor waits for something no one will do."""


class World:
    """What every process shares: who is dead, the communicators, and one condition that
    every wait is on. A wait is a deadlock when every running survivor has found, since the
    last change of anything, that it cannot go on."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.dead: set[str] = set()
        self.aborted = False
        self.deadlocked = ""
        self.running: set[str] = set()
        self.stuck: set[str] = set()
        self.kill_points: dict[str, str] = {}
        self.calls: Counter[tuple[str, str]] = Counter()
        self.first_writer: dict[str, str] = {}  # log request kind -> who must write it first
        self.requested: set[tuple[str, str]] = set()  # (kind, endpoint) done or died in

    def changed(self) -> None:  # under self.cond
        self.stuck.clear()
        self.cond.notify_all()

    def check(self, me: str) -> None:  # under self.cond
        if self.aborted:
            raise Aborted()
        if me in self.dead:
            raise Died()
        if self.deadlocked:
            raise Deadlock(self.deadlocked)

    def die(self, me: str) -> None:  # under self.cond
        self.dead.add(me)
        self.changed()
        raise Died()

    def point(self, me: str, name: str) -> None:
        """`me` reaches a named point of its recovery: its chosen death, if it is this one."""
        with self.cond:
            self.check(me)
            if self.kill_points.get(me) == name:
                self.die(me)

    def call(self, me: str, op: str) -> str:
        with self.cond:
            self.calls[me, op] += 1
            return f"{op}#{self.calls[me, op]}"

    def wait(self, me: str, ready):
        """The value of `ready()` once it is not None; `ready` runs under the lock."""
        with self.cond:
            try:
                while True:
                    self.check(me)
                    value = ready()
                    if value is not None:
                        return value
                    self.stuck.add(me)
                    if self.stuck >= self.running:
                        self.deadlocked = f"every survivor waits: {sorted(self.running)}"
                        self.changed()
                        raise Deadlock(self.deadlocked)
                    if not self.cond.wait(timeout=STUCK_FOR):
                        self.deadlocked = f"{me} waited {STUCK_FOR} s"
                        self.changed()
                        raise Deadlock(self.deadlocked)
            finally:
                self.stuck.discard(me)

    def abort(self) -> None:
        with self.cond:
            self.aborted = True
            self.changed()

    def finished(self, me: str) -> None:
        with self.cond:
            self.running.discard(me)
            self.changed()

    # -- the order of log requests, when a fault in one of them is planned ---------------

    def log_turn(self, me: str, kind: str) -> None:
        """Others wait until the planned victim's request is over (it alone writes first)."""
        victim = self.first_writer.get(kind)
        if victim is not None and victim != me:
            self.wait(me, lambda: True if ((kind, victim) in self.requested
                                           or victim in self.dead) else None)

    def log_over(self, me: str, kind: str) -> None:
        with self.cond:
            self.requested.add((kind, me))
            self.changed()


@dataclass(frozen=True)
class Failed:
    """A collective's outcome that is an MPI error: each process raises its own exception."""

    error_class: int


class CommState:
    """One communicator, as all its members share it: its collectives' arrivals and results."""

    def __init__(self, group: tuple[str, ...]):
        self.group = group
        self.revoked = False
        self.arrived: dict[str, dict[str, object]] = {"Shrink": {}, "allgather": {}, "Agree": {}}
        self.result: dict[str, object] = {}


class FakeComm:
    """One process's handle of a communicator."""

    def __init__(self, world: World, state: CommState, me: str):
        self.world, self.state, self.me = world, state, me

    def Get_rank(self) -> int:  # noqa: N802 (mpi4py's names)
        return self.state.group.index(self.me)

    def Set_errhandler(self, errhandler) -> None:  # noqa: N802
        pass

    def Revoke(self) -> None:  # noqa: N802
        self.world.point(self.me, self.world.call(self.me, "Revoke"))
        with self.world.cond:
            self.state.revoked = True
            self.world.changed()

    def _collective(self, op: str, value, ready):
        name = self.world.call(self.me, op)
        self.world.point(self.me, name)
        with self.world.cond:
            self.state.arrived[op][self.me] = value
            self.world.changed()
        result = self.world.wait(self.me, ready)
        self.world.point(self.me, f"{name} done")
        if isinstance(result, Failed):
            raise MPI.Exception(result.error_class)
        return result

    def _alive(self) -> list[str]:
        return [m for m in self.state.group if m not in self.world.dead]

    def _everyone_alive_arrived(self, op: str) -> bool:
        return all(m in self.state.arrived[op] for m in self._alive())

    def Shrink(self) -> FakeComm:  # noqa: N802
        def ready():
            if "Shrink" not in self.state.result and self._everyone_alive_arrived("Shrink"):
                self.state.result["Shrink"] = CommState(tuple(self._alive()))
                self.world.changed()
            return self.state.result.get("Shrink")

        return FakeComm(self.world, self._collective("Shrink", True, ready), self.me)

    def allgather(self, value):
        if self.state.revoked:
            raise MPI.Exception(MPI.ERR_REVOKED)

        def ready():
            if "allgather" in self.state.result:
                return self.state.result["allgather"]
            if any(m in self.world.dead for m in self.state.group):
                return Failed(MPI.ERR_PROC_FAILED)  # this process saw it: not uniform
            arrived = self.state.arrived["allgather"]
            if all(m in arrived for m in self.state.group):
                self.state.result["allgather"] = [arrived[m] for m in self.state.group]
                self.world.changed()
                return self.state.result["allgather"]
            return None

        return self._collective("allgather", value, ready)

    def Agree(self, flag: int) -> int:  # noqa: N802
        def ready():
            if "Agree" not in self.state.result and self._everyone_alive_arrived("Agree"):
                if any(m in self.world.dead for m in self.state.group):
                    outcome = Failed(MPI.ERR_PROC_FAILED)  # uniform: every survivor alike
                else:
                    outcome = int(all(self.state.arrived["Agree"].values()))
                self.state.result["Agree"] = outcome
                self.world.changed()
            return self.state.result.get("Agree")

        return self._collective("Agree", int(flag), ready)


WRITE_FAULTS = ("dies before writing", "dies inside the append", "dies after the append",
                "raises after the append")


class SurvivorLog(GenerationLog):
    """One process's handle of the log; when a fault is planned for a request kind, its
    victim makes that request first, so that it is the one that appends."""

    def __init__(self, path: Path, world: World, me: str):
        super().__init__(path, quarantine_dir=path.parent / "quarantine", writer=self._write)
        self.world, self.me = world, me
        self.fault: tuple[str, str] | None = None  # (request kind, what goes wrong)
        self.requesting = ""

    def _write(self, fd: int, data: bytes) -> None:
        fault = self.fault
        if fault is None or fault[0] != self.requesting:
            write_all(fd, data)
            return
        self.fault = None  # once: the retry of a lost acknowledgement goes through
        if fault[1] == "raises after the append":
            write_all(fd, data)
            raise OSError(5, "Input/output error (the append did land)")
        if fault[1] == "dies inside the append":
            write_all(fd, data[:len(data) // 2])
        elif fault[1] == "dies after the append":
            write_all(fd, data)  # persisted, not yet fsynced
        with self.world.cond:
            self.world.die(self.me)

    def _request(self, kind: str, request, document):
        self.world.log_turn(self.me, kind)
        self.requesting = kind
        try:
            return request(document)
        finally:
            self.world.log_over(self.me, kind)

    def prepare(self, plan):
        return self._request("prepare", super().prepare, plan)

    def commit(self, receipt):
        return self._request("commit", super().commit, receipt)


KILL_POINTS = ["Revoke#1"] + [f"{op}#{k}{after}" for k in (1, 2, 3)
                              for op in ("Shrink", "allgather", "Agree")
                              for after in ("", " done")]


class RecoveryMachine(RuleBasedStateMachine):
    """The model: the current generation (number, members), which processes are alive and
    their handles, and how many recoveries committed; a run ends when no process is left or
    a survivor's error ended the job, and then a next run starts at once, one generation past
    the log (every rule leaves a running job)."""

    def __init__(self):
        super().__init__()
        # fsync on tmpfs is free: a run is hundreds of recoveries, each with a dozen fsyncs
        shm = Path("/dev/shm")
        self.tmp = tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None)
        self.path = Path(self.tmp.name) / "state" / "generations.jsonl"
        self.world = World()
        self.log = GenerationLog(self.path, quarantine_dir=self.path.parent / "quarantine")
        self.runs = 0
        self.everyone: set[str] = set()  # every endpoint that ever lived
        self.generations: dict[str, Generation] = {}  # the living processes' handles
        self.number = -1
        self.members: tuple[str, ...] = ()
        self.committed = 0
        self.forked = False

    def teardown(self):
        self.tmp.cleanup()

    # -- runs -----------------------------------------------------------------------------

    def _new_run(self, size: int) -> None:
        self.runs += 1
        members = tuple(f"node{i % 2}/{1000 * self.runs + i}/{self.runs}" for i in range(size))
        self.everyone.update(members)
        record = self.log.start(list(members), {"run": self.runs})
        assert record.generation == self.number + 1
        state = CommState(members)
        self.world = World()
        self.number, self.members, self.forked = record.generation, members, False
        self.generations = {m: Generation(record.generation, FakeComm(self.world, state, m),
                                          members) for m in members}

    @initialize(size=st.integers(2, 5))
    def first_run(self, size):
        self._new_run(size)

    def _resume_if_over(self, data) -> None:
        """The job is over (all dead, or aborted): `--resume` starts a new run."""
        if not self.generations:
            self._new_run(data.draw(st.integers(2, 5), label="resumed with"))

    # -- faults between recoveries --------------------------------------------------------

    @rule(data=st.data())
    def kill(self, data):
        """Ranks die while the generation runs (the master, rank 0, among them)."""
        victims = data.draw(st.sets(st.sampled_from(sorted(self.generations)), min_size=1))
        if self.members[0] in victims:
            event("the master dies")
        with self.world.cond:
            self.world.dead.update(victims)
        for victim in victims:
            del self.generations[victim]
        self._resume_if_over(data)

    # -- recovery -------------------------------------------------------------------------

    @rule(data=st.data())
    def recover_all(self, data):
        survivors = sorted(self.generations)
        kills = data.draw(st.dictionaries(st.sampled_from(survivors), st.sampled_from(KILL_POINTS),
                                          max_size=len(survivors)), label="kill points")
        fault = data.draw(st.none() | st.tuples(st.sampled_from(survivors),
                                                st.sampled_from(("prepare", "commit")),
                                                st.sampled_from(WRITE_FAULTS)),
                          label="log fault")
        self.forked = data.draw(st.integers(0, 4), label="fork") == 0
        if self.forked:  # another plan for this generation is in the log already
            self.log.prepare({"generation": self.number,
                              "members": [*self.members, "rogue/1/1"]})
        world = self.world
        world.kill_points, world.calls = kills, Counter()
        world.first_writer, world.requested = {}, set()
        logs = {m: SurvivorLog(self.path, world, m) for m in survivors}
        if fault is not None:
            victim, kind, what = fault
            event(f"{kind}: {what}")
            world.first_writer[kind] = victim
            logs[victim].fault = (kind, what)
        outcomes: dict[str, tuple] = {}
        previous = (self.number, self.members)

        def survivor(me: str) -> None:
            try:
                outcomes[me] = ("returned", *recover(self.generations[me], logs[me]))
            except Died:
                outcomes[me] = ("died",)
            except Aborted:
                outcomes[me] = ("aborted",)
            except Deadlock as error:
                outcomes[me] = ("deadlock", error)
            except BaseException as error:  # session.run_rank: log it, MPI_Abort
                outcomes[me] = ("raised", error)
                world.abort()
            finally:
                world.finished(me)

        world.running = set(survivors)
        threads = [threading.Thread(target=survivor, args=(m,), daemon=True) for m in survivors]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self._judge(previous, outcomes)
        self._resume_if_over(data)

    def _judge(self, previous, outcomes) -> None:
        number, members = previous
        kinds = Counter(outcome[0] for outcome in outcomes.values())
        assert not kinds["deadlock"], outcomes
        raised = [outcome[1] for outcome in outcomes.values() if outcome[0] == "raised"]
        if self.forked:
            assert all(isinstance(error, ForkRefused) for error in raised), outcomes
            assert not kinds["returned"], outcomes
            assert self.log.find(RecordKind.COMMIT, number + 1) is None
            event("fork refused")
        else:
            assert not raised, outcomes
        returned = {me: outcome[1:] for me, outcome in outcomes.items()
                    if outcome[0] == "returned"}
        self.world.dead.update(me for me, outcome in outcomes.items() if outcome[0] == "died")
        if not returned:
            self.generations = {}  # the job is over: all dead, or aborted
            commit = self.log.find(RecordKind.COMMIT, number + 1)
            if commit is not None:  # its writer died after the append, and everyone else
                event("committed, no survivor left")
                self.committed += 1
                self.number, self.members = number + 1, tuple(commit.body["members"])
            return
        answers = {(g.number, g.members, r.failed, r.previous) for g, r in returned.values()}
        assert len(answers) == 1, answers
        (next_number, next_members, failed, was), = answers
        assert (next_number, was) == (number + 1, number)
        assert set(next_members) <= set(members)  # no stranger joins
        assert list(next_members) == [m for m in members if m in next_members]  # old order
        assert set(returned) <= set(next_members)
        assert failed == tuple(m for m in members if m not in next_members)
        assert all(g.rank == next_members.index(me) for me, (g, _) in returned.items())
        if next_members[0] != members[0]:
            event("a new master")
        commit = self.log.find(RecordKind.COMMIT, next_number)
        assert commit is not None and commit.body["members"] == list(next_members)
        self.committed += 1
        self.number, self.members = next_number, next_members
        self.generations = {me: g for me, (g, _) in returned.items()}
        event(f"shrinks: {max(r.shrinks for _, r in returned.values())}")

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def the_log_replays_with_one_prepare_and_one_commit_per_recovery(self):
        records = self.log.records()  # raises on any damage
        assert [r.ordinal for r in records] == list(range(len(records)))
        keys = Counter((r.kind, r.generation) for r in records)
        assert max(keys.values(), default=0) <= 1, keys
        commits = [r for r in records if r.kind is RecordKind.COMMIT]
        assert len(commits) == self.committed
        prepared = {r.generation: r for r in records if r.kind is RecordKind.PREPARE}
        starts = [r.generation for r in records if r.kind is RecordKind.START]
        for commit in commits:
            plan = prepared[commit.generation - 1]
            assert commit.body["plan"] == digest_of(plan.body)
            assert commit.generation not in starts
            assert set(commit.body["members"]) <= set(plan.body["members"])
            assert set(commit.body["members"]) <= self.everyone
        began = [r.generation for r in records if r.kind in ("start", "commit")]
        assert began == sorted(set(began))  # each generation begun once, in order
        current = self.log.current()
        assert current is not None and current.generation == self.number

    @invariant()
    def living_processes_are_members_of_the_current_generation(self):
        assert set(self.generations) <= set(self.members)
        assert all(g.number == self.number and g.members == self.members
                   for g in self.generations.values())


TestRecoveryMachine = pytest.mark.slow(RecoveryMachine.TestCase)
TestRecoveryMachine.settings = settings(max_examples=100, stateful_step_count=20, deadline=None)

@pytest.fixture
def quiet_recovery_log():
    """Every repeated shrink logs a warning; the machine checks states, not the log."""
    logger = logging.getLogger("symcc_mpi.ulfm")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


pytestmark = pytest.mark.usefixtures("quiet_recovery_log")
