"""The quiescence gate (F320 §2.5) among 2-4 masters, under any order of work and messages.

The machine plays the masters around the real `Participant`s and root's real `Coordinator`.
Each master holds work (busy) or not, and has work addressed to it that it has not discovered
yet (pending). A busy master that is not frozen publishes work to any master (itself
included); an external producer drops seeds anywhere. A master discovers its pending work at
any time while not frozen, and all of it when it rescans for a PREPARE. Work published to a
frozen master stays aside (deferred): it is that master's only if an ABORT unfreezes it, and
otherwise it stays in the corpus for the next campaign (F320 §2.5, last paragraph). Messages
travel as bytes, FIFO per (source, destination) pair like MPI, the pairs in any order; the
clock advances in steps; garbage bytes, replayed statuses, foreign ranks and foreign tokens
are faults. A master other than root may die and a worker take its place (a succession): a
fresh participant with the dead one's work, root told. Root may die too: a worker of its takes
its place with a fresh coordinator, which inherits the end the dead one decided (its record
of the COMMIT token, written before any COMMIT went out), and every master is told. A master
left with no worker withdraws: what it held, and what is addressed to it from then on, goes
to a master still working (its share of the corpus, taken as discovered work is); it stays a
member that holds nothing, and may die, which root's coordinator is told (`leave`).

The master honours the contract of `Participant`: `idle` and `still_idle` are False when it
held work at any time since its previous status() call.

Properties: no master is ever done while another can still publish (every other master is
done, or frozen for the very token that committed); COMMITTED implies every master done; no
conflict, no refused COMMIT, no superseded PREPARE, and no ABORT a master does not hold,
beyond the injected ones and those of a round a succession aborted. Liveness: once the
environment falls quiet, with messages delivered and rounds played, the run commits within a
bounded number of refresh periods.
"""

from __future__ import annotations

import itertools
import math
from collections import deque

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from symcc_mpi.federation.quiescence import Coordinator, Outcome, Participant
from symcc_mpi.wire.control import (
    Abort,
    Ack,
    Commit,
    MalformedControl,
    Prepare,
    Status,
    Vote,
    decode,
    encode,
)

ROOT = 0
REFRESH, STALE_AFTER, WINDOW = 0.5, 1.5, 1.0
WORK_BUDGET = 10  # items of work one run may create: it must be able to end
# Quiet periods of REFRESH after which the run must have committed: idle statuses within two
# rounds, a window, a possibly doomed round, a new window, and slack.
LIVENESS_PERIODS = 4 + 2 * math.ceil(WINDOW / REFRESH) + math.ceil(STALE_AFTER / REFRESH)
MASTER = st.integers(0, 3)  # taken modulo the number of masters


class QuiescenceMachine(RuleBasedStateMachine):
    @initialize(masters=st.integers(2, 4), seeds=st.lists(st.integers(0, 3), max_size=3))
    def start(self, masters, seeds):
        self.masters = masters
        self.numbers = itertools.count(1)  # no two coordinators of a run share a token
        self.root = self._coordinator()
        self.participants = [Participant(refresh=REFRESH, root=ROOT) for _ in range(masters)]
        self.now = 0.0
        self.busy = [False] * masters
        self.held_since_status = [False] * masters  # busy at any time since the last status()
        self.pending = [0] * masters
        self.deferred = [0] * masters
        self.deferred_by_masters = [0] * masters  # of `deferred`: published by a master
        self.prepared = [None] * masters  # the token each master voted YES on, as it said
        self.last_status: list[bytes | None] = [None] * masters
        self.channels = {(source, destination): deque()
                         for source in range(masters) for destination in range(masters)}
        self.budget = WORK_BUDGET
        self.malformed = 0
        self.foreign_aborts = [0] * masters
        self.peer_prepares = [0] * masters
        self.aborted: set[str] = set()  # tokens of rounds root aborted
        self.late_votes = 0  # votes of a round a succession aborted, arriving after it
        self.early_aborts = [0] * masters  # such rounds' ABORTs to a master that voted busy
        self.withdrawn: set[int] = set()  # members that hold no work
        self.left: set[int] = set()  # withdrawn, then dead
        for receiver in seeds:
            self.external_seed(receiver)

    def _coordinator(self):
        return Coordinator(self.masters, window=WINDOW, stale_after=STALE_AFTER,
                           random_bytes=lambda size: next(self.numbers).to_bytes(size, "big"))

    # -- the masters' work ---------------------------------------------------------------------

    def _master(self, m):
        return m % self.masters

    def _can_discover(self, m):
        return not self.participants[m].frozen and not self.participants[m].done

    def _discover(self, m, items):
        self.pending[m] -= items
        self.busy[m] = self.held_since_status[m] = True

    def _address(self, target, *, by_a_master):
        """Work for `target`: visible to its next scan, or set aside while it is frozen. A
        withdrawn master's goes to one still working."""
        if target in self.withdrawn:
            target = min(set(range(self.masters)) - self.withdrawn)
        if self.participants[target].frozen:
            self.deferred[target] += 1
            self.deferred_by_masters[target] += by_a_master
        else:
            self.pending[target] += 1

    @rule(m=MASTER)
    def discover(self, m):
        m = self._master(m)
        if self.pending[m] and self._can_discover(m):
            self._discover(m, 1)

    @rule(m=MASTER)
    def finish(self, m):
        self.busy[self._master(m)] = False

    @precondition(lambda self: self.budget > 0)
    @rule(m=MASTER, receiver=MASTER)
    def publish(self, m, receiver):
        m, receiver = self._master(m), self._master(receiver)
        if self.busy[m]:
            assert self._can_discover(m), "a frozen or done master holds work"
            self.budget -= 1
            self._address(receiver, by_a_master=True)

    @precondition(lambda self: self.budget > 1)
    @rule(m=MASTER, receiver=MASTER)
    def short_work_spell(self, m, receiver):
        """A seed arrives, is analysed and publishes a child, all between two of the
        master's rounds: the spell the gate must still see (the search needs it in one step)."""
        m = self._master(m)
        if self._can_discover(m):
            self.external_seed(m)
            self.discover(m)
            self.publish(m, receiver)
            self.finish(m)

    @precondition(lambda self: self.budget > 0)
    @rule(receiver=MASTER)
    def external_seed(self, receiver):
        self.budget -= 1
        self._address(self._master(receiver), by_a_master=False)

    @rule(m=MASTER)
    def round(self, m):
        """The master's loop round: its status to root, if one is due."""
        m = self._master(m)
        if m in self.left:
            return
        status = self.participants[m].status(not self.held_since_status[m], self.now)
        self.held_since_status[m] = self.busy[m]
        if status is not None:
            self.last_status[m] = encode(status)
            self._send(m, ROOT, status)

    @rule()
    def every_loop_round(self):
        """Every master sends its status if due, what was sent arrives, root ticks."""
        for m in range(self.masters):
            self.round(m)
        self.deliver_everything_in_flight()
        self.root_tick()

    @rule(dt=st.sampled_from([0.25, 0.5, 1.0, 2.0]))
    def advance(self, dt):
        self.now += dt

    # -- messages ------------------------------------------------------------------------------

    def _send(self, source, destination, message):
        self.channels[source, destination].append(encode(message))

    @rule()
    def root_tick(self):
        for destination, message in self.root.tick(self.now):
            if isinstance(message, Abort):
                self.aborted.add(message.token)
            self._send(ROOT, destination, message)

    @precondition(lambda self: any(self.channels.values()))
    @rule(choice=st.integers(0, 15))
    def deliver(self, choice):
        busy_pairs = [pair for pair, queue in self.channels.items() if queue]
        self._deliver(*busy_pairs[choice % len(busy_pairs)])

    @rule()
    def deliver_everything_in_flight(self):
        """Every message sent so far, not the answers they cause."""
        for pair, count in [(pair, len(queue)) for pair, queue in self.channels.items()]:
            for _ in range(count):
                self._deliver(*pair)

    @rule(m=MASTER)
    def deliver_everything_to(self, m):
        """One master reads its whole inbox (root's PREPARE included) before the others."""
        m = self._master(m)
        for source in range(self.masters):
            for _ in range(len(self.channels[source, m])):
                self._deliver(source, m)

    def _deliver(self, source, destination):
        raw = self.channels[source, destination].popleft()
        if destination in self.left:
            return
        try:
            message = decode(raw)
        except MalformedControl:
            self.malformed += 1
            return
        participant = self.participants[destination]
        if isinstance(message, Status):
            self.root.on_status(source, message, self.now)
        elif isinstance(message, Vote):
            # Only a succession aborts a round before all its votes are in (restart).
            self.late_votes += message.token in self.aborted
            self.root.on_vote(source, message)
        elif isinstance(message, Ack):
            self.root.on_ack(source, message)
        elif isinstance(message, Prepare):
            if self._can_discover(destination) and self.pending[destination]:
                self._discover(destination, self.pending[destination])  # the rescan
            still_idle = not self.held_since_status[destination]
            vote = participant.on_prepare(source, message, still_idle)
            if vote is not None:
                if vote.yes:
                    self.prepared[destination] = vote.token
                self._send(destination, ROOT, vote)
        elif isinstance(message, Abort):
            # A master whose busy vote was on its way when a succession aborted the round
            # never held the token.
            self.early_aborts[destination] += message.token in self.aborted and not (
                participant.frozen and self.prepared[destination] == message.token)
            participant.on_abort(source, message)
            if not participant.frozen:  # what was set aside is discoverable again
                self.prepared[destination] = None
                self.pending[destination] += self.deferred[destination]
                self.deferred[destination] = self.deferred_by_masters[destination] = 0
        elif isinstance(message, Commit):
            ack = participant.on_commit(source, message)
            if ack is not None:
                self._send(destination, ROOT, ack)

    @precondition(lambda self: not self.root.committing
                  and self.root.outcome is Outcome.RUNNING)
    @rule(m=MASTER)
    def succession(self, m):
        """A master other than root dies and one of its workers takes its place: a fresh
        participant with the dead one's work (its journal), nothing of what was on the way
        to or from it, and root told (federation/masters.py)."""
        m = self._master(m)
        if m == ROOT or m in self.withdrawn:  # a withdrawn master's group is itself alone
            return
        for pair in self.channels:
            if m in pair:
                self.channels[pair].clear()
        self.participants[m] = Participant(refresh=REFRESH, root=ROOT)
        self.pending[m] += self.deferred[m]  # what it set aside is in the corpus, unfrozen
        self.deferred[m] = self.deferred_by_masters[m] = 0
        self.prepared[m] = None
        self.last_status[m] = None
        self.foreign_aborts[m] = self.peer_prepares[m] = self.early_aborts[m] = 0
        self.held_since_status[m] = self.busy[m]
        self.root.restart(m)
        self.root_tick()  # the ABORT goes out in the same round

    @precondition(lambda self: self.root.outcome is not Outcome.CONFLICT
                  and ROOT not in self.withdrawn)
    @rule()
    def root_succession(self):
        """Root dies and one of its workers takes its place: a fresh coordinator that
        inherits the dead one's decided end, if any, a fresh participant with root's work,
        nothing of what was on the way to or from it, every other master told
        (federation/masters.py)."""
        decided = self.root.decided
        for pair in self.channels:
            if ROOT in pair:
                self.channels[pair].clear()
        self.root = self._coordinator()
        self.late_votes = 0  # the new coordinator's statistics begin at zero
        if decided is not None:
            self.root.inherit(decided)
        for m in self.left:  # their groups are gone, the withdrawn on record (roster.locate)
            self.root.leave(m)
        self.participants[ROOT] = Participant(refresh=REFRESH, root=ROOT)
        self.foreign_aborts[ROOT] = self.peer_prepares[ROOT] = self.early_aborts[ROOT] = 0
        self.last_status[ROOT] = None
        self.held_since_status[ROOT] = self.busy[ROOT]
        for m, participant in enumerate(self.participants):
            if m in self.left:
                continue
            participant.new_root(decided)
            if not participant.frozen and not participant.done:
                self.prepared[m] = None
                self.pending[m] += self.deferred[m]  # what it set aside is its work again
                self.deferred[m] = self.deferred_by_masters[m] = 0

    @precondition(lambda self: self.root.outcome is not Outcome.CONFLICT
                  and ROOT not in self.withdrawn)
    @rule(m=MASTER)
    def root_group_gone(self, m):
        """Root dies with every rank of its group: master `m` (the heir, federation/
        succession.py) hands its own work over as a withdrawing master does, says farewell
        and takes root's place with its workers (`root_succession`), its own index left."""
        m = self._master(m)
        if m == ROOT or m in self.withdrawn or len(self.withdrawn) + 1 == self.masters:
            return
        self.withdraw(m)
        self.left.add(m)
        for pair in self.channels:
            if m in pair:
                self.channels[pair].clear()
        self.root_succession()

    @rule(m=MASTER)
    def withdraw(self, m):
        """Master `m` has no worker left (federation/withdrawal.py): what it holds and what it
        has yet to discover goes to a master still working, at once or, if that one is
        frozen, once it is not; `m` holds nothing from then on."""
        m = self._master(m)
        if m in self.withdrawn or len(self.withdrawn) + 1 == self.masters:
            return  # the last master that works stops the campaign instead
        self.withdrawn.add(m)
        handed = self.pending[m] + self.busy[m]
        self.pending[m] = 0
        self.busy[m] = False  # held_since_status stays: its next status says it was busy
        for _ in range(handed):
            self._address(m, by_a_master=True)
        heir = min(set(range(self.masters)) - self.withdrawn)
        self.deferred[heir] += self.deferred[m]
        self.deferred_by_masters[heir] += self.deferred_by_masters[m]
        self.deferred[m] = self.deferred_by_masters[m] = 0

    @precondition(lambda self: self.root.outcome is not Outcome.CONFLICT)
    @rule(m=MASTER)
    def withdrawn_master_dies(self, m):
        """A withdrawn master other than root dies: its group is gone, root's coordinator
        restarts its view of it and lets it leave."""
        m = self._master(m)
        if m == ROOT or m not in self.withdrawn or m in self.left:
            return
        self.left.add(m)
        for pair in self.channels:
            if m in pair:
                self.channels[pair].clear()
        self.root.restart(m)
        self.root.leave(m)
        self.root_tick()

    @precondition(lambda self: self.root.outcome is not Outcome.CONFLICT)
    @rule(m=MASTER)
    def group_gone(self, m):
        """Master `m` (not root) dies with every rank of its group before it withdrew: root,
        in the round that sees it, withdraws it in its place (withdrawal.py `reclaim`): what
        it held or had yet to discover goes to a master still working, as in `withdraw`, and
        it leaves as a withdrawn master that died does."""
        m = self._master(m)
        if m == ROOT or m in self.withdrawn or len(self.withdrawn) + 1 == self.masters:
            return  # with no other master at work the campaign stops instead
        self.withdraw(m)
        self.withdrawn_master_dies(m)

    # -- faults --------------------------------------------------------------------------------

    @rule(kind=st.sampled_from(["garbage", "replay", "stranger", "abort", "peer"]),
          m=MASTER, garbage=st.binary(max_size=12))
    def fault(self, kind, m, garbage):
        """Garbage to root; a status delivered again later (its sequence no longer above the
        latest); a status from a rank that is no master; an ABORT of a token nobody holds; a
        PREPARE from a peer instead of root."""
        m = self._master(m)
        if kind == "garbage":
            self.channels[m, ROOT].append(garbage)
        elif kind == "replay" and self.last_status[m] is not None:
            self.channels[m, ROOT].append(self.last_status[m])
        elif kind == "stranger":
            self.root.on_status(self.masters, Status(len(garbage) + 1, idle=True), self.now)
        elif kind == "abort":
            self.participants[m].on_abort(ROOT, Abort("f" * 32))
            self.foreign_aborts[m] += 1
        elif kind == "peer":
            assert self.participants[m].on_prepare(self.masters, Prepare("e" * 32), True) is None
            self.peer_prepares[m] += 1

    # -- properties ----------------------------------------------------------------------------

    @invariant()
    def a_frozen_master_holds_no_work(self):
        for m, participant in enumerate(self.participants):
            assert not (participant.frozen and self.busy[m])

    @invariant()
    def nobody_leaves_while_another_can_publish(self):
        members = [m for m in range(self.masters) if m not in self.left]
        committed = {self.prepared[m] for m in members if self.participants[m].done}
        if not committed:
            return
        # Only an external producer's file may stay for the next campaign, never a child.
        assert not any(self.deferred_by_masters), "a child published after a freeze is lost"
        assert len(committed) == 1
        (token,) = committed
        for m in members:
            participant = self.participants[m]
            if participant.done:
                continue
            assert participant.frozen and self.prepared[m] == token
            assert not self.busy[m] and not self.pending[m]

    @invariant()
    def committed_means_every_master_done(self):
        if self.root.outcome is Outcome.COMMITTED:
            assert all(self.participants[m].done for m in range(self.masters)
                       if m not in self.left)

    @invariant()
    def the_control_plane_never_contradicts_itself(self):
        assert self.root.outcome is not Outcome.CONFLICT, self.root.conflict
        for m, participant in enumerate(self.participants):
            statistics = participant.statistics()
            assert statistics.refused_commits == 0 and statistics.superseded == 0
            assert statistics.unknown_token == self.foreign_aborts[m] + self.early_aborts[m]
            assert statistics.wrong_source == self.peer_prepares[m]
        assert self.root.statistics().unknown_token == self.late_votes

    def teardown(self):
        if not hasattr(self, "root"):
            return
        statistics = self.root.statistics()
        event(f"before quiet: {self.root.outcome.value}, {min(statistics.aborts, 2)}+ aborts")
        event(f"before quiet: {min(sum(self.deferred), 2)}+ inputs deferred")
        self.fall_quiet_and_commit()
        self.root_succession()  # after the end: the decided end holds for the successor
        assert self.root.outcome is Outcome.COMMITTED
        self.committed_means_every_master_done()

    def fall_quiet_and_commit(self):
        """Liveness: the environment falls quiet; rounds, deliveries and ticks commit."""
        for _ in range(LIVENESS_PERIODS):
            if self.root.outcome is Outcome.COMMITTED:
                break
            for m in set(range(self.masters)) - self.left:
                if self.pending[m] and self._can_discover(m):
                    self._discover(m, self.pending[m])
                self.busy[m] = False
                self.round(m)
            self._settle()
            self.now += REFRESH
            self.a_frozen_master_holds_no_work()
            self.nobody_leaves_while_another_can_publish()
            self.the_control_plane_never_contradicts_itself()
        assert self.root.outcome is Outcome.COMMITTED, self.root.statistics()
        self.committed_means_every_master_done()

    def _settle(self):
        """Tick and deliver until nothing is in flight."""
        while True:
            self.root_tick()
            pairs = [pair for pair, queue in self.channels.items() if queue]
            if not pairs:
                return
            for pair in pairs:
                while self.channels[pair]:
                    self._deliver(*pair)


TestQuiescenceMachine = pytest.mark.slow(QuiescenceMachine.TestCase)
TestQuiescenceMachine.settings = settings(max_examples=300, stateful_step_count=60,
                                          deadline=None)


def test_a_child_published_to_a_frozen_master_dooms_the_round():
    """The interleaving the gate exists for, replayed on the machine (the search finds it
    rarely): master 1 froze on a PREPARE; master 0, idle when root proposed, then takes an
    external seed and publishes a child to master 1 before it reads its own PREPARE. Its busy
    status reaches root before its YES, so root aborts and master 1 discovers the child."""
    machine = QuiescenceMachine()
    machine.start(masters=2, seeds=[])
    machine.every_loop_round()
    machine.advance(WINDOW)
    machine.every_loop_round()  # root proposes
    machine.deliver_everything_to(1)
    assert machine.participants[1].frozen
    machine.external_seed(0)
    machine.discover(0)
    machine.publish(0, 1)
    machine.finish(0)
    machine.round(0)  # busy
    machine.round(0)  # idle again, before its PREPARE
    machine.deliver_everything_to(0)  # its vote, then root reads the statuses and the votes
    machine.deliver_everything_to(0)
    machine.root_tick()
    machine.deliver_everything_in_flight()
    assert machine.root.statistics().aborts == 1
    assert not machine.participants[1].frozen and machine.pending[1] == 1
    machine.nobody_leaves_while_another_can_publish()
    machine.fall_quiet_and_commit()  # and the campaign still ends
