"""Several masters, one campaign (`--masters M`, F320): what a master does about the others.

The job's ranks form M groups (layout.groups), each a master and its workers, and all share one OUT.
A master analyses an input only if it owns it (rendezvous hashing, ownership.py) and wins its
claim in the job's shared lease table (leases.py); a result counts only if its lease
is still current when its commit begins. Masters learn of each other's children from the
publication logs (durable/hints.py) and of stalled work from expired leases; the campaign ends
when all of them agree it is over (quiescence.py), never because one of them is idle.

The first master (index 0, root) is also the campaign's AFL face: the others hand it what they
keep and the crashes they find (`Finding`), and their figures (`Figures`), over the masters'
communicator; it alone names queue/, crashes/, hangs/ entries (AFL's sync skips an id that
appears after a higher one) and writes stats.json, fuzzer_stats and plot_data.

A dead master's place is taken by a worker of its group, the first master's too, and the
first master's by the next group's master if its group died whole (succession.py); a master
left with no worker withdraws from the work, which the others share, and root withdraws in
its place a master whose group died whole (withdrawal.py); the masters' last meeting is
closing.py's.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path

from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.layout import LEASE_DIRECTORY_PREFIX
from symcc_mpi.durable.clock import SYSTEM_CLOCK, Clock
from symcc_mpi.federation.closing import Closing
from symcc_mpi.federation.figures import FederationStatistics, plain
from symcc_mpi.federation.hints import HintReader, PublicationLog
from symcc_mpi.federation.lease_config import LeaseConfig
from symcc_mpi.federation.leases import FencedWorkLeaseTable
from symcc_mpi.federation.map_exchange import EXCHANGE_INTERVAL, MapExchange
from symcc_mpi.federation.master_leases import WorkLeases
from symcc_mpi.federation.own_master import OwnMaster
from symcc_mpi.federation.ownership import lease_directory, owner_among, owner_name
from symcc_mpi.federation.quiescence import (
    Coordinator,
    Outcome,
    Participant,
)
from symcc_mpi.federation.root_record import RootRecord
from symcc_mpi.federation.roster import Roster
from symcc_mpi.federation.succession import Succession
from symcc_mpi.federation.target_claims import TargetClaims
from symcc_mpi.federation.withdrawal import Withdrawal
from symcc_mpi.wire.control import Abort, Ack, Commit, Prepare, Status, Vote
from symcc_mpi.wire.protocol import (
    SHA256_PATTERN,
    SHUTDOWN_GRACE,
    Figures,
    Finding,
    Stop,
    Successor,
    Tag,
)
from symcc_mpi.wire.transport import RankFailure

log = logging.getLogger("symcc_mpi.federation")

CONFLICT_EXIT = 70  # F320 §2.5 step 6: the control plane contradicted itself after COMMIT
QUIESCENCE_WINDOW = 1.0  # seconds every master must stay idle before root proposes the end
STATUS_REFRESH = 0.5  # an unchanged status is sent again this often, so root sees it fresh
STATUS_STALE = 3.0  # root counts a status older than this as unknown
ANSWER_WITHIN = 120.0  # root waits this long for votes (then aborts) and ACKs (then Abort 70)
DISCOVERY_INTERVAL = 0.1  # seconds between two reads of the others' publication logs
MASTERS_POLL = 0.01  # seconds between two looks for the other masters' messages
RECOVERY_LIMIT = 16  # expired leases one scan takes over at most
AHEAD_SCAN = 256  # frontier inputs looked at for the next ones to claim


class Federation(Succession, Withdrawal, Closing):
    """One master's side of a campaign of several: admission, discovery, the end, the AFL face.

    `channel` is a transport.Channel over a communicator of every rank of the job, on which
    only masters talk: a master is addressed by its world rank (roster.py), and a worker
    that takes a dead master's place (job/federated.py) is reached on it at its own.
    The master loop calls `round` once per loop round; the dispatch coordinator calls `admit`,
    `begin_commit` and `complete` around each dispatch (dispatch/coordinator.py)."""

    def __init__(self, channel, *, index: int, masters: int, out: Path, epoch: bytes,
                 world_ranks: list[range], execution_timeout: float):
        self.channel = channel
        self.index = index
        self.masters = masters
        self.indices = tuple(range(masters))
        self.owner_of = owner_among(self.indices)  # a digest's lease shard
        self.working = self.indices  # the masters that have workers (withdrawal.py)
        self.withdrawn: set[int] = set()
        # Root: groups gone whole (withdrawal.py), each (till when it tries, when it was seen),
        # and the failure lines that wait for its next dispatch.
        self.reclaiming: dict[int, tuple[float, float]] = {}
        self.awaiting_dispatch: list[dict] = []
        # The first master's group died whole (succession.py): when, and whether this
        # master's group takes its place.
        self.root_gone_at: float | None = None
        self.heir = False
        self.work_owner_of = self.owner_of  # who analyses a digest: its owner among `working`
        self.next_withdrawal_check = 0.0
        self.world_ranks = world_ranks  # per master index, its group's ranks in COMM_WORLD
        self.roster = Roster(world_ranks)  # where each master is reached, which are gone
        self.directory = lease_directory(out, epoch)
        self.epoch = epoch
        self.owner_name = owner_name(epoch, index)
        self.execution_timeout = execution_timeout
        self.leases: WorkLeases | None = None  # once OUT is open (`open`)
        self.targets: TargetClaims | None = None  # F311's shared target groups, likewise
        self.publications: PublicationLog | None = None
        self.held: dict[str, str] = {}  # digest -> token of the lease this master holds
        # Inputs of this master's whose lease another master took over after it expired:
        # if that one gives it up (withdrawal.py), this one analyses them after all.
        self.lost_leases: set[str] = set()
        peers = [m for m in self.indices if m != index]
        self.hints = HintReader(self.directory, peers)
        self.maps = MapExchange(self.directory, index, peers)
        self.next_exchange = 0.0
        self.participant = Participant(refresh=STATUS_REFRESH)
        self.record = RootRecord(self.directory)
        self.decision_recorded = False
        self.inherited = False  # this root took a dead one's place (succession.py)
        self.next_farewell_check = 0.0
        self.coordinator = Coordinator(masters, window=QUIESCENCE_WINDOW,
                                       stale_after=STATUS_STALE,
                                       answer_within=ANSWER_WITHIN) if index == 0 else None
        self.active_since_status = False  # work admitted or committed since the last status
        self.next_discovery = 0.0
        self.next_poll = 0.0
        self.stop_reason = ""  # root's STOP, relayed to this master
        self.ending = ""  # root: why it stopped the campaign, when it did
        self.lost = False  # a rank of the job died (ULFM): the campaign ends unfinished
        self.departed: list[dict] = []  # root: the last figures of masters that were replaced
        self.conflict = ""
        self.figures: dict[int, dict] = {}  # root: each other master's latest snapshot
        self.final: set[int] = set()  # root: the masters whose final figures arrived
        self.findings = 0  # root: findings named for the others
        self.not_owned = 0  # inputs dropped from this master's queue: another master's
        self.stale_results = 0  # results whose lease another master had taken over
        self.clock: Clock = SYSTEM_CLOCK  # set by `open`
        # What a new root is handed again (`_new_root`): the dead one may have lost them.
        self.announcement: Successor | None = None  # this master's succession
        self.stop_sent: Stop | None = None
        self.last_figures: Figures | None = None

    def open(self, clock: Clock = SYSTEM_CLOCK) -> None:
        """The job's lease table and this master's publication log, in OUT: once the first
        master has checked and created OUT (nothing may be written there before). `clock`
        times the leases, the target claims and the wait for the final figures."""
        self.clock = clock
        config = LeaseConfig.from_env(execution_timeout=self.execution_timeout,
                                      shutdown_grace=SHUTDOWN_GRACE)
        for rejected in config.rejected:
            log.warning("ignored %s: not a valid value", rejected)
        if self.root:  # the campaign lock is root's: no other job uses OUT
            for stale in self.directory.parent.glob(LEASE_DIRECTORY_PREFIX + "*"):
                if stale != self.directory:  # of a job that ended without its last barrier
                    shutil.rmtree(stale, ignore_errors=True)
        # A shard per master, a digest in its owner's: a master writes to its own log.
        self.leases = WorkLeases(FencedWorkLeaseTable(
            self.directory / "leases", self.owner_name, shards=self.masters,
            shard_of=self.owner_of, clock=clock,
            **config.options()))
        self.targets = TargetClaims(self.directory / "targets", owner=self.owner_name,
                                    work_ttl=config.ttl, clock=clock)
        self.publications = PublicationLog(self.directory, self.index)

    @property
    def root(self) -> bool:
        return self.index == 0

    @property
    def done(self) -> bool:
        """Every master agreed the campaign is over (F320 §2.5)."""
        return self.participant.done and (self.coordinator is None
                                          or self.coordinator.outcome is Outcome.COMMITTED)

    def owns(self, digest: str) -> bool:
        return self.work_owner_of(digest) == self.index

    # -- admission (dispatch/coordinator.py) ------------------------------------------------

    def claim_ahead(self, pending: Iterable[str], count: int) -> None:
        """Hold the leases of the next `count` inputs of `pending` (the frontier, in order)
        this master owns: those not held yet are claimed in one write. Nothing is looked
        at if the first is held: the last fence claimed those to come (`fence`)."""
        pending = iter(pending)
        first = next(pending, None)
        if first is None or first in self.held:
            return
        if wanted := self._unheld(itertools.chain((first,), pending), count):
            self.held.update(self.leases.claim(wanted))

    def admit(self, digest: str) -> bool:
        """May this master dispatch `digest`: it holds the lease, or owns it and wins it."""
        if digest not in self.held:
            if not self.owns(digest):
                self.not_owned += 1
                return False
            self.held.update(self.leases.claim([digest]))
        if digest in self.held:
            self.active_since_status = True
            for failure in self.awaiting_dispatch:  # work goes out again after a reclaim
                failure["first_dispatch"] = self.clock.time()
            self.awaiting_dispatch.clear()
            return True
        return False

    def begin_commit(self, digest: str, pending: Iterable[str] = (), count: int = 0) -> bool:
        """The fence before any side effect of a result: False, the lease is no longer this
        master's (it expired and another master took it): the result is stale. The inputs
        to dispatch next are claimed in the same write (`claim_ahead`)."""
        if digest in self.fence([digest], pending, count):
            return True
        self.stale_results += 1  # its lease lost at a heartbeat already, or now
        self.lost_leases.add(digest)
        return False

    def fence(self, digests: Iterable[str], pending: Iterable[str] = (),
              count: int = 0) -> frozenset[str]:
        """`begin_commit` for the results of `digests` in hand, in one write with the claims
        of `claim_ahead(pending, count)`: the digests now committing under this master's
        lease."""
        tokens = {digest: self.held.pop(digest) for digest in digests if digest in self.held}
        wanted = self._unheld(pending, count, fencing=tokens)
        if not tokens and not wanted:
            return frozenset()
        try:
            committing, claimed = self.leases.fence(tokens, wanted)
        except BaseException:
            self.held.update(tokens)  # fenced or not, they are still this master's
            raise
        self.held.update(claimed)
        for digest in committing:
            self.held[digest] = tokens[digest]  # until `complete`
        return committing

    def _unheld(self, pending: Iterable[str], count: int, fencing=()) -> list[str]:
        """Of the next `count` inputs of `pending` this master owns or holds (looking at
        AHEAD_SCAN at most), those it does not hold yet."""
        wanted: list[str] = []
        mine = 0
        for digest in itertools.islice(pending, AHEAD_SCAN):
            if mine >= count:
                break
            if digest in self.held:
                mine += 1
            elif digest not in fencing and self.owns(digest):
                mine += 1
                wanted.append(digest)
        return wanted

    def mine(self, digest: str) -> bool:
        """Whether this master analyses `digest`: it holds its lease, or owns it."""
        return digest in self.held or self.owns(digest)

    def holds(self, digest: str) -> bool:
        """Whether this master still holds `digest`'s lease (a part of a split input commits
        under it; the input's last part moves it to `committing`, `begin_commit`)."""
        return digest in self.held

    def complete(self, digest: str) -> None:
        token = self.held.pop(digest, None)
        if token is not None:
            self.leases.complete(digest, token)
        self.active_since_status = True

    def abandon(self, digest: str) -> None:
        """Its corpus file is missing (F320 §2.3), or this master withdraws: give the lease
        up at once."""
        token = self.held.pop(digest, None)
        if token is not None:
            self.leases.abandon(digest, token)

    def published(self, digests: list[str]) -> None:
        """Children this master just promoted into corpus/: a hint for the others."""
        if digests:
            self.publications.append(digests)

    # -- the round --------------------------------------------------------------------------

    def round(self, own: OwnMaster, now: float) -> None:
        """Once per master loop round: messages from the other masters, heartbeats, discovery,
        this master's status and (root) the quiescence decisions."""
        if now >= self.next_poll:
            # A probe costs a master about as much as its own workers' probe: at most every
            # MASTERS_POLL, as nothing between masters needs an answer within milliseconds.
            self.next_poll = now + MASTERS_POLL
            try:
                while (incoming := self.channel.poll()) is not None:
                    self._on_message(own, incoming, now)
            except RankFailure:
                self._masters_died()
        if self.roster.awaiting:
            self._succession_overdue(now)
        if self.reclaiming:
            self.reclaim(own, now)
        self.check_farewells(now)
        self.check_withdrawals(own, now)
        self.heartbeat()
        self.targets.round(now)
        if self.at_work and not self.participant.frozen and now >= self.next_discovery:
            self.next_discovery = now + DISCOVERY_INTERVAL
            self.discover(own)
        if now >= self.next_exchange:
            self.next_exchange = now + EXCHANGE_INTERVAL
            self.maps.exchange(own.checkpoint)
        idle = own.exhausted() and not self.active_since_status
        self.active_since_status = False
        if (status := self.participant.status(idle, now)) is not None:
            self._send_control(0, status, own, now)
        if self.coordinator is not None:
            outbox = self.coordinator.tick(now)
            if self.coordinator.decided is not None and not self.decision_recorded:
                self.record.decide(self.coordinator.decided)  # before any COMMIT goes out
                self.decision_recorded = True
            for destination, message in outbox:
                self._send_control(destination, message, own, now)
            if self.coordinator.outcome is Outcome.CONFLICT:
                self.conflict = self.coordinator.conflict or "quiescence conflict"

    def heartbeat(self) -> None:
        """The leases held, extended (when due); one another master took over after it
        expired is this master's no more."""
        for digest in self.leases.heartbeat(self.held):
            self.held.pop(digest, None)
            self.lost_leases.add(digest)

    def discover(self, own: OwnMaster) -> int:
        """New work: the others' publications and the expired leases this master took over.
        Returns how many inputs became known."""
        found = 0
        for digest in self.hints.poll():
            found += own.frontier.add(digest)
        recovered = self.leases.recover_expired(limit=RECOVERY_LIMIT)
        return found + self._take_recovered(own.frontier, recovered, own.campaign.corpus)

    def rescan(self, own: OwnMaster) -> bool:
        """F320 §2.5 step 3, before a vote: everything published or expired is looked at once
        more, the whole corpus listed. True if the master is still idle."""
        self.check_withdrawals(own, self.clock.monotonic(), rescan=True)
        if not self.at_work:
            return not own.busy()
        for digest in self.hints.poll():
            own.frontier.add(digest)
        with os.scandir(own.campaign.corpus) as entries:  # misnamed files: root's to move
            for entry in entries:
                if SHA256_PATTERN.match(entry.name):
                    own.frontier.add(entry.name)
        self._take_recovered(own.frontier,
                             self.leases.recover_expired(limit=RECOVERY_LIMIT, rescan=True),
                             own.campaign.corpus)
        # Others' inputs in the frontier are no work of this master's (dropped at dispatch).
        owned = [d for d in own.frontier.pending if d in self.held or self.owns(d)]
        return not owned and not own.busy() and not self.active_since_status

    def _take_recovered(self, frontier, recovered: dict[str, str], corpus: Path) -> int:
        taken = 0
        for digest, token in recovered.items():
            self.held[digest] = token
            if not (corpus / digest).exists():  # nothing to run: not held for ever (F320 §2.3)
                log.warning("the expired lease of %s names no corpus file: abandoned",
                            digest[:12])
                self.abandon(digest)
                continue
            log.warning("took over the expired lease of %s", digest[:12])
            frontier.add(digest)
            frontier.requeue(digest)
            taken += 1
        return taken

    # -- the control plane ------------------------------------------------------------------

    def _send_control(self, destination: int, message, own: OwnMaster, now: float) -> None:
        if destination == self.index:  # root's own participant: no MPI message
            self._on_control(own, self.index, message, now)
        else:
            self._send(destination, Tag.QUIESCENCE, message)

    def _send(self, destination: int, tag: Tag, message) -> None:
        """To another master; one that died gets nothing (ULFM reports its death)."""
        if destination in self.roster.dead:
            return
        try:
            self.channel.send(self.roster.world_of[destination], tag, message)
        except RankFailure:
            self._masters_died()

    def _on_message(self, own: OwnMaster, incoming, now: float) -> None:
        source, tag = self.roster.index_of(incoming.source), incoming.tag
        if tag == Tag.SUCCESSOR and incoming.message is not None:
            self._take_successor(own, incoming.source, incoming.message)
        elif source is None:
            own.count_malformed()
            log.warning("a message from rank %d, which is no master", incoming.source)
        elif incoming.message is None:
            own.count_malformed()
            log.warning("malformed message from master %d: %s", source, incoming.error)
        elif tag == Tag.QUIESCENCE:
            self._on_control(own, source, incoming.message, now)
        elif tag == Tag.FINDING and self.root:
            self.name_finding(own.campaign, incoming.message)
        elif tag == Tag.FIGURES and self.root:
            self.figures[incoming.message.master] = incoming.message.snapshot
            if incoming.message.final:
                self.final.add(incoming.message.master)
        elif tag == Tag.FAREWELL and self.root:
            self.roster.farewells.add(source)
        elif tag == Tag.STOP and (self.root or source == 0):
            self.lost |= incoming.message.failure
            self.stop_reason = self.stop_reason or (
                incoming.message.reason if source == 0
                else f"master {source} stopped: {incoming.message.reason}")
        else:
            log.warning("unexpected %s from master %d", Tag(tag).name, source)

    def _on_control(self, own: OwnMaster, source: int, message, now: float) -> None:
        coordinator, participant = self.coordinator, self.participant
        reply = None
        if isinstance(message, Status) and coordinator is not None:
            coordinator.on_status(source, message, now)
        elif isinstance(message, Vote) and coordinator is not None:
            coordinator.on_vote(source, message)
        elif isinstance(message, Ack) and coordinator is not None:
            coordinator.on_ack(source, message)
        elif isinstance(message, Prepare):
            reply = participant.on_prepare(source, message, self.rescan(own))
        elif isinstance(message, Abort):
            participant.on_abort(source, message)
        elif isinstance(message, Commit):
            reply = participant.on_commit(source, message)
        else:
            log.warning("master %d: %s is not for master %d", source,
                        type(message).__name__, self.index)
        if reply is not None:
            self._send_control(0, reply, own, now)

    # -- root: the AFL face and the figures -------------------------------------------------

    def name_finding(self, campaign: CampaignDir, finding: Finding) -> None:
        if finding.kind == "queue":
            named = campaign.queue_finding(finding.digest, finding.parent)
        else:
            named = campaign.save_finding(finding.kind, finding.digest, finding.parent or None,
                                          finding.signal, data=finding.data or None)
        self.findings += named

    def forward(self, finding: Finding) -> None:
        """Hand a finding to root (CampaignDir.forward_finding, masters other than root). If
        root is dead, the next run's root names it: from corpus/, or from this master's
        state (a crash's or hang's bytes, kept there first)."""
        self._send(0, Tag.FINDING, finding)

    def stopping(self, reason: str, *, failure: bool = False) -> None:
        """This master stops before the campaign's end was agreed: root tells every other
        master why (a stop request, the budget: what only root watches); another master
        tells root, which stops everyone (a campaign missing a master cannot be exhausted).
        `failure`: because a rank died."""
        self.lost |= failure
        if self.root:
            self.ending = reason
            for destination in self.indices[1:]:
                self._send(destination, Tag.STOP, Stop(reason, self.lost))
        elif not self.stop_reason:  # not root's own STOP coming back
            self.stop_sent = Stop(reason, self.lost)
            self._send(0, Tag.STOP, self.stop_sent)

    def report(self, snapshot, final: bool) -> None:
        """A master other than root: its figures go to root, which writes the reports."""
        self.last_figures = Figures(self.index, plain(asdict(snapshot)), final)
        self._send(0, Tag.FIGURES, self.last_figures)

    def statistics(self) -> FederationStatistics:
        root = self.coordinator
        return FederationStatistics(
            leases=self.leases.statistics(), not_owned=self.not_owned,
            stale_results=self.stale_results,
            targets=self.targets.statistics() if self.targets else None,
            hints=self.hints.statistics(), maps=self.maps.statistics(),
            quiescence=self.participant.statistics(),
            quiescence_root=root.statistics() if root is not None else None,
            root_outcome=root.outcome.value if root is not None else None,
            findings_named=self.findings if root is not None else None)
