"""What the dispatch coordinator hands out: whole inputs, and the parts of split ones. No I/O.

A campaign starts from a few seeds and ends on a thin frontier; at both ends one worker
would solve every branch of one input while the others wait. When fewer inputs wait than
workers are free, and the executor can be targeted (executors/base.py), an input's solving
is split instead:

- its first dispatch is a *trace* (part 0): the executor runs the input, solves nothing and
  reports the branch targets on its path;
- when the trace commits, those targets are dealt round-robin (late branches cost the
  solver more: a contiguous cut would load one worker with all of them) into one group per
  free worker, at most MAX_GROUP targets each (F311 §3), and each group is a part (1..k)
  dispatched on its own, with its own token and transaction;
- the input is done when every part is committed: the last one writes its done record.

Work ids: a whole input is its digest, a part "<digest>#<n>" (`part_id`, `parse_work_id`).

Local target reserve (F311 §6, the local level of admission): a group goes out only if none
of its targets is in a group in flight, of this input or of another, so two workers never
solve one branch at once; one that would is passed over for the next (a backfill) and waits
for its turn. With several masters, `shared_admission` is the second level (F311's shared
target-group claim): asked only after the local reserve, and a refusal rolls the local
reserve back and commits nothing (no dispatch, no attempt).
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from symcc_mpi.scheduling.frontier import Frontier

MAX_GROUP = 64  # targets per group (F311 §3)
TRACE = 0  # the part that reports the path's targets
PART_SEPARATOR = "#"
# Why a part goes out again after a run ended with its input half split (the journal's
# requeue records, verify's re-execution oracle).
SPLIT_ANEW = "its input is split anew"


def part_id(digest: str, part: int) -> str:
    return f"{digest}{PART_SEPARATOR}{part}"


def parse_work_id(work_id: str) -> tuple[str, int | None]:
    """(input digest, part number), or (digest, None) for a whole input."""
    digest, separator, part = work_id.partition(PART_SEPARATOR)
    return (digest, int(part)) if separator else (digest, None)


def deal(targets: Iterable[int], groups: int) -> list[tuple[int, ...]]:
    """`targets` dealt round-robin into `groups` groups (more when a group would exceed
    MAX_GROUP); no empty group."""
    targets = list(targets)
    count = max(1, groups, -(-len(targets) // MAX_GROUP))
    return [tuple(targets[i::count]) for i in range(count) if targets[i::count]]


@dataclass(frozen=True)
class Job:
    """One dispatch about to be sent. What adjusts it before the send (the coordinator's
    `adjusters`: the QSYM map bits its worker lacks, ...) may change its parameters, never
    its targets: those were reserved and claimed (F311 §7.2, `keep_targets`)."""

    work_id: str
    digest: str
    targets: tuple[int, ...] | None  # None: every branch; (): none (a trace)
    shipment: Any = None  # pruning.Shipment: the map bits that travel with it
    pruned: bool = True  # False: solved with QSYM's map and linearization off (a seed)


def keep_targets(adjusted: Job, frozen: tuple[int, ...] | None) -> Job:
    """The target contract: the job as adjusted, with the targets it had before."""
    return adjusted if adjusted.targets == frozen else replace(adjusted, targets=frozen)


@dataclass
class SplitStatistics:
    traces: int = 0  # trace dispatches committed
    split_inputs: int = 0  # inputs whose trace found targets to deal
    groups: int = 0  # groups dealt
    split_dispatches: int = 0  # group dispatches that went out
    local_conflicts: int = 0  # a group passed over: one of its targets was in flight here
    shared_conflicts: int = 0  # a group the other masters' target table refused
    backfills: int = 0  # dispatches that went to a later proposal after a refusal
    targets_on_paths: int = 0  # targets the traces reported, summed
    solved: set[int] = field(default_factory=set)  # distinct targets handed to the solver

    def figures(self) -> dict:
        return {"traces": self.traces, "split_inputs": self.split_inputs,
                "groups": self.groups, "split_dispatches": self.split_dispatches,
                "local_conflicts": self.local_conflicts,
                "shared_conflicts": self.shared_conflicts, "backfills": self.backfills,
                "targets_on_paths": self.targets_on_paths,
                "targets_solved": len(self.solved)}


class WorkSource:
    """The coordinator's side of the frontier: `peek` → `take` → (`put_back` before the send |
    `requeue` after it | `finish` once committed). With `split` False it is the frontier."""

    def __init__(self, frontier: Frontier, *, split: bool = False,
                 shared_admission: Callable[[str, tuple[int, ...], int], bool] | None = None,
                 on_release: Callable[[str], object] | None = None,
                 proposal_limit: int | None = None,
                 mine: Callable[[str], bool] | None = None, lower=None):
        """`shared_admission(work_id, targets, worker)`: the other masters' word on a group
        (True: claimed for this master, for that worker rank); `on_release(work_id)`: a
        group's claim may be released (its part committed, or set aside). `proposal_limit`:
        how many waiting groups one `peek` may propose (F311 §6): by default all, so that
        a refused one is backfilled by the next; the number that go out is the free
        workers', the coordinator's.
        `mine(digest)`: with several masters, whether an input in the frontier is this
        master's to analyse (the others' are dropped at their dispatch). `lower`: the
        tiers past the interesting frontier (tiers.lower.LowerTiers), asked when it is
        empty; their work goes out whole, never split."""
        self.mine = mine
        self.lower = lower
        self.frontier = frontier
        self.split = split
        self.proposal_limit = proposal_limit
        self.shared_admission = shared_admission
        self.on_release = on_release
        self.groups: dict[str, tuple[int, ...]] = {}  # every part not yet done: its targets
        self.waiting: deque[str] = deque()  # groups to dispatch; requeued ones in front
        self.open: dict[str, set[int]] = {}  # per split input: its parts not yet committed
        self.committed: dict[str, list[int]] = {}  # per split input: its parts committed
        self.in_flight: dict[str, tuple[int, ...]] = {}  # groups admitted: their reserve
        self.peeked: str | None = None  # a group admitted by `peek`, not taken yet
        self.reserved: Counter[int] = Counter()
        self.dispatches: Counter[str] = Counter()  # per part
        self.stats = SplitStatistics()

    # -- reading -------------------------------------------------------------------------

    @property
    def has_pending(self) -> bool:
        return bool(self.waiting or self.frontier.pending) \
            or (self.lower is not None and self.lower.has_work())

    def job(self, work_id: str) -> tuple[str, tuple[int, ...] | None]:
        """(input digest, targets to solve: None for every one, () for a trace)."""
        digest, part = parse_work_id(work_id)
        if part is None:
            return digest, None
        return digest, () if part == TRACE else self.groups[work_id]

    def is_done(self, work_id: str) -> bool:
        digest, part = parse_work_id(work_id)
        if part is None:
            return digest in self.frontier.done
        return digest in self.frontier.done or part not in self.open.get(digest, ())

    def completes_input(self, work_id: str, path_targets: Iterable[int] | None) -> bool:
        """Whether committing `work_id` (whose run reported `path_targets`) finishes its
        input: a whole input, a trace with nothing to deal, or its input's last part."""
        digest, part = parse_work_id(work_id)
        if part is None:
            return True
        if part == TRACE:
            return not path_targets
        return self.open.get(digest) == {part}

    # -- the coordinator's steps ---------------------------------------------------------

    def peek(self, free: int, worker: int = 0) -> str | None:
        """The work that goes out next, when `free` workers (this one included) have none:
        a waiting group that passes admission (held for the `take` that follows; another
        `peek` lets it go), else the frontier's next input, traced when fewer inputs wait
        than workers are free. None: nothing can go out now."""
        if self.peeked is not None:
            self._unreserve(self.peeked)
            self.peeked = None
        refused = False
        for work_id in list(itertools.islice(self.waiting, self.proposal_limit)):
            if self._admit(work_id, worker):
                self.stats.backfills += refused
                self.peeked = work_id
                return work_id
            refused = True
        while self.frontier.pending and self.frontier.pending[0] in self.open:
            # Its lease recovered (F320 §2.3, a slow lease write) while its parts are still
            # out: they finish it here, and a trace of it again would forget them.
            self.frontier.take()
        if not self.frontier.pending:
            return self.lower.peek() if self.lower is not None and not refused else None
        digest = self.frontier.pending[0]
        self.stats.backfills += refused
        if self.split and free >= 2 and self._waiting_inputs(free) < free:
            return part_id(digest, TRACE)
        return digest

    def _waiting_inputs(self, enough: int) -> int:
        """Inputs waiting in the frontier for this master, counted up to `enough`."""
        pending: Iterable[str] = self.frontier.pending
        if self.mine is not None:
            pending = filter(self.mine, pending)
        return sum(1 for _ in itertools.islice(pending, enough))

    def take(self, work_id: str) -> None:
        digest, part = parse_work_id(work_id)
        if self.lower is not None and self.lower.offers(work_id):
            self.lower.take(work_id)
            return
        if part is None or part == TRACE:
            taken = self.frontier.take()
            assert taken == digest, (taken, digest)
            if part == TRACE:
                self.open[digest] = {TRACE}
            return
        assert self.peeked == work_id, (self.peeked, work_id)
        self.peeked = None
        self.waiting.remove(work_id)
        self.stats.split_dispatches += 1

    def put_back(self, work_id: str) -> None:
        """Undo `take` exactly: the dispatch never reached a worker."""
        digest, part = parse_work_id(work_id)
        if part is None or part == TRACE:
            if part == TRACE:
                del self.open[digest]
            self.frontier.put_back(digest)
            return
        self.stats.split_dispatches -= 1
        self._unreserve(work_id)
        self.waiting.appendleft(work_id)

    def requeue(self, work_id: str) -> None:
        """A dispatch taken back after its send: the same work goes out again, first."""
        digest, part = parse_work_id(work_id)
        if part is None or part == TRACE:
            self.open.pop(digest, None)  # a trace's input may be split anew
            self.frontier.requeue(digest)
            return
        self._unreserve(work_id)
        self.waiting.appendleft(work_id)

    def set_aside(self, work_id: str) -> str:
        """The work is deferred (dispatch.ProtocolRecovery): a part's input goes with it, its
        other parts are dropped (those in flight still commit their children). Returns the
        digest deferred."""
        digest, part = parse_work_id(work_id)
        if part is not None:
            self._drop_parts(digest)
        return digest

    def give_up_splits(self) -> list[str]:
        """Forget the split inputs still open (their master withdraws from the work,
        federation/withdrawal.py): their parts not committed yet are dropped, and each input
        goes whole to its new owner, to be split anew there (as `--resume` splits anew an
        input a run left half done). Returns those inputs."""
        if self.peeked is not None:
            self._unreserve(self.peeked)
            self.peeked = None
        given_up = list(self.open)
        for digest in given_up:
            self._drop_parts(digest)
        return given_up

    def committed_parts(self, work_id: str) -> list[str]:
        """The parts of `work_id`'s input committed so far, if it is split and not done: set
        aside, it is split anew when it goes out again (on --resume), and they with it."""
        digest, _ = parse_work_id(work_id)
        return [part_id(digest, part) for part in self.committed.get(digest, ())]

    def _drop_parts(self, digest: str) -> None:
        self.committed.pop(digest, None)
        for other in self.open.pop(digest, set()):
            other_id = part_id(digest, other)
            self._unreserve(other_id)
            if other_id in self.waiting:
                self.waiting.remove(other_id)
            self.groups.pop(other_id, None)

    def discard(self, work_id: str) -> None:
        """Take `work_id` out for good without a dispatch (its bytes cannot be read)."""
        digest, part = parse_work_id(work_id)
        if self.lower is not None and self.lower.offers(work_id):
            self.lower.take(work_id)
        elif part is None or part == TRACE:
            self.frontier.take()
        else:  # a group `peek` admitted: out of the line, and no dispatch counted
            assert self.peeked == work_id, (self.peeked, work_id)
            self.peeked = None
            self.waiting.remove(work_id)
            self.set_aside(work_id)

    def note_dispatch(self, work_id: str) -> int:
        """Count a dispatch; returns how many `work_id` has had."""
        digest, part = parse_work_id(work_id)
        if part is None:
            return self.frontier.note_dispatch(digest)
        self.dispatches[work_id] += 1
        return self.dispatches[work_id]

    def finish(self, work_id: str, path_targets: Iterable[int] | None,
               solved_targets: Iterable[int], free: int) -> None:
        """`work_id` committed; a trace's targets are dealt into one group per `free`
        worker (at least one)."""
        digest, part = parse_work_id(work_id)
        self.stats.solved.update(solved_targets)
        if part is None:
            self.frontier.mark_done(digest)
            if self.lower is not None:
                self.lower.finished(digest)
            return
        self.dispatches.pop(work_id, None)
        if part == TRACE:
            self.stats.traces += 1
            targets = list(path_targets or ())
            self.stats.targets_on_paths += len(targets)
            self.open[digest] = set()
            self.committed[digest] = [TRACE]
            if targets:
                self.stats.split_inputs += 1
                for number, group in enumerate(deal(targets, free), start=1):
                    self.groups[part_id(digest, number)] = group
                    self.waiting.append(part_id(digest, number))
                    self.open[digest].add(number)
                    self.stats.groups += 1
        else:
            self._unreserve(work_id)
            self.groups.pop(work_id, None)
            self.open[digest].discard(part)
            self.committed[digest].append(part)
        if not self.open[digest]:
            del self.open[digest]
            del self.committed[digest]
            self.frontier.mark_done(digest)

    # -- admission -----------------------------------------------------------------------

    def _admit(self, work_id: str, worker: int) -> bool:
        """Local reserve, then the shared claim (F311 §6); nothing held after a refusal."""
        targets = self.groups[work_id]
        if any(self.reserved[t] for t in targets):
            self.stats.local_conflicts += 1
            return False
        self.reserved.update(targets)
        if self.shared_admission is not None \
                and not self.shared_admission(work_id, targets, worker):
            self.reserved -= Counter(targets)
            self.stats.shared_conflicts += 1
            return False
        self.in_flight[work_id] = targets
        return True

    def _unreserve(self, work_id: str) -> None:
        targets = self.in_flight.pop(work_id, None)
        if targets is not None:
            self.reserved -= Counter(targets)
            if self.on_release is not None:
                self.on_release(work_id)
