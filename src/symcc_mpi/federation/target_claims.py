"""One master's claims on the target table several masters share (F311 §6–7, the shared level).

splitting.WorkSource reserves a group's targets locally, then asks `claim` here; only a
group claimed by this master goes out. The claim is made at the dispatch itself (late
binding, F311 §2): the group is *pending* from the claim to the send, *active* from the send
to its commit, and released when its part commits or is given back (`release`). A pending
claim therefore lives within one dispatch attempt and needs no heartbeat of its own; an
active one is kept alive by `round`, every `heartbeat_interval(work TTL, target TTL)`.

A claim is an efficiency device, not a fence (F311 §5): a group whose claim was lost (this
master paused past the TTL, another took the targets over) still commits, through the input's
work lease like any result; the loss is counted and its stale release deletes nothing of the
new owner's.

Each claim and release is logged at DEBUG as one line with its wall-clock time, taken after a
claim returns and before a release begins: the logged interval lies within the time the table
held the group, so two masters' logs show an overlap only if the table allowed one.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from symcc_mpi.config import target_lease_ttl
from symcc_mpi.durable.clock import SYSTEM_CLOCK, Clock
from symcc_mpi.federation.target_leases import FencedTargetLeaseTable, heartbeat_interval

log = logging.getLogger("symcc_mpi.targets")



def target_ttl(work_ttl: float, env: dict | None = None) -> tuple[float, str]:
    """The target leases' TTL, and the rejected setting to warn about ("" if none)."""
    ttl, rejected = target_lease_ttl(env)
    return (work_ttl if ttl is None else ttl), rejected


@dataclass
class ClaimFigures:
    claims: int = 0  # groups claimed
    conflicts: int = 0  # claims refused: a member held by another master (or by this one)
    releases: int = 0
    expiries: int = 0  # claims found taken over, at a heartbeat or at their release
    errors: int = 0  # claims or releases the table could not make (counted as refusals)


@dataclass(frozen=True)
class ClaimStatistics:
    claims: int
    conflicts: int
    releases: int
    expiries: int
    errors: int
    steals: int  # groups of another master this one took over, expired
    held: int
    ttl: float


class TargetClaims:
    def __init__(self, directory: Path, *, owner: str, work_ttl: float,
                 clock: Clock = SYSTEM_CLOCK, env: dict | None = None):
        ttl, rejected = target_ttl(work_ttl, env)
        if rejected:
            log.warning("ignored %s: not a positive number of seconds", rejected)
        self.ttl = ttl
        # Not fsynced: the table lives for one job epoch, and a target lease is an efficiency
        # device no result depends on (F311 §5); a fsynced 64-member claim took 70-400 ms here.
        self.table = FencedTargetLeaseTable(directory, owner=owner, ttl=ttl, clock=clock,
                                            fsync=False)
        self.clock = clock
        self.interval = heartbeat_interval(work_ttl, ttl)
        self.held: dict[str, tuple[str, tuple[int, ...]]] = {}  # work id -> (token, targets)
        self.lost: set[str] = set()  # held groups found taken over
        self.next_heartbeat = 0.0
        self.figures = ClaimFigures()

    def claim(self, work_id: str, targets: tuple[int, ...], worker: int = 0) -> bool:
        try:
            token = self.table.claim_group(targets, worker=worker, payload={"work": work_id})
        except (OSError, TimeoutError) as error:
            # Fail closed: the group waits; the table's lock or files will be back, or not.
            self.figures.errors += 1
            log.warning("target group of %s not claimed: %s", work_id[:12], error)
            return False
        if token is None:
            self.figures.conflicts += 1
            return False
        self.figures.claims += 1
        self.held[work_id] = (token, targets)
        log.debug("target group claimed t=%.6f work=%s token=%s targets=%s", SYSTEM_CLOCK.time(),
                  work_id, token, ",".join(map(str, targets)))
        return True

    def release(self, work_id: str) -> None:
        held = self.held.pop(work_id, None)
        known_lost = work_id in self.lost
        self.lost.discard(work_id)
        if held is None:
            return
        token, targets = held
        log.debug("target group released t=%.6f work=%s token=%s", SYSTEM_CLOCK.time(),
                  work_id, token)
        try:
            deleted = self.table.release(token, targets)
            self.figures.releases += 1
            # A master that was stopped past the TTL may commit before its next heartbeat:
            # the release is then where it finds the group taken over.
            if deleted < len(set(targets)) and not known_lost:
                self.figures.expiries += 1
                log.warning("the target group of %s expired and was taken over before its "
                            "release", work_id[:12])
        except (OSError, TimeoutError) as error:
            self.figures.errors += 1  # its TTL ends it (F311 §7.4)
            log.warning("target group of %s not released (its TTL ends it): %s",
                        work_id[:12], error)

    def round(self, now: float) -> None:
        """Heartbeat every held group when due, and then say what the table holds (F311 §9)
        while this master holds any."""
        if now < self.next_heartbeat:
            return
        self.next_heartbeat = now + self.interval
        if self.held:
            table = self.table.statistics()
            log.info("target table: %d groups of this master active (%d lost); %d records "
                     "leased, %d expired on disk", len(self.held), len(self.lost),
                     table.leased, table.expired)
        for work_id, (token, targets) in list(self.held.items()):
            try:
                alive = self.table.heartbeat(token, targets)
            except (OSError, TimeoutError) as error:
                log.warning("heartbeat of the target group of %s failed: %s", work_id[:12],
                            error)
                continue
            if not alive and work_id not in self.lost:
                self.lost.add(work_id)
                self.figures.expiries += 1
                log.warning("the target group of %s expired and was taken over: its result "
                            "still counts, through the input's lease", work_id[:12])

    def release_predecessors(self) -> None:
        """This master took a dead one's place, and its name: the groups that one claimed
        go, as its work went back to the frontier (they would bar their targets until their
        wall-clock expiry)."""
        try:
            released = self.table.release_owner(self.table.owner)
        except (OSError, TimeoutError) as error:
            self.figures.errors += 1  # their TTL ends them (F311 §7.4)
            log.warning("the dead master's target groups not released: %s", error)
            return
        if released:
            log.info("released %d target leases the dead master held", released)

    def release_all(self) -> None:
        for work_id in list(self.held):
            self.release(work_id)

    def statistics(self) -> ClaimStatistics:
        return ClaimStatistics(**asdict(self.figures),
                               steals=self.table.statistics(on_disk=False).steals,
                               held=len(self.held), ttl=self.ttl)
