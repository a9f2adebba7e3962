"""Where each master of a several-master job is, and which are gone: the world rank each is
reached at, the dead, and the deaths a worker of the dead master's group may still answer by
taking its place (job/federated.py): root awaits every master's successor, the others the
first master's. A group's master is always its lowest living rank (a successor is the lowest
rank of the shrunk group), so a new first master finds the others from MPI's dead alone
(`locate`). Pure of MPI and of clocks: the caller passes what MPI reports and the time."""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from enum import Enum

from symcc_mpi.wire.protocol import Successor

SUCCESSION_WAIT = 60.0  # seconds root waits for a dead master's successor to say so
MAX_DEATHS_KEPT = 16  # of one Successor message, the latest
MAX_NAME = 200  # characters of a dead master's description kept


class Claim(Enum):
    """What a master makes of a `Successor` message (root of the others', the others of root's)."""

    INVALID = "invalid"  # no master's place the sender can take (or that the receiver heeds)
    LIVES = "lives"  # the master it names is alive
    TAKEN = "taken"  # the sender is that master now
    KNOWN = "known"  # told again


@dataclass
class Roster:
    world_ranks: list[range]  # per master index, its group's ranks in MPI_COMM_WORLD
    world_of: dict[int, int] = field(init=False)  # where each master is reached
    dead: set[int] = field(default_factory=set)  # masters known dead, and not replaced
    awaiting: dict[int, float] = field(default_factory=dict)  # dead masters: until when
    farewells: set[int] = field(default_factory=set)  # the masters done with the campaign
    # Masters found at a successor's rank (`locate`) before that successor said so: its word,
    # when it comes, is a takeover like any other (its duties are owed it: a decided end,
    # a STOP), not news told again.
    located: set[int] = field(default_factory=set)
    # Each succession as its successor told it, in stats.json's extra.failures form.
    successions: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.world_of = {k: ranks.start for k, ranks in enumerate(self.world_ranks)}

    def index_of(self, world_rank: int) -> int | None:
        return next((k for k, world in self.world_of.items() if world == world_rank), None)

    def died(self, failed: set[int], now: float, *, awaits: Container[int]) -> list[int]:
        """The masters among the dead world ranks `failed` not known dead before, but those
        that said farewell (their end is no death). Those in `awaits` may be replaced until
        SUCCESSION_WAIT after `now`."""
        dead = {k for k, world in self.world_of.items() if world in failed} - self.dead
        self.dead |= dead
        mourned = sorted(dead - self.farewells)
        self.awaiting.update((index, now + SUCCESSION_WAIT) for index in mourned
                             if index in awaits)
        return mourned

    def locate(self, failed: set[int], indices: Iterable[int], now: float) -> list[int]:
        """A successor's view of the masters `indices`: each at its group's lowest living
        rank (a successor that has not opened yet reads what it is sent once it has, and is
        awaited as any other: that rank may have ended without taking the place, after a
        STOP, and nobody reports a rank that ended); those whose group has no living rank,
        returned, are dead for good."""
        empty = []
        for index in indices:
            if living := [world for world in self.world_ranks[index] if world not in failed]:
                if self.world_of[index] != living[0]:
                    self.located.add(index)
                    self.awaiting[index] = now + SUCCESSION_WAIT
                self.world_of[index] = living[0]
            else:
                self.dead.add(index)
                empty.append(index)
        return empty

    def overdue(self, now: float) -> list[int]:
        """The dead masters no successor came for in time; forgotten as awaited."""
        late = [index for index, deadline in self.awaiting.items() if now >= deadline]
        for index in late:
            del self.awaiting[index]
        return late

    def vet(self, world: int, news: Successor, *, root: bool,
            failed: Container[int] = frozenset()) -> Claim:
        """Whether world rank `world` may take master `news.master`'s place, as told to
        root (another master's) or to another master (root's): a rank of that master's
        group, other than the dead one, the master known dead; or, for the first master's
        place once every rank of its group is in MPI's dead (`failed`), another master
        (federation/succession.py: the heir)."""
        index = news.master
        heeded = range(1, len(self.world_ranks)) if root else (0,)
        if not (isinstance(index, int) and index in heeded):
            return Claim.INVALID
        group = self.world_ranks[index]
        if index == 0 and all(rank in failed for rank in group):
            group = [rank for ranks in self.world_ranks[1:] for rank in ranks]
        if world not in group:
            return Claim.INVALID
        if world == self.world_of[index]:  # the dead one itself, or one located already
            if index in self.located:
                return Claim.TAKEN
            return Claim.INVALID if index in self.dead else Claim.KNOWN
        if index not in self.dead:
            return Claim.LIVES
        return Claim.TAKEN

    def replace(self, world: int, news: Successor) -> None:
        """After `vet` said TAKEN: master `news.master` is at `world` now, and the deaths
        its group went through are on record, each once."""
        index = news.master
        self.dead.discard(index)
        self.located.discard(index)
        self.awaiting.pop(index, None)
        self.world_of[index] = world
        known = {(s["master_index"], s["failed"][0]) for s in self.successions}
        self.successions += [{
            "generation": None, "failed": [death.failed[:MAX_NAME]],
            "requeued": death.requeued, "master": "new", "shrinks": 1,
            "recovery_seconds": round(death.seconds, 3), "detected": death.detected,
            "first_dispatch": None, "master_index": index}
            for death in news.deaths[-MAX_DEATHS_KEPT:]
            if (index, death.failed[:MAX_NAME]) not in known]

    def not_done(self, others: tuple[int, ...]) -> set[int]:
        """Of `others`, the masters that may still use the campaign's shared state: neither
        said farewell nor died for good (a dead one awaited may still be replaced)."""
        return set(others) - self.farewells - (self.dead - set(self.awaiting))
