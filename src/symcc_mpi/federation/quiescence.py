"""Two-phase global quiescence among M masters (F320 §2.5): when may the campaign end?

"Every master is idle right now" does not end a campaign of several masters: a child may be in
flight on the shared filesystem, an expired lease may be recovered, a status may be in flight.
So root (master 0) runs a two-phase gate over the masters' communicator:

1. every master sends root its idle/busy `Status`, each with a strictly greater sequence
   number: at once when it changes, and again every `refresh` seconds while it does not, so
   root can tell a fresh idle from an old one;
2. root proposes a random-token `Prepare` to every master (itself included) only when every
   master's latest status is idle, fresh (younger than `stale_after`) and continuously idle for
   `window` seconds (`--max-idle`);
3. a master that receives it rescans (external inputs, shared corpus, expired leases) and votes
   YES, freezing its discovery, or BUSY;
4. when every vote is in, root sends `Commit` to all if every vote was YES and no busy status
   arrived meanwhile; otherwise `Abort` with the exact token to exactly the YES voters, and
   proposes again only after a new stable-idle window;
5. a master acknowledges `committed=True` only for its own prepared token and then leaves its
   dispatch loop; root has ended only with every exact ACK in;
6. a busy status, a refused ACK, or a vote or ACK of another token after COMMIT is a conflict
   of the control plane: the caller ends the job with a bounded Abort(70), never a success.

Why this is safe (no master leaves while another can still publish): a master is idle from its
last idle status before PREPARE up to its vote, or it says so: the moment it is busy again its
next status is busy and goes out at once, and on the same FIFO channel as its vote, so root
holds it before the vote (and dooms the round), or the master votes BUSY itself (its caller
passes `still_idle=False` after any work since its previous `status` call, and a YES needs that
call to have said idle too). Hence nobody publishes after PREPARE; the rescan at each vote sees
everything published before; a YES voter discovers nothing until its decision. A file added
after a master's YES stays in the corpus for the next campaign (F320 §2.5, last paragraph).

Root waits for every vote before it decides, rather than aborting at the first BUSY: then its
ABORT goes to exactly the masters that froze for that token. Aborting at once would have to
guess which YES votes are still in flight, and a master left frozen by a lost guess would never
discover work again.

Pure: no MPI, no clock reads. The master loop decodes what arrives (`decode`), hands it to its
`Participant` (every master) or `Coordinator` (root), sends what they return, and passes `now`
(monotonic seconds). Anything unexpected (wrong source, old sequence, unknown token) is counted
in `statistics()` and ignored; bytes that are not a control message raise `MalformedControl`.
"""

from __future__ import annotations

import enum
import math
import secrets
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, fields

from symcc_mpi.wire.control import (
    TOKEN_BYTES,
    Abort,
    Ack,
    Commit,
    ControlMessage,
    Prepare,
    Status,
    Vote,
)


class Outcome(enum.Enum):
    RUNNING = "running"
    COMMITTED = "committed"  # every master acknowledged: root may shut its workers down
    CONFLICT = "conflict"  # the control plane contradicted itself after COMMIT: Abort(70)


class _Phase(enum.Enum):
    RUNNING = enum.auto()  # waiting for a stable idle window
    PREPARING = enum.auto()  # PREPARE sent, collecting votes
    COMMITTING = enum.auto()  # COMMIT sent, collecting ACKs
    COMMITTED = enum.auto()
    CONFLICT = enum.auto()


_OUTCOMES = {_Phase.COMMITTED: Outcome.COMMITTED, _Phase.CONFLICT: Outcome.CONFLICT}


@dataclass
class _Seen:
    """Root's view of one master's statuses."""

    sequence: int = 0  # the latest accepted; statuses at or below it are stale
    received_at: float = -math.inf  # root's clock
    # When root received the first idle status of the current idle streak (root's clock); None
    # while busy, before any status, and after an abort (a new window needs new evidence).
    idle_since: float | None = None


@dataclass(frozen=True)
class CoordinatorStatistics:
    outcome: Outcome
    proposals: int  # PREPAREs proposed
    aborts: int  # proposals aborted
    unanswered: int  # of those, rounds whose votes did not all come within answer_within
    wrong_source: int  # from a rank that is not a master
    stale_sequence: int  # a status at or below the sequence already seen from its master
    unknown_token: int  # a vote or ACK of no open round (a late answer to an aborted one)
    duplicate: int  # a second vote or ACK from one master for one token
    late: int  # anything after the outcome was settled


class Coordinator:
    """Root's side: watches statuses, proposes, decides, and settles the outcome."""

    def __init__(self, masters: int, *, window: float, stale_after: float,
                 answer_within: float = math.inf,
                 random_bytes: Callable[[int], bytes] = secrets.token_bytes) -> None:
        """`answer_within`: seconds root waits for the votes of a round (then the round is
        aborted, to every master: a late YES voter processes the ABORT after its PREPARE,
        so none stays frozen) and for the ACKs of a COMMIT (then a conflict: Abort(70))."""
        if masters < 2:
            raise ValueError(f"quiescence needs at least 2 masters, not {masters}")
        if not window >= 0:
            raise ValueError(f"window must be >= 0 seconds, not {window}")
        if not stale_after > 0:
            raise ValueError(f"stale_after must be > 0 seconds, not {stale_after}")
        if not answer_within > 0:
            raise ValueError(f"answer_within must be > 0 seconds, not {answer_within}")
        self._masters = masters
        self._members = set(range(masters))  # those whose status, vote and ACK count
        self._window = window
        self._answer_within = answer_within
        self._round_began = -math.inf  # root's clock: when the open PREPARE or COMMIT went
        self._commit_unstamped = False  # a COMMIT decided since the last tick
        self._stale_after = stale_after
        self._random_bytes = random_bytes
        self._seen = [_Seen() for _ in range(masters)]
        self._phase = _Phase.RUNNING
        self._token: str | None = None  # of the open round
        self._votes: dict[int, bool] = {}
        self._acks: set[int] = set()
        self._doomed = False  # a busy status arrived while preparing: abort whatever the votes
        self._outbox: list[tuple[int, ControlMessage]] = []
        self._conflict: str | None = None
        self._counts: Counter[str] = Counter()

    @property
    def outcome(self) -> Outcome:
        return _OUTCOMES.get(self._phase, Outcome.RUNNING)

    @property
    def conflict(self) -> str | None:
        """Why the outcome is CONFLICT, in one line (None otherwise)."""
        return self._conflict

    def on_status(self, source: int, message: Status, now: float) -> None:
        if not self._accepts(source):
            return
        seen = self._seen[source]
        if message.sequence <= seen.sequence:
            self._counts["stale_sequence"] += 1
            return
        seen.sequence = message.sequence
        seen.received_at = now
        if message.idle:
            if seen.idle_since is None:
                seen.idle_since = now
            return
        seen.idle_since = None
        if self._phase is _Phase.PREPARING:
            self._doomed = True
        elif self._phase is _Phase.COMMITTING:
            self._fail(f"master {source} reported busy after COMMIT {self._token}")

    def on_vote(self, source: int, message: Vote) -> None:
        if not self._accepts(source):
            return
        if self._phase is _Phase.COMMITTING:
            if message.token != self._token:
                self._fail(f"master {source} voted on token {message.token} "
                           f"after COMMIT {self._token}")
            else:
                self._counts["duplicate"] += 1
        elif self._phase is not _Phase.PREPARING or message.token != self._token:
            self._counts["unknown_token"] += 1
        elif source in self._votes:
            self._counts["duplicate"] += 1
        else:
            self._votes[source] = message.yes
            if self._members <= self._votes.keys():
                self._decide()

    def on_ack(self, source: int, message: Ack) -> None:
        if not self._accepts(source):
            return
        if self._phase is not _Phase.COMMITTING:
            self._counts["unknown_token"] += 1
        elif message.token != self._token:
            self._fail(f"master {source} acknowledged token {message.token}, "
                       f"not COMMIT {self._token}")
        elif not message.committed:
            self._fail(f"master {source} refused COMMIT {self._token}")
        elif source in self._acks:
            self._counts["duplicate"] += 1
        else:
            self._acks.add(source)
            if self._members <= self._acks:
                self._phase = _Phase.COMMITTED

    def tick(self, now: float) -> list[tuple[int, ControlMessage]]:
        """What to send now, as (destination master, message): a PREPARE to every master
        when the idle window is stable, and the decisions taken since the last tick."""
        if self._commit_unstamped:
            self._commit_unstamped = False
            self._round_began = now  # the COMMIT goes out with this tick
        late = now - self._round_began > self._answer_within
        if self._phase is _Phase.PREPARING and late:
            self._counts["unanswered"] += 1
            self._counts["aborts"] += 1
            self._phase = _Phase.RUNNING
            self._outbox.extend((master, Abort(self._token)) for master in sorted(self._members))
            for seen in self._seen:
                seen.idle_since = None
        elif self._phase is _Phase.COMMITTING and late:
            missing = sorted(self._members - self._acks)
            self._fail(f"master(s) {', '.join(map(str, missing))} did not acknowledge COMMIT "
                       f"{self._token} within {self._answer_within:g} s")
        if self._phase is _Phase.RUNNING and self._stably_idle(now):
            random = self._random_bytes(TOKEN_BYTES)
            if len(random) != TOKEN_BYTES:
                raise ValueError(f"the random source gave {len(random)} bytes, not {TOKEN_BYTES}")
            token = random.hex()
            self._phase = _Phase.PREPARING
            self._token = token
            self._votes = {}
            self._doomed = False
            self._counts["proposals"] += 1
            self._round_began = now
            self._outbox.extend((master, Prepare(token)) for master in sorted(self._members))
        outbox, self._outbox = self._outbox, []
        return outbox

    @property
    def committing(self) -> bool:
        """A COMMIT is out and its ACKs are awaited."""
        return self._phase is _Phase.COMMITTING

    @property
    def decided(self) -> str | None:
        """The token of the COMMIT decided, once it is (it goes out with the next tick)."""
        return self._token if self._phase in (_Phase.COMMITTING, _Phase.COMMITTED) else None

    def inherit(self, decided: str) -> None:
        """This root took a dead one's place after it decided the end (`decided`, its COMMIT
        token, on record): the end holds. Its ACKs went to the dead root: none is awaited."""
        self._phase = _Phase.COMMITTED
        self._token = decided
        self._outbox = []

    def restart(self, master: int) -> None:
        """`master` died, or a worker took its place (federation/masters.py): what root saw
        of it no longer holds, and its successor counts its statuses from 1 again. An open
        PREPARE is aborted, its vote will not come; a new window needs new evidence from
        every master. Once a COMMIT is out nothing changes: the ACK that does not come ends
        in a conflict, as any missing ACK does."""
        if not (isinstance(master, int) and 0 <= master < self._masters) \
                or self._phase is not _Phase.RUNNING and self._phase is not _Phase.PREPARING:
            return
        self._seen[master] = _Seen()
        if self._phase is _Phase.PREPARING:
            self._counts["aborts"] += 1
            self._phase = _Phase.RUNNING
            # To whoever voted YES or may still: not to a busy voter, nor to the successor.
            self._outbox.extend((m, Abort(self._token)) for m in sorted(self._members)
                                if m != master and self._votes.get(m, True))
            for seen in self._seen:
                seen.idle_since = None

    def leave(self, master: int) -> None:
        """`master` left the campaign holding no work (it withdrew from the work, then died;
        or its whole group died and root withdrew it: federation/withdrawal.py): it can
        publish nothing, and nothing of it is awaited any more, its vote, its ACK, nor its
        status; what it would have answered is what the others' answers decide."""
        if master == 0 or master not in self._members:  # root: this coordinator itself
            return
        self._members.discard(master)
        if self._phase is _Phase.PREPARING and self._members <= self._votes.keys():
            self._decide()
        elif self._phase is _Phase.COMMITTING and self._members <= self._acks:
            self._phase = _Phase.COMMITTED

    def statistics(self) -> CoordinatorStatistics:
        return CoordinatorStatistics(outcome=self.outcome,
                                     **_counted(CoordinatorStatistics, self._counts))

    def _accepts(self, source: int) -> bool:
        if not (isinstance(source, int) and 0 <= source < self._masters):
            self._counts["wrong_source"] += 1
            return False
        if self._phase in _OUTCOMES:
            self._counts["late"] += 1
            return False
        return True

    def _stably_idle(self, now: float) -> bool:
        return all(seen.idle_since is not None
                   and now - seen.received_at <= self._stale_after
                   and now - seen.idle_since >= self._window
                   for master, seen in enumerate(self._seen) if master in self._members)

    def _decide(self) -> None:
        token = self._token
        yes_voters = [master for master, yes in sorted(self._votes.items()) if yes]
        if self._members <= set(yes_voters) and not self._doomed:
            self._phase = _Phase.COMMITTING
            self._commit_unstamped = True
            self._acks = set()
            self._outbox.extend((master, Commit(token)) for master in sorted(self._members))
            return
        self._phase = _Phase.RUNNING
        self._counts["aborts"] += 1
        self._outbox.extend((master, Abort(token)) for master in yes_voters)
        for seen in self._seen:  # the next window starts at each master's next status
            seen.idle_since = None

    def _fail(self, reason: str) -> None:
        self._phase = _Phase.CONFLICT
        self._conflict = reason
        self._outbox = []


@dataclass(frozen=True)
class ParticipantStatistics:
    statuses: int  # statuses sent
    yes_votes: int
    busy_votes: int
    aborts: int  # exact ABORTs that unfroze it
    refused_commits: int  # COMMITs of a token it had not prepared
    wrong_source: int  # a PREPARE, ABORT or COMMIT not from root
    unknown_token: int  # an ABORT of a token it does not hold
    duplicate: int  # a PREPARE or COMMIT of the token it already answered
    superseded: int  # a PREPARE while it held another token (that round was never decided)
    late: int  # a PREPARE after it committed
    new_roots: int  # the first master's successors it heard of


class Participant:
    """Every master's side (root's too): its statuses, its votes, and its freeze."""

    def __init__(self, *, refresh: float, root: int = 0) -> None:
        if not refresh > 0:
            raise ValueError(f"refresh must be > 0 seconds, not {refresh}")
        self._refresh = refresh
        self._root = root
        self._sequence = 0
        self._sent_idle: bool | None = None
        self._sent_at = -math.inf
        self._reported_idle = False  # what the latest status() call said
        self._prepared: str | None = None  # the token it voted YES on, until its decision
        self._done = False
        self._counts: Counter[str] = Counter()

    @property
    def frozen(self) -> bool:
        """Discovery is frozen: from a YES vote until the exact ABORT; for good once done."""
        return self._prepared is not None

    @property
    def done(self) -> bool:
        """It acknowledged the COMMIT of its prepared token: the master leaves its loop."""
        return self._done

    def status(self, idle: bool, now: float) -> Status | None:
        """The status to send root this round, if any. `idle`: the master holds no work and
        held none since the previous call (a busy spell between two calls must not vanish)."""
        if self._done:
            return None
        self._reported_idle = idle
        idle = bool(idle)
        if idle == self._sent_idle and now - self._sent_at < self._refresh:
            return None
        self._sequence += 1
        self._sent_idle = idle
        self._sent_at = now
        self._counts["statuses"] += 1
        return Status(self._sequence, idle)

    def on_prepare(self, source: int, message: Prepare, still_idle: bool) -> Vote | None:
        """The vote to send root (None: ignored). `still_idle`: after a rescan of external
        inputs, the shared corpus and expired leases, the master holds no work and held none
        since its last status() call."""
        if not self._from_root(source):
            return None
        if self._done:
            self._counts["late"] += 1
            return None
        if message.token == self._prepared:
            self._counts["duplicate"] += 1
            return Vote(message.token, yes=True)
        if self._prepared is not None:
            self._counts["superseded"] += 1
        yes = still_idle and self._reported_idle
        self._prepared = message.token if yes else None
        self._counts["yes_votes" if yes else "busy_votes"] += 1
        return Vote(message.token, yes=yes)

    def on_abort(self, source: int, message: Abort) -> None:
        """Only the exact token of the round it froze for unfreezes it."""
        if not self._from_root(source):
            return
        if self._done or message.token != self._prepared:
            self._counts["unknown_token"] += 1
            return
        self._prepared = None
        self._counts["aborts"] += 1

    def on_commit(self, source: int, message: Commit) -> Ack | None:
        """The ACK to send root (None: ignored); `committed` only for its prepared token."""
        if not self._from_root(source):
            return None
        if message.token != self._prepared:
            self._counts["refused_commits"] += 1
            return Ack(message.token, committed=False)
        if self._done:
            self._counts["duplicate"] += 1
        self._done = True
        return Ack(message.token, committed=True)

    def new_root(self, decided: str | None) -> None:
        """A worker of the first master took its place. What the dead one decided holds
        (`decided`, the token of its COMMIT, which it made durable before it went out): the
        master is done. Without a decision the dead root's PREPARE is void (no COMMIT of it
        ever went out): the freeze ends, and the new root has this master's status at once."""
        self._counts["new_roots"] += 1
        if decided is not None:
            self._done = True
            return
        self._prepared = None
        self._sent_idle = None

    def statistics(self) -> ParticipantStatistics:
        return ParticipantStatistics(**_counted(ParticipantStatistics, self._counts))

    def _from_root(self, source: int) -> bool:
        if source != self._root:
            self._counts["wrong_source"] += 1
            return False
        return True


def _counted(statistics: type, counts: Counter[str]) -> dict[str, int]:
    """A statistics snapshot's counters: every field but the outcome."""
    return {field.name: counts[field.name] for field in fields(statistics)
            if field.name != "outcome"}
