"""A dead master's place, with several masters (F320 under ULFM): the part of `Federation`
(masters.py) that learns of deaths, waits for successors, and hands a successor what it needs.

A worker of the dead master's group takes its place (job/federated.py). Root heeds the others'
successors; the others heed root's. The first master's successor inherits what root kept on
record (root_record.py), finds the others at their groups' lowest living ranks (roster.py) and
tells them; each hands it again what the dead root may have lost: its own succession, the
findings it has not seen named, its last figures, its STOP. A group with no rank left has no
successor: root withdraws its master from the work in its place (withdrawal.py); the first
master's, the next group's master leaves its own place and takes that one (`_heir`,
job/federated.py), its workers with it.
"""

from __future__ import annotations

import logging

from symcc_mpi.federation.own_master import OwnMaster
from symcc_mpi.federation.root_record import Departure, Inheritance
from symcc_mpi.federation.roster import SUCCESSION_WAIT, Claim
from symcc_mpi.federation.withdrawal import RECLAIM_LOCK_WAIT
from symcc_mpi.scheduling.frontier import Frontier
from symcc_mpi.wire.protocol import Stop, Successor, Tag

log = logging.getLogger("symcc_mpi.federation")

FAREWELL_CHECK = 1.0  # seconds between a new root's looks for the masters that closed


class FirstMastersPlace(Exception):
    """Raised by the master loop of the heir (`Succession._heir`): the first master's group
    died whole, and this master's group takes its place (job/federated.py)."""


class Succession:
    """Mixed into `Federation`, whose state it reads and changes (its roster, its quiescence
    participant and coordinator, root's figures, the messages a new root is handed again)."""

    def _masters_died(self) -> None:
        """Ranks died (ULFM); a worker's death anywhere is reported here too, and passed
        over. A worker of a dead master's group takes its place (roster.py): root waits for
        every master's successor, the others for root's. Until one comes the campaign cannot
        end; if none does in time it stops, for `--resume` to continue, and a group with no
        rank left goes to `_group_gone`. Another master's death is root's business alone."""
        awaited = self.indices if self.root else (0,)
        failed = self.channel.failed_ranks()
        for index in self.roster.died(failed, self.clock.monotonic(), awaits=awaited):
            log.error("master %d (world rank %d) died", index, self.roster.world_of[index])
            if self.root:
                self.coordinator.restart(index)
            if index in awaited and not failed.issuperset(self.world_ranks[index]):
                log.warning("waiting up to %g s for a worker of master %d to take its place",
                            SUCCESSION_WAIT, index)
        for index in list(self.roster.awaiting):
            if failed.issuperset(self.world_ranks[index]):  # nobody left to take its place
                del self.roster.awaiting[index]
                self._group_gone(index, failed)

    def _lose(self, reason: str) -> None:
        """The campaign cannot end exhausted: it stops for `--resume` (exit status 1)."""
        self.lost = True
        self.stop_reason = self.stop_reason or reason

    def _succession_overdue(self, now: float) -> None:
        """A dead master no worker replaced in time ends the campaign unfinished."""
        for index in self.roster.overdue(now):
            if self._withdrawn_died(index):
                continue
            log.error("no worker took master %d's place within %g s", index, SUCCESSION_WAIT)
            self._lose(f"master {index} died and no worker took its place: continue with "
                       "--resume")

    def _take_successor(self, own: OwnMaster, world: int, news: Successor) -> None:
        """World rank `world` says it took master `news.master`'s place (roster.vet): root
        heeds the others' successors, the others root's. The news may come before this
        master's own check of MPI's dead: then it checks first."""
        failed = self.channel.failed_ranks()
        claim = self.roster.vet(world, news, root=self.root, failed=failed)
        if claim is Claim.LIVES:
            self._masters_died()
            failed = self.channel.failed_ranks()
            claim = self.roster.vet(world, news, root=self.root, failed=failed)
        index = news.master
        if world in failed:  # it died since: its group's death is handled as such
            log.warning("rank %d claimed master %r's place, and died", world, index)
        elif claim in (Claim.INVALID, Claim.LIVES):
            own.count_malformed()
            log.warning("rank %d claims the place of master %r, which %s", world, index,
                        "lives" if claim is Claim.LIVES else "it cannot take")
        elif claim is Claim.KNOWN:
            self.roster.replace(world, news)  # its group's deaths on record
        elif claim is Claim.TAKEN and not self.root:
            self.roster.replace(world, news)
            log.warning("the first master: rank %d took its place", world)
            self._new_root(own, news.decided)
        elif claim is Claim.TAKEN:
            self.roster.replace(world, news)
            if index in self.figures:  # what the dead one did still counts
                self.departed.append(self.figures.pop(index))
            self.final.discard(index)
            self.coordinator.restart(index)
            log.warning("master %d: rank %d took its place", index, world)
            if self.done or self.stop_reason or self.ending:  # too late to work: it closes
                self._send(index, Tag.STOP, Stop(self.stop_reason or self.ending
                                                 or "frontier exhausted", self.lost))

    def _new_root(self, own: OwnMaster, decided: str | None) -> None:
        """A new root: what the dead one decided holds (quiescence.py), and what it may have
        lost is handed again (it names a finding once, and takes the latest figures)."""
        self.participant.new_root(decided)
        if self.announcement is not None:
            self._send(0, Tag.SUCCESSOR, self.announcement)
        for finding in own.campaign.findings_to_forward():
            self.forward(finding)
        for tag, message in ((Tag.STOP, self.stop_sent), (Tag.FIGURES, self.last_figures)):
            if message is not None:
                self._send(0, tag, message)

    def locate(self, failed: set[int]) -> None:
        """This master is a worker that takes a dead one's place: where the masters it talks
        to are (`failed`: MPI's dead), root's or (root) the others'. A group with no living
        rank has no master left: the campaign stops, for `--resume`."""
        talks_to = self.indices[1:] if self.root else (0,)
        for index in self.roster.locate(failed, talks_to, self.clock.monotonic()):
            self._group_gone(index, failed)

    def _group_gone(self, index: int, failed: set[int]) -> None:
        """Master `index` died and its group has no rank left to take its place. No loss if
        it had withdrawn from the work; if it had not, root withdraws it in its place
        (withdrawal.py). The first master's group gone, the heir's group takes its place
        (`_heir`), and the others wait for it as for any successor of root's; unless the
        first master had withdrawn (its share is the others' already, and its place would
        come back with workers nobody gives work): then the campaign stops."""
        if self._withdrawn_died(index):
            return
        if self.root and index != 0:
            self.reclaiming.setdefault(index, (self.clock.monotonic() + RECLAIM_LOCK_WAIT,
                                               self.clock.time()))
            return
        if index == 0 and not self.root and not (self.done or self.stop_reason) \
                and 0 not in self.withdrawn | self._withdrawals_on_record():
            log.error("the first master died with every rank of its group")
            self.root_gone_at = self.clock.time()
            self.heir = self._heir(failed)
            if not self.heir:
                self.roster.awaiting[0] = self.clock.monotonic() + SUCCESSION_WAIT
            return
        log.error("master %d died and its group has no worker left", index)
        self._lose(f"master {index} died and no worker of its is left: continue with "
                   "--resume")

    def _heir(self, failed: set[int]) -> bool:
        """Whether this master's group takes the first master's place, its group gone whole:
        the first group after it with a living rank. Every master decides alike from MPI's
        dead (a group seen dead is dead; one seen alive by mistake only delays the choice),
        and a group with a living rank has a master, or will once a worker took its place."""
        heir = next((k for k in self.indices[1:]
                     if not failed.issuperset(self.world_ranks[k])), None)
        if heir == self.index:
            log.warning("master %d takes the first master's place", self.index)
        return heir == self.index

    def inherit_root(self) -> Inheritance:
        """This master takes the first master's place: what the dead root left on record."""
        found = self.record.inherit()
        self.departed = found.departed
        self.roster.successions = found.successions
        self.findings = found.findings
        self.ending = found.ending
        self.inherited = True
        self._take_farewells(found.farewells)
        if found.decided is not None:
            self.participant.new_root(found.decided)
            self.coordinator.inherit(found.decided)
            self.decision_recorded = True
        return found

    def check_farewells(self, now: float) -> None:
        """A new root, now and then: the masters that closed since it took over. Their
        farewell and their STOP may have gone to the dead root; a master that stopped
        stops the campaign, as its STOP would have (a campaign missing a master cannot be
        exhausted)."""
        if self.inherited and now >= self.next_farewell_check:
            self.next_farewell_check = now + FAREWELL_CHECK
            self._take_farewells(self.record.farewells())

    def _take_farewells(self, departures: dict[int, Departure]) -> None:
        for index, departure in departures.items():
            if not 0 < index < self.masters:
                continue
            # Its FAREWELL message may have come first: it carries no STOP.
            if departure.stop is not None and not self.stop_reason:
                self.lost |= departure.failure
                self.stop_reason = f"master {index} stopped: {departure.stop}"
            if index in self.roster.farewells:
                continue
            self.roster.farewells.add(index)
            self.final.add(index)
            if departure.figures:
                self.figures[index] = departure.figures

    def announce_root(self, news: Successor) -> None:
        """The new root tells every other master that has not said farewell, and keeps its
        group's deaths as it keeps the others' (a successor before it may have died before
        its figures said so)."""
        self.announcement = news
        self.roster.replace(self.roster.world_of[0], news)
        for index in self.indices[1:]:
            if index not in self.roster.farewells:
                self._send(index, Tag.SUCCESSOR, news)

    def keep_root_figures(self, own: dict, budget_start: float) -> None:
        """Root, with each report: what a successor needs to go on counting (root_record)."""
        self.record.keep(own=own, departed=self.departed, successions=self.roster.successions,
                         findings=self.findings, budget_start=budget_start,
                         ending=self.ending)

    def take_over(self, frontier: Frontier) -> int:
        """This master is a worker that took a dead master's place: its leases become this
        one's (but those of what the journal it took over holds as done), and its target
        groups are released. Returns how many leases.
        A lease of another master's input (an expired one the dead master had taken over)
        was known, not queued, when the journal was read: it is queued now."""
        adopted = self.leases.adopt(frontier.done.__contains__)
        self.held.update(adopted)
        if self.targets is not None:
            self.targets.release_predecessors()
        for digest in adopted:
            if not self.owns(digest):
                frontier.requeue(digest)
        return len(adopted)

    def announce(self, news: Successor) -> None:
        """This master took a dead master's place (`take_over`): root is told, and a new
        root will be (`_new_root`)."""
        self.announcement = news
        self._send(0, Tag.SUCCESSOR, news)
