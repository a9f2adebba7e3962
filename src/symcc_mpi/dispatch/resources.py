"""What a dispatch reserves and how each is compensated before and after the send (F313 §3.3).

| resource             | before send (exact undo)              | after send (discard)            |
| -------------------- | ------------------------------------- | ------------------------------- |
| shared exact-work    | current-token `abandon`               | same; taken over: fails safely  |
| local work journal   | append `reclaim`, lease removed       | append `reclaim`, never `done`  |
| target group / local | release                               | release                         |
| state task lease     | revoke, lease count rolled back       | drop active lease, one failure  |
| parameter assignment | delete pending token, count undone    | delete pending token, no reward |
| algorithm stage      | LIFO rewind: cursor, priors, seq, RNG | drop pending feedback only      |
| seed-worker pairing  | drop active, assignment count undone  | drop active, real count kept    |
| verified proposal    | attempts - 1, back to pending/retry   | attempts kept, retry/rejected   |

Each reservation is made by a `reserve(tx, ...)` that registers its compensation in the
transaction right after it succeeds (F313 D2); a reservation made of two steps (local target
registry, then the shared group claim) undoes its first step itself if the second refuses or
raises, so the transaction only ever holds complete reservations. Handles are idempotent: a
compensation after the success path ran (or twice) does nothing, so the exception boundary
may sweep a half-committed dispatch safely.

The shared work lease, the local journal and the shared target table are the durable stores
of `durable/` (another layer), seen here only through the small Protocols below; the five
scheduling components are small but real and hold exactly the state their compensations
restore. The hybrid mode grows their policies, not their compensation contracts.
"""

from __future__ import annotations

import enum
import itertools
import math
import random
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .transaction import CompensationRefused, DispatchError, DispatchTransaction


class ResourceName(enum.Enum):
    SHARED_WORK = "shared-work-lease"
    LOCAL_JOURNAL = "local-journal"
    LOCAL_TARGETS = "local-targets"
    TARGET_GROUP = "target-group"
    STATE_TASK = "state-task"
    PARAMETER = "parameter-assignment"
    ALGORITHM = "algorithm-stage"
    SEED_WORKER = "seed-worker"
    PROPOSAL = "proposal"


def _tokens() -> Iterator[str]:
    return (f"{n:016x}" for n in itertools.count(1))


# == shared exact-work lease ================================================================


class HeldLease(Protocol):
    @property
    def token(self) -> str: ...


class WorkLeases(Protocol):
    """The shared, fenced work lease table (F320 §2.3; `durable.leases.FencedWorkLeaseTable`)."""

    def claim(self, work_id: str) -> HeldLease | None:
        """A fresh lease with a new token, or None if held elsewhere, committing or done."""

    def abandon(self, work_id: str, token: str) -> bool:
        """Delete a `leased` record of exactly `token`; False if stale, committing or done."""

    def begin_commit(self, work_id: str, token: str) -> bool:
        """leased → committing for exactly `token` (not stealable afterwards, F321)."""

    def complete(self, work_id: str, token: str) -> bool:
        """committing → done for exactly `token`."""


class HoldState(enum.Enum):
    HELD = "held"
    COMMITTING = "committing"
    COMPLETED = "completed"
    RELEASED = "released"  # given back by a compensation
    LOST = "lost"  # the token was no longer current: taken over, nothing of ours to undo


class WorkLeaseHold:
    """One claimed work lease, by its exact token."""

    def __init__(self, owner: SharedWorkLeases, work_id: str, token: str):
        self._owner = owner
        self.work_id = work_id
        self.token = token
        self.state = HoldState.HELD

    def begin_commit(self) -> bool:
        """The fence: True moves the lease to `committing` (use as `DispatchTables` fence)."""
        if self.state is HoldState.COMMITTING:
            return True
        if self.state is not HoldState.HELD:
            return False
        if self._owner.leases.begin_commit(self.work_id, self.token):
            self.state = HoldState.COMMITTING
            return True
        self.state = HoldState.LOST
        self._owner.counts["lost"] += 1
        return False

    def complete(self) -> bool:
        if self.state is HoldState.COMPLETED:
            return True
        if self.state is not HoldState.COMMITTING:
            return False
        done = self._owner.leases.complete(self.work_id, self.token)
        if done:
            self.state = HoldState.COMPLETED
            self._owner.counts["completed"] += 1
        return done

    def abandon(self) -> bool:
        """F313 §3.3: current-token abandon in both phases; a taken-over token fails safely."""
        if self.state is HoldState.COMMITTING:
            # F321: `committing` is an irreversible decision, not stealable and not abandonable;
            # crash recovery redoes it. Say so rather than pretend it was undone.
            raise CompensationRefused(f"work {self.work_id[:12]} is committing (F321)")
        if self.state is not HoldState.HELD:
            return False
        if self._owner.leases.abandon(self.work_id, self.token):
            self.state = HoldState.RELEASED
            self._owner.counts["abandoned"] += 1
            return True
        self.state = HoldState.LOST
        self._owner.counts["lost"] += 1
        return False


@dataclass(frozen=True)
class SharedWorkStatistics:
    claims: int
    refused: int
    abandoned: int
    lost: int
    completed: int


class SharedWorkLeases:
    def __init__(self, leases: WorkLeases):
        self.leases = leases
        self.counts: Counter[str] = Counter()

    def reserve(self, tx: DispatchTransaction) -> WorkLeaseHold | None:
        """Claim `tx.work_id`; None if someone else holds it (nothing registered then)."""
        held = self.leases.claim(tx.work_id)
        if held is None:
            self.counts["refused"] += 1
            return None
        self.counts["claims"] += 1
        hold = WorkLeaseHold(self, tx.work_id, held.token)
        tx.register(ResourceName.SHARED_WORK.value, before_send=hold.abandon,
                    after_send=hold.abandon)
        return hold

    def statistics(self) -> SharedWorkStatistics:
        c = self.counts
        return SharedWorkStatistics(c["claims"], c["refused"], c["abandoned"], c["lost"],
                                    c["completed"])


# == local work journal =====================================================================


class LeaseJournal(Protocol):
    """This master's local journal (F313 §3.4; `durable.journal.WorkLeaseJournal`).

    Each call appends its event first and changes memory only once the append succeeded; an
    append failure raises and leaves memory as it was.
    """

    def lease(self, work_id: str, token: str) -> bool: ...

    def reclaim(self, work_id: str, token: str) -> bool: ...

    def done(self, work_id: str, token: str) -> bool: ...


class JournalState(enum.Enum):
    LEASED = "leased"
    DONE = "done"
    RECLAIMED = "reclaimed"


class JournalHold:
    def __init__(self, owner: LocalJournal, work_id: str, token: str):
        self._owner = owner
        self.work_id = work_id
        self.token = token
        self.state = JournalState.LEASED

    def reclaim(self) -> None:
        """Both phases: append `reclaim`, never `done` (F313 §3.3). If the append raises, the
        journal did not change and neither does this hold; the failure is the caller's record."""
        if self.state is not JournalState.LEASED:
            return
        self._owner.journal.reclaim(self.work_id, self.token)
        self.state = JournalState.RECLAIMED
        self._owner.counts["reclaimed"] += 1

    def done(self) -> None:
        if self.state is JournalState.DONE:
            return
        if self.state is not JournalState.LEASED:
            raise DispatchError(f"work {self.work_id[:12]} was reclaimed: cannot be done")
        self._owner.journal.done(self.work_id, self.token)
        self.state = JournalState.DONE
        self._owner.counts["done"] += 1


@dataclass(frozen=True)
class JournalResourceStatistics:
    leased: int
    reclaimed: int
    done: int


class LocalJournal:
    def __init__(self, journal: LeaseJournal):
        self.journal = journal
        self.counts: Counter[str] = Counter()

    def reserve(self, tx: DispatchTransaction, token: str | None = None) -> JournalHold:
        """Journal the lease (under the shared lease token if there is one). If the append
        raises nothing was leased and nothing is registered."""
        token = tx.token if token is None else token
        self.journal.lease(tx.work_id, token)
        self.counts["leased"] += 1
        hold = JournalHold(self, tx.work_id, token)
        tx.register(ResourceName.LOCAL_JOURNAL.value, before_send=hold.reclaim,
                    after_send=hold.reclaim)
        return hold

    def statistics(self) -> JournalResourceStatistics:
        c = self.counts
        return JournalResourceStatistics(c["leased"], c["reclaimed"], c["done"])


# == target groups (local registry + shared table) ==========================================


MAX_GROUP = 64  # F311: a group is the primary target plus non-skip action targets, ≤ 64


def normalize_targets(targets: Iterable[int]) -> tuple[int, ...]:
    group = tuple(sorted({int(t) for t in targets}))
    if not group or len(group) > MAX_GROUP:
        raise ValueError(f"a target group has 1..{MAX_GROUP} members (got {len(group)})")
    return group


@dataclass(frozen=True)
class LocalTargetStatistics:
    held: int
    reservations: int
    refused: int
    released: int


class LocalTargetRegistry:
    """The in-process target reservation (F309/F310): one worker per target, all or nothing."""

    def __init__(self) -> None:
        self._holder: dict[int, int] = {}
        self._counts: Counter[str] = Counter()

    def holder(self, target: int) -> int | None:
        return self._holder.get(target)

    def held(self) -> dict[int, int]:
        return dict(self._holder)

    def reserve(self, targets: Iterable[int], worker: int) -> bool:
        group = normalize_targets(targets)
        if any(self._holder.get(t, worker) != worker for t in group):
            self._counts["refused"] += 1
            return False
        for target in group:
            self._holder[target] = worker
        self._counts["reservations"] += 1
        return True

    def release(self, targets: Iterable[int], worker: int) -> int:
        """Release the members `worker` holds; another worker's members are left alone."""
        released = 0
        for target in normalize_targets(targets):
            if self._holder.get(target) == worker:
                del self._holder[target]
                released += 1
        self._counts["released"] += released
        return released

    def statistics(self) -> LocalTargetStatistics:
        c = self._counts
        return LocalTargetStatistics(len(self._holder), c["reservations"], c["refused"],
                                     c["released"])


class HeldTargetGroup(Protocol):
    @property
    def token(self) -> str: ...


class TargetLeases(Protocol):
    """The shared fenced target table (F311 §4; `durable.leases.FencedTargetLeaseTable`)."""

    def claim_group(self, targets: Iterable[int], *, worker: str = "") -> HeldTargetGroup | None:
        """All members with one token, or None."""

    def release(self, targets: Iterable[int], token: str) -> int:
        """Delete the members still carrying exactly `token`."""


class TargetHold:
    def __init__(self, owner: TargetGroups, group: tuple[int, ...], worker: int,
                 shared_token: str | None):
        self._owner = owner
        self.group = group
        self.worker = worker
        self.shared_token = shared_token
        self.local_held = True
        self.shared_held = shared_token is not None

    def release_local(self) -> None:
        if self.local_held:
            self._owner.local.release(self.group, self.worker)
            self.local_held = False

    def release_shared(self) -> None:
        if self.shared_held:
            assert self._owner.shared is not None and self.shared_token is not None
            self._owner.shared.release(self.group, self.shared_token)  # may raise: TTL ends it
            self.shared_held = False

    def release(self) -> None:
        """Success path: shared first, then local, as a rollback would; the local release runs
        even if the shared one raises (the error still propagates)."""
        try:
            self.release_shared()
        finally:
            self.release_local()


class TargetGroups:
    def __init__(self, local: LocalTargetRegistry, shared: TargetLeases | None = None):
        self.local = local
        self.shared = shared

    def reserve(self, tx: DispatchTransaction, targets: Iterable[int]) -> TargetHold | None:
        """F311 admission: local reserve, then the shared claim; None (nothing kept) if either
        refuses. Released in both phases (F313 §3.3)."""
        group = normalize_targets(targets)
        if not self.local.reserve(group, tx.worker):
            return None
        claim = None
        if self.shared is not None:
            try:
                claim = self.shared.claim_group(group, worker=str(tx.worker))
            except BaseException:
                self.local.release(group, tx.worker)
                raise
            if claim is None:
                self.local.release(group, tx.worker)
                return None
        hold = TargetHold(self, group, tx.worker, None if claim is None else claim.token)
        # Acquisition order local → shared, so a rollback releases shared first: if the shared
        # directory is unwritable the local registry is still released after it (F313 §3.1).
        tx.register(ResourceName.LOCAL_TARGETS.value, before_send=hold.release_local,
                    after_send=hold.release_local)
        if claim is not None:
            tx.register(ResourceName.TARGET_GROUP.value, before_send=hold.release_shared,
                        after_send=hold.release_shared)
        return hold


# == state task leases ======================================================================


@dataclass(frozen=True)
class StateLease:
    token: str
    task: str
    worker: int


@dataclass(frozen=True)
class StateTaskStatistics:
    active: int
    granted: int  # lease count: real grants (a revoked, never-sent grant does not count)
    failures: int
    completed: int


class StateTaskLeases:
    """State-shard task leases: one holder per task; per-task lease, failure, success counts."""

    def __init__(self) -> None:
        self._active: dict[str, StateLease] = {}
        self._holder: dict[str, str] = {}  # task → token
        self._leases: Counter[str] = Counter()
        self._failures: Counter[str] = Counter()
        self._completed: Counter[str] = Counter()
        self._tokens = _tokens()

    def active(self) -> dict[str, StateLease]:
        return dict(self._active)

    def holder(self, task: str) -> StateLease | None:
        token = self._holder.get(task)
        return None if token is None else self._active[token]

    def lease_count(self, task: str) -> int:
        return self._leases[task]

    def failures(self, task: str) -> int:
        return self._failures[task]

    def completed(self, task: str) -> int:
        return self._completed[task]

    def grant(self, task: str, worker: int) -> StateLease | None:
        if task in self._holder:
            return None
        lease = StateLease(next(self._tokens), task, worker)
        self._active[lease.token] = lease
        self._holder[task] = lease.token
        self._leases[task] += 1
        return lease

    def revoke(self, token: str) -> bool:
        """Before send: the lease never served an execution; its count is rolled back."""
        lease = self._drop(token)
        if lease is None:
            return False
        self._leases[lease.task] -= 1
        return True

    def fail(self, token: str) -> bool:
        """After send: drop the active lease and record one real failure."""
        lease = self._drop(token)
        if lease is None:
            return False
        self._failures[lease.task] += 1
        return True

    def release(self, token: str) -> bool:
        lease = self._drop(token)
        if lease is None:
            return False
        self._completed[lease.task] += 1
        return True

    def reserve(self, tx: DispatchTransaction, task: str) -> StateLease | None:
        lease = self.grant(task, tx.worker)
        if lease is None:
            return None
        tx.register(ResourceName.STATE_TASK.value, before_send=lambda: self.revoke(lease.token),
                    after_send=lambda: self.fail(lease.token))
        return lease

    def statistics(self) -> StateTaskStatistics:
        return StateTaskStatistics(len(self._active), sum(self._leases.values()),
                                   sum(self._failures.values()), sum(self._completed.values()))

    def _drop(self, token: str) -> StateLease | None:
        lease = self._active.pop(token, None)
        if lease is not None:
            del self._holder[lease.task]
        return lease


# == self-config parameter assignment =======================================================


@dataclass(frozen=True)
class ParameterAssignment:
    token: str
    arm: int
    parameters: Mapping[str, Any]


@dataclass(frozen=True)
class ArmStatistics:
    assigned: int  # real dispatches with this arm
    pulls: int  # observed rewards
    reward: float
    discarded: int  # dispatched, result untrusted: no reward learnt


@dataclass(frozen=True)
class ParameterStatistics:
    pending: int
    arms: tuple[ArmStatistics, ...]


class ParameterTuner:
    """Self-config parameter bandit: pending tokens, per-arm assignment and reward counts.

    Selection: an arm never observed first (fewest assignments), then the best mean reward
    with an exploration bonus (UCB1) — enough to make the compensation contract matter:
    a phantom assignment or reward would bias the next choice.
    """

    def __init__(self, arms: Sequence[Mapping[str, Any]]):
        if not arms:
            raise ValueError("a parameter tuner needs at least one arm")
        self.arms = tuple(dict(a) for a in arms)
        self._pending: dict[str, ParameterAssignment] = {}
        self._assigned = [0] * len(self.arms)
        self._pulls = [0] * len(self.arms)
        self._reward = [0.0] * len(self.arms)
        self._discarded = [0] * len(self.arms)
        self._tokens = _tokens()

    def pending(self) -> dict[str, ParameterAssignment]:
        return dict(self._pending)

    def _choose(self) -> int:
        total = sum(self._pulls)
        unobserved = [i for i, p in enumerate(self._pulls) if p == 0]
        if unobserved:
            return min(unobserved, key=lambda i: (self._assigned[i], i))

        def score(i: int) -> float:
            mean = self._reward[i] / self._pulls[i]
            return mean + math.sqrt(2 * math.log(total) / self._pulls[i])
        return max(range(len(self.arms)), key=lambda i: (score(i), -i))

    def assign(self) -> ParameterAssignment:
        arm = self._choose()
        assignment = ParameterAssignment(next(self._tokens), arm, self.arms[arm])
        self._pending[assignment.token] = assignment
        self._assigned[arm] += 1
        return assignment

    def cancel(self, token: str) -> bool:
        """Before send: delete the pending token and undo its assignment (F313 D3)."""
        assignment = self._pending.pop(token, None)
        if assignment is None:
            return False
        self._assigned[assignment.arm] -= 1
        return True

    def discard(self, token: str) -> bool:
        """After send: delete the pending token, keep the assignment, observe nothing (D4)."""
        assignment = self._pending.pop(token, None)
        if assignment is None:
            return False
        self._discarded[assignment.arm] += 1
        return True

    def observe(self, token: str, reward: float) -> bool:
        """Learn from a committed result; an unknown (cancelled, discarded) token is ignored."""
        assignment = self._pending.pop(token, None)
        if assignment is None:
            return False
        self._pulls[assignment.arm] += 1
        self._reward[assignment.arm] += reward
        return True

    def reserve(self, tx: DispatchTransaction) -> ParameterAssignment:
        assignment = self.assign()
        tx.register(ResourceName.PARAMETER.value,
                    before_send=lambda: self.cancel(assignment.token),
                    after_send=lambda: self.discard(assignment.token))
        return assignment

    def statistics(self) -> ParameterStatistics:
        return ParameterStatistics(len(self._pending), tuple(
            ArmStatistics(self._assigned[i], self._pulls[i], self._reward[i], self._discarded[i])
            for i in range(len(self.arms))))


# == multi-stage SMT algorithm assignment ===================================================


@dataclass(frozen=True)
class AlgorithmSelection:
    token: str
    stage: str
    sequence: int


@dataclass(frozen=True)
class _AlgorithmSnapshot:
    cursor: int
    sequence: int
    priors: tuple[int, ...]
    rng_state: object


@dataclass(frozen=True)
class AlgorithmStatistics:
    cursor: int
    sequence: int
    pending: int
    priors: tuple[int, ...]  # selections per stage
    feedback: tuple[int, ...]  # observed results per stage
    exact_rewinds: int
    conservative_rewinds: int  # a later selection existed: only the pending token went
    discarded: int


class StagedAlgorithmSelector:
    """A multi-stage SMT algorithm schedule: a stage cursor, per-stage prior counts, a global
    sequence number and an RNG that both stamps the token and decides when the cursor moves.

    F313 §3.3: exact rewind is allowed only in the pre-send window before any later global
    selection, i.e. for the LIFO top of the selections not yet resolved; it restores cursor,
    priors, sequence number and RNG, so a rolled-back series replays the same stages and the
    same tokens. Any other rewind only removes the pending token (the later selection may
    depend on the state this one produced). After a send, only the pending feedback goes.
    """

    def __init__(self, stages: Sequence[str], *, seed: int = 0,
                 advance_probability: float = 0.5):
        if not stages or len(set(stages)) != len(stages):
            raise ValueError("an algorithm schedule needs one or more distinct stages")
        if not 0.0 <= advance_probability <= 1.0:
            raise ValueError("advance_probability must be within [0, 1]")
        self.stages = tuple(stages)
        self.advance_probability = advance_probability
        self._cursor = 0
        self._sequence = 0
        self._priors = [0] * len(self.stages)
        self._rng = random.Random(seed)
        self._pending: dict[str, AlgorithmSelection] = {}
        self._history: list[tuple[str, _AlgorithmSnapshot]] = []  # unresolved, in order
        self._feedback = [0] * len(self.stages)
        self._reward = [0.0] * len(self.stages)
        self._counts: Counter[str] = Counter()

    @property
    def cursor(self) -> int:
        return self._cursor

    @property
    def sequence(self) -> int:
        return self._sequence

    def pending(self) -> dict[str, AlgorithmSelection]:
        return dict(self._pending)

    def select(self) -> AlgorithmSelection:
        snapshot = _AlgorithmSnapshot(self._cursor, self._sequence, tuple(self._priors),
                                      self._rng.getstate())
        stage = self._cursor
        self._priors[stage] += 1
        self._sequence += 1
        selection = AlgorithmSelection(f"{self._sequence:08x}{self._rng.getrandbits(64):016x}",
                                       self.stages[stage], self._sequence)
        if self._rng.random() < self.advance_probability:
            self._cursor = (self._cursor + 1) % len(self.stages)
        self._pending[selection.token] = selection
        self._history.append((selection.token, snapshot))
        return selection

    def rewind(self, token: str) -> bool:
        """Before send. True if the rewind was exact (LIFO top); False if only the pending token
        was removed (or it was unknown)."""
        if self._pending.pop(token, None) is None:
            return False
        if self._history and self._history[-1][0] == token:
            _, snapshot = self._history.pop()
            self._cursor = snapshot.cursor
            self._sequence = snapshot.sequence
            self._priors = list(snapshot.priors)
            self._rng.setstate(snapshot.rng_state)
            self._counts["exact_rewinds"] += 1
            return True
        self._forget(token)
        self._counts["conservative_rewinds"] += 1
        return False

    def discard(self, token: str) -> bool:
        """After send: drop the pending feedback; the executed stage is not rewound."""
        if self._pending.pop(token, None) is None:
            return False
        self._forget(token)
        self._counts["discarded"] += 1
        return True

    def feedback(self, token: str, reward: float) -> bool:
        selection = self._pending.pop(token, None)
        if selection is None:
            return False
        self._forget(token)
        index = self.stages.index(selection.stage)
        self._feedback[index] += 1
        self._reward[index] += reward
        return True

    def reserve(self, tx: DispatchTransaction) -> AlgorithmSelection:
        selection = self.select()
        tx.register(ResourceName.ALGORITHM.value,
                    before_send=lambda: self.rewind(selection.token),
                    after_send=lambda: self.discard(selection.token))
        return selection

    def statistics(self) -> AlgorithmStatistics:
        c = self._counts
        return AlgorithmStatistics(self._cursor, self._sequence, len(self._pending),
                                   tuple(self._priors), tuple(self._feedback),
                                   c["exact_rewinds"], c["conservative_rewinds"], c["discarded"])

    def _forget(self, token: str) -> None:
        self._history = [(t, s) for t, s in self._history if t != token]


# == SimiFuzz seed-worker assignment ========================================================


@dataclass(frozen=True)
class SeedWorkerStatistics:
    active: int
    assignments: int  # real assignments (an unsent one is rolled back)
    finished: int
    discarded: int


class SeedWorkerPairing:
    """Which seed each worker explores now, and how often each seed was assigned."""

    def __init__(self) -> None:
        self._active: dict[int, str] = {}
        self._assignments: Counter[str] = Counter()
        self._counts: Counter[str] = Counter()

    def active(self) -> dict[int, str]:
        return dict(self._active)

    def assignments(self, seed: str) -> int:
        return self._assignments[seed]

    def choose(self, seeds: Iterable[str]) -> str | None:
        """The least-assigned seed (ties: smallest name), for diversity across workers."""
        return min(seeds, key=lambda s: (self._assignments[s], s), default=None)

    def assign(self, worker: int, seed: str) -> bool:
        if worker in self._active:
            return False
        self._active[worker] = seed
        self._assignments[seed] += 1
        return True

    def release(self, worker: int, seed: str) -> bool:
        """Before send: drop the pairing and roll its assignment count back."""
        if self._active.get(worker) != seed:
            return False
        del self._active[worker]
        self._assignments[seed] -= 1
        return True

    def discard(self, worker: int, seed: str) -> bool:
        """After send: drop the pairing; the assignment was real and stays counted."""
        if self._active.get(worker) != seed:
            return False
        del self._active[worker]
        self._counts["discarded"] += 1
        return True

    def finish(self, worker: int, seed: str) -> bool:
        if self._active.get(worker) != seed:
            return False
        del self._active[worker]
        self._counts["finished"] += 1
        return True

    def reserve(self, tx: DispatchTransaction, seed: str) -> bool:
        if not self.assign(tx.worker, seed):
            return False
        worker = tx.worker
        tx.register(ResourceName.SEED_WORKER.value,
                    before_send=lambda: self.release(worker, seed),
                    after_send=lambda: self.discard(worker, seed))
        return True

    def statistics(self) -> SeedWorkerStatistics:
        return SeedWorkerStatistics(len(self._active), sum(self._assignments.values()),
                                    self._counts["finished"], self._counts["discarded"])


# == verified proposals =====================================================================


class ProposalState(enum.Enum):
    PENDING = "pending"
    DISPATCHED = "dispatched"
    RETRY = "retry"
    REJECTED = "rejected"
    VERIFIED = "verified"


RESULT_LOST = "result lost"


@dataclass(frozen=True)
class Proposal:
    proposal_id: str
    state: ProposalState
    attempts: int
    reason: str = ""


@dataclass(frozen=True)
class ProposalStatistics:
    pending: int
    dispatched: int
    retry: int
    rejected: int
    verified: int
    attempts: int


class ProposalBook:
    """Verified proposals: pending → dispatched → verified, or → retry/rejected when lost."""

    def __init__(self, *, max_attempts: int = 3):
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.max_attempts = max_attempts
        self._proposals: dict[str, Proposal] = {}
        self._taken_from: dict[str, ProposalState] = {}  # state before DISPATCHED

    def get(self, proposal_id: str) -> Proposal:
        return self._proposals[proposal_id]

    def proposals(self) -> dict[str, Proposal]:
        return dict(self._proposals)

    def add(self, proposal_id: str) -> bool:
        if proposal_id in self._proposals:
            return False
        self._proposals[proposal_id] = Proposal(proposal_id, ProposalState.PENDING, 0)
        return True

    def take(self) -> str | None:
        """The oldest pending or retry proposal, now dispatched (attempts + 1)."""
        for proposal in self._proposals.values():
            if proposal.state in (ProposalState.PENDING, ProposalState.RETRY):
                self._taken_from[proposal.proposal_id] = proposal.state
                self._set(proposal, ProposalState.DISPATCHED, proposal.attempts + 1, "")
                return proposal.proposal_id
        return None

    def restore(self, proposal_id: str) -> bool:
        """Before send: attempts − 1 and back where it was taken from (pending, or retry)."""
        proposal = self._proposals.get(proposal_id)
        if proposal is None or proposal.state is not ProposalState.DISPATCHED:
            return False
        previous = self._taken_from.pop(proposal_id)
        self._set(proposal, previous, proposal.attempts - 1, proposal.reason)
        return True

    def lose(self, proposal_id: str, reason: str = RESULT_LOST) -> bool:
        """After send: the attempt was real; retry while attempts remain, else rejected."""
        proposal = self._proposals.get(proposal_id)
        if proposal is None or proposal.state is not ProposalState.DISPATCHED:
            return False
        self._taken_from.pop(proposal_id, None)
        state = (ProposalState.RETRY if proposal.attempts < self.max_attempts
                 else ProposalState.REJECTED)
        self._set(proposal, state, proposal.attempts, reason)
        return True

    def settle(self, proposal_id: str, *, verified: bool, reason: str = "") -> bool:
        proposal = self._proposals.get(proposal_id)
        if proposal is None or proposal.state is not ProposalState.DISPATCHED:
            return False
        self._taken_from.pop(proposal_id, None)
        state = ProposalState.VERIFIED if verified else ProposalState.REJECTED
        self._set(proposal, state, proposal.attempts, reason)
        return True

    def reserve(self, tx: DispatchTransaction) -> str | None:
        proposal_id = self.take()
        if proposal_id is None:
            return None
        tx.register(ResourceName.PROPOSAL.value, before_send=lambda: self.restore(proposal_id),
                    after_send=lambda: self.lose(proposal_id))
        return proposal_id

    def statistics(self) -> ProposalStatistics:
        states = Counter(p.state for p in self._proposals.values())
        return ProposalStatistics(
            states[ProposalState.PENDING], states[ProposalState.DISPATCHED],
            states[ProposalState.RETRY], states[ProposalState.REJECTED],
            states[ProposalState.VERIFIED], sum(p.attempts for p in self._proposals.values()))

    def _set(self, proposal: Proposal, state: ProposalState, attempts: int, reason: str) -> None:
        self._proposals[proposal.proposal_id] = Proposal(proposal.proposal_id, state, attempts,
                                                         reason)
