"""The master role: wires its parts, runs its loop and routes each message to the part whose
job it is. It owns the campaign directory, dispatches work, verifies and commits results.

One round: drain every pending message (READY, RESULT, FATAL, STOP_ACK), then the
`DispatchCoordinator`'s join, dispatch and deadline sweep (F317 §4.2), then the group commit
and the stop conditions, then the report. Every dispatch is a transaction (F313) whose send is
`sending.WorkSender`'s; a RESULT takes one pass through `results.ResultJudge`; the phases are
`stopping.Stopping`'s; ULFM generations `recovery.Recovery`'s.
"""

from __future__ import annotations

import logging
import signal

from symcc_mpi.campaign.checkpoint import Checkpointer
from symcc_mpi.campaign.commit import Committer
from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.stats import MasterStats, WorkerStats
from symcc_mpi.campaign.uploads import PackUploads
from symcc_mpi.config import CampaignConfig
from symcc_mpi.coverage.pruning import PruningLedger
from symcc_mpi.dispatch.coordinator import DispatchCoordinator
from symcc_mpi.dispatch.watchdog import WatchdogConfig
from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.federation.masters import CONFLICT_EXIT
from symcc_mpi.federation.own_master import OwnMaster
from symcc_mpi.federation.succession import FirstMastersPlace
from symcc_mpi.roles.faults import FaultKind, Faults, die
from symcc_mpi.roles.ranks import Ranks
from symcc_mpi.roles.records import DispatchNotRecorded, WorkRecords
from symcc_mpi.roles.recovery import Recovery
from symcc_mpi.roles.results import ResultJudge
from symcc_mpi.roles.sending import WorkSender
from symcc_mpi.roles.stopping import Phase, Stopping, StorageGuard
from symcc_mpi.roles.timing import TaskTimes
from symcc_mpi.scheduling.splitting import WorkSource
from symcc_mpi.wire.doorbell import Doorbell
from symcc_mpi.wire.protocol import (
    ConfigVerdict,
    Fatal,
    PackChunk,
    Ready,
    Release,
    Result,
    ResultField,
    StopAck,
    Tag,
)
from symcc_mpi.wire.transport import Channel, Naps, RankFailure

log = logging.getLogger("symcc_mpi.master")

REPORT_INTERVAL = 1.0
SWEEP_INTERVAL = 0.02
FAILURE_POLL = 0.1  # under ULFM: seconds between asking MPI for dead ranks (Get_failed)


class Master:
    def __init__(self, channel: Channel, config: CampaignConfig, campaign: CampaignDir,
                 *, triage=None, pruning: PruningLedger | None = None, reporter=None,
                 federation=None, importer=None, lower=None,
                 deferrals=None, watchdog: WatchdogConfig, fault_tolerant: bool = False,
                 world_rank: int = 0, doorbell: Doorbell | None = None):
        self.config = config
        self.campaign = campaign
        self.triage = triage  # triage.CoverageMap, or None: novelty by content hash alone
        self.reporter = reporter
        self.frontier = frontier = campaign.inputs
        if federation is not None:
            frontier.mine = federation.mine  # the others' inputs are known, not queued
        self.pruning = pruning
        self.federation = federation  # the other masters (federation/), if any
        self.importer = importer  # a hybrid campaign's afl_sync.Importer: the fuzzers' finds
        self.lower = lower  # tiers.lower.LowerTiers: the work past the interesting frontier
        self.fault_tolerant = fault_tolerant  # under ULFM (ulfm/)
        # With several masters under ULFM (federation/): a dead worker is retired from its
        # group, whose communicator is not repaired (recovery.retire_dead).
        self.outlives_ranks = False
        self.in_flight_at_takeover: list[str] = []  # set by open_master (job/assembly.py)
        self.withdrew_at: float | None = None  # when it withdrew from the work (monotonic)
        # The campaign's verdict, in the final stats.json: the launcher's exit status even
        # when mpiexec reports the ranks that died on the way (launch.py).
        self.exit_status: int | None = None
        self.ranks = ranks = Ranks(channel)
        self.stats = stats = MasterStats(
            per_worker={rank: WorkerStats() for rank in ranks.workers})
        pool = lower.pool if lower is not None else None
        shared = federation is not None
        self.split = WorkSource(
            frontier, split=config.split,
            # Late-bound: the federation opens its target claims after the master is made.
            shared_admission=(lambda work_id, targets, worker: federation.targets.claim(
                work_id, targets, worker)) if shared else None,
            on_release=(lambda work_id: federation.targets.release(work_id))
            if shared else None,
            mine=federation.mine if shared else None, lower=lower)
        # Around the master's own writes into OUT: a filesystem that refuses them stops the
        # campaign (the phase machine, made below with the dispatch it stops).
        self.guard = StorageGuard(lambda problem: self.stopping.for_resources(problem),
                                  config.out)
        self.records = WorkRecords(campaign, self.guard, enabled=fault_tolerant)
        self.dispatch = dispatch = DispatchCoordinator(
            frontier, watchdog=watchdog, deferrals=deferrals, load=self._load_input,
            pruning=pruning, on_requeue=self.records.requeue,
            fatal=(RankFailure, DispatchNotRecorded), admission=federation, source=self.split)
        dispatch.workers = len(ranks.workers)
        self.checkpoint = Checkpointer(campaign, pruning=pruning, triage=triage,
                                       importer=importer, pool=pool,
                                       snapshot_point=self._snapshot_point
                                       if federation is None else None)
        # A worker that took over keeps its own plan.
        self.faults = Faults(world_rank, master_index=federation.index if federation else 0)
        campaign.commit_probe = self.faults.commit_probe()
        self.committer = Committer(campaign, frontier, stats, triage=triage, pruning=pruning,
                                   checkpoint=self.checkpoint, shared_corpus=shared, pool=pool)
        self.stopping = Stopping(config, campaign, ranks, dispatch, stats, self.checkpoint,
                                 self.guard, federation=federation, importer=importer,
                                 report=self.report,
                                 withdraw=self._withdraw if shared else None)
        self.times = TaskTimes()
        self.sender = WorkSender(ranks, dispatch, self.records, self.faults, stats, self.times,
                                 frontier=frontier, lower=lower, report_now=self._report_now)
        self.uploads = PackUploads(str(campaign.staging))
        self.judge = ResultJudge(dispatch, self.committer, self.split, self.records,
                                 self.faults, stats, self.stopping, campaign=campaign,
                                 frontier=frontier, lower=lower, federation=federation,
                                 pruning=pruning, count_doorbells=self._count_doorbells,
                                 uploads=self.uploads)
        self.recovery = Recovery(ranks, dispatch, campaign, self.records, stats, self.stopping,
                                 self.sender, self.times, count_doorbells=self._count_doorbells,
                                 report_now=self._report_now)
        self.own = OwnMaster(
            frontier, campaign, count_malformed=self._count_malformed,
            exhausted=lambda: dispatch.exhausted,
            busy=lambda: bool(self.split.waiting or dispatch.in_flight),
            give_up_splits=self.split.give_up_splits,
            checkpoint=self.checkpoint)
        self.naps = Naps()
        self.doorbell = doorbell if doorbell is not None else Doorbell()
        self.wakeups = 0
        for note in watchdog.notes:
            log.warning("%s", note)
        log.info("dispatch watchdog: %s; %d protocol retries before an input is deferred",
                 f"{watchdog.seconds:g} s" if watchdog.enabled else "off",
                 watchdog.protocol_retries)

    # -- what the session and the reports read and set -----------------------------------

    @property
    def generation(self) -> int:
        """The generation of the communicator this master works on (ulfm/)."""
        return self.dispatch.generation

    @generation.setter
    def generation(self, number: int) -> None:
        self.dispatch.generation = number

    @property
    def members(self) -> tuple[str, ...]:
        return self.ranks.members

    @members.setter
    def members(self, members: tuple[str, ...]) -> None:
        self.ranks.members = members

    @property
    def channel(self) -> Channel:
        return self.ranks.channel

    @property
    def workers(self) -> list[int]:
        return self.ranks.workers

    @property
    def phase(self) -> Phase:
        return self.stopping.phase

    @property
    def storage_problem(self) -> str:
        return self.stopping.storage_problem

    @property
    def run_id(self) -> str:
        return self.stopping.run_id

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> int:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self.stopping.on_signal)
        marker = self.campaign.mark_staging()
        for rank in self.ranks.workers:
            self.channel.send(rank, Tag.CONFIG, ConfigVerdict(
                ok=True, doorbell=self.doorbell.address, generation=self.generation,
                master=self.federation.index if self.federation is not None else 0,
                staging_marker=marker))
        if self.phase is Phase.STOPPING:  # a generation that began while workers were stopping
            self.stopping.send_stops()
        self.next_report = self.next_sweep = 0.0
        self.rang = False
        self.times.loop_starts()
        while self.phase is not Phase.DONE:
            try:
                self._round()
            except RankFailure as failure:
                if not self.outlives_ranks:
                    raise  # the job repairs the communicator (ulfm/), or ends
                self.recovery.retire_dead(failure)
        with self.guard:
            self.checkpoint.after_round(final=True)
        if self.federation is not None and self.federation.root:
            self.federation.wait_for_final_figures(self.own)
        self.exit_status = self.stopping.exit_status()
        with self.guard:
            self.report(final=True)
        self.stopping.withdraw_request()
        return self.stopping.exit_status()

    def _round(self) -> None:
        """One round of the loop: messages, the join, dispatch, deadlines, reports, a nap."""
        handled = 0
        self.rang = self.doorbell.drain() or self.rang
        arrived, failure = [], None
        try:
            while (incoming := self.channel.poll()) is not None:
                if incoming.tag == Tag.PACK:  # written at once: a pack's pieces are not held
                    self._handle(incoming)
                    handled += 1
                else:
                    arrived.append(incoming)
        except RankFailure as error:  # raised once what came before it is handled
            failure = error
        if self.federation is not None and len(arrived) > 1:
            results = [(incoming.source, incoming.message.token) for incoming in arrived
                       if isinstance(incoming.message, Result)]
            if len(results) > 1:
                with self.guard:  # a lease write (F320)
                    self.dispatch.fence(results)
        for incoming in arrived:
            self._handle(incoming)
            handled += 1
        if failure is not None:
            raise failure
        # F317 round order: messages, then the join, then dispatch, then the deadlines.
        # A round that received nothing has nothing to join, and deadlines (seconds) are
        # swept every SWEEP_INTERVAL: an idle round then costs little more than a probe.
        now = SYSTEM_CLOCK.monotonic()
        ranks = self.ranks
        if (self.fault_tolerant or self.outlives_ranks) and now >= ranks.next_failure_check:
            # A dead worker with nothing pending is not reported by a probe (F443 §6.1).
            ranks.next_failure_check = now + FAILURE_POLL
            self.channel.check_peers(known=ranks.failed)
        if self.federation is not None:
            self._federation_round(now)
        if self.importer is not None and self.phase is Phase.RUNNING:
            with self.guard:
                if self.importer.round(now):
                    self.stats.last_find = SYSTEM_CLOCK.time()  # afl-fuzz counts imports as finds
                    handled += 1
        if handled:
            for recovery in self.dispatch.join().recoveries:
                self.times.sends.pop(recovery.token, None)
                self.campaign.discard_staging(recovery.token)  # its worker is done with it
        if self.phase is Phase.RUNNING and self.lower is not None and not self.split.waiting \
                and not self.dispatch.in_flight and self.lower.epoch_due():
            with self.guard:
                self._begin_epoch()
        if self.phase is Phase.RUNNING:
            self.times.dispatch_starts()
            with self.guard:  # the dispatch record (F443)
                handled += self.dispatch.dispatch(self.sender.send)
            if len(self.dispatch.retired) >= len(ranks.workers):  # sends kept failing
                self.stopping.if_no_worker_left("every worker retired")
        if handled or now >= self.next_sweep:
            self.next_sweep = now + SWEEP_INTERVAL
            for recovery in self.dispatch.sweep():
                self.times.sends.pop(recovery.token, None)  # its staging may still grow
            with self.guard:
                self.checkpoint.after_round()
            self.stopping.advance()
        if now >= self.next_report:
            with self.guard:
                self.report()
            self.next_report = now + REPORT_INTERVAL
        if nap := self.naps.after(active=handled > 0, rang=self.rang,
                                  sending=self.channel.sending):
            self.rang = self.doorbell.wait(nap)
            self.wakeups += 1
        else:
            self.rang = False

    def _federation_round(self, now: float) -> None:
        federation = self.federation
        if self.withdrew_at is not None and now >= self.withdrew_at + 2 * REPORT_INTERVAL \
                and self.faults.fire_at(FaultKind.DIE, "withdrawn", 1):
            die(f"fault: SIGKILL of master {federation.index}, which withdrew from the work")
        with self.guard:
            federation.round(self.own, now)
        if federation.heir and self.phase is Phase.RUNNING:  # not once it stops its workers
            raise FirstMastersPlace(federation.index)
        if federation.conflict:
            log.error("the masters disagree on the end of the campaign (%s); ending the job",
                      federation.conflict)
            for handler in logging.getLogger().handlers:
                handler.flush()
            self.channel.comm.Abort(CONFLICT_EXIT)  # MPI_Abort ends every rank of the job

    def _withdraw(self) -> bool:
        """No worker is left (Stopping.if_no_worker_left): withdraw from the work, if the
        other masters can take it (federation/withdrawal.py)."""
        federation = self.federation
        if not federation.at_work:
            return True
        with self.guard:  # its journal whole first: nobody redoes it once it has withdrawn
            self.checkpoint.after_round(final=True)
        if not federation.withdraw(self.own):
            return False
        self.campaign.unmark_staging()  # it has no worker left: else a death leaves it behind
        self.withdrew_at = SYSTEM_CLOCK.monotonic()
        return True

    def hand_over(self) -> None:
        """This master's group goes to the first master's place (FirstMastersPlace): what is
        in flight is taken back on record (its runs are cut short), and the master leaves the
        work as one that withdraws does, its journal durable first. Then `close`."""
        with self.guard:
            for _, transaction in list(self.dispatch.tables.transactions()):
                self.records.requeue(transaction.work_id,
                                     "its master took the first master's place")
            self.checkpoint.after_round(final=True)
        self.federation.leave_the_work(self.own)
        with self.guard:
            self.report(final=True)  # for its farewell on record

    # -- routing -------------------------------------------------------------------------

    def _handle(self, incoming) -> None:
        message = incoming.message
        rank = incoming.source
        if message is None:
            self._count_malformed()
            if incoming.tag == Tag.RESULT:
                self.judge.undecodable(rank, incoming.field or ResultField.UNDECODABLE,
                                       incoming.error)
                return
            log.warning("malformed message from rank %d (tag %s): %s", rank, incoming.tag,
                        incoming.error)
            if incoming.tag == Tag.READY:
                self.dispatch.ready(rank, None, malformed=True)
            elif incoming.tag == Tag.PACK and (found := self.dispatch.tables.find(rank)):
                self.uploads.refuse(rank, found[1].token, incoming.error)
            return
        if isinstance(message, Ready):
            if message.rings and rank not in self.ranks.ringing:
                self.ranks.ringing.add(rank)
                self._count_doorbells()
            self.dispatch.ready(rank, message.token)
        elif isinstance(message, Result):
            self._on_result(rank, message)
        elif isinstance(message, PackChunk):
            found = self.dispatch.tables.find(rank)
            with self.guard:  # a write into OUT
                self.uploads.receive(rank, message, found[1].token if found else None)
        elif isinstance(message, StopAck):
            self.ranks.acked.add(rank)
        elif isinstance(message, Fatal):
            self._on_fatal(rank, message)
        else:
            self._count_malformed()
            log.warning("rank %d sent %s, which a worker never sends", rank,
                        type(message).__name__)

    def _on_result(self, rank: int, result: Result) -> None:
        started = SYSTEM_CLOCK.monotonic()
        self.judge.handle(rank, result)
        if self.uploads.written(result.token):  # as its worker would, seeing OUT
            self.campaign.discard_staging(result.token)
        self.times.handled(result.token, started, self.naps)

    def _on_fatal(self, rank: int, fatal: Fatal) -> None:
        worker = self.stats.per_worker[rank]
        worker.host, worker.fatal = fatal.host, fatal.reason
        log.error("rank %d on %s cannot work: %s", rank, fatal.host, fatal.reason)
        self.dispatch.retire(rank, fatal.reason)
        self._count_doorbells()
        self.stopping.if_no_worker_left(fatal.reason)

    def _count_malformed(self) -> None:
        self.stats.malformed_messages += 1

    def _count_doorbells(self) -> None:
        self.naps.doorbell = self.ranks.all_ring(self.dispatch.retired)

    def _load_input(self, digest: str) -> bytes:
        if self.lower is not None and self.lower.holds(digest):
            return self.lower.read(digest)
        return self.campaign.read_input(digest)

    def _begin_epoch(self) -> None:
        """Tier 3 (tiers/schedule.py): nothing is in flight; every map starts empty, the
        saved ones first, then the epoch is on record, then the corpus waits to be analysed
        again."""
        epoch = self.lower.schedule.begin_epoch()
        if self.pruning is not None:
            self.pruning.begin_epoch()
            self.checkpoint.save_pruning()
        self.campaign.begin_epoch(epoch)
        self.dispatch.epoch = epoch
        again = self.frontier.begin_epoch()
        self.checkpoint.snapshot_due()  # a snapshot followed by an epoch record is not used
        log.info("epoch %d: the %d corpus inputs are analysed again under a fresh QSYM map "
                 "(tier 3)", epoch, again)

    # -- generations (ulfm/), called by the session --------------------------------------

    def begin_generation(self, channel: Channel, generation: int, members: tuple[str, ...],
                         repair, *, detected: float) -> None:
        self.recovery.begin_generation(channel, generation, members, repair, detected=detected)

    def note_recovery(self, generation: int, failed: list[str], requeued: list[str],
                      seconds: float, *, detected: float | None, shrinks: int = 1,
                      master: str = "kept") -> None:
        self.recovery.note(generation, failed, requeued, seconds, detected=detected,
                           shrinks=shrinks, master=master)

    # -- the end -------------------------------------------------------------------------

    def release_workers(self) -> None:
        """After `close`: the campaign is durable, the workers may go. A rank found dead now
        changes nothing (there is no campaign left to recover it into), and the others are
        released all the same: each waits for its RELEASE."""
        for rank in self.ranks.workers:
            if rank in self.ranks.failed:
                continue
            try:
                self.channel.send(rank, Tag.RELEASE, Release())
            except RankFailure as failure:
                log.warning("rank %d died after the campaign was closed (%s): not recovered",
                            rank, failure)

    def close(self) -> None:
        if self.faults.fire_at(FaultKind.DIE, "closing", 1):
            die("fault: SIGKILL of the master while it closes the campaign")
        if self.importer is not None and self.importer.probe is not None:
            self.importer.probe.close()
        if self.federation is not None and self.federation.targets is not None:
            self.federation.targets.release_all()
        with self.guard:
            if self.dispatch.deferrals is not None:
                self.dispatch.deferrals.close()
        if not self._journal_settled():
            self.campaign.snapshot_on_close = False
        with self.guard:
            self.campaign.close()
        self.doorbell.close()

    def _snapshot_point(self) -> list[str] | None:
        """The work in flight, recorded in a snapshot (snapshot.py) taken now; None while one
        may not be: a commit half done (OUT refused a write), a split input with parts to
        come. Without work records nobody reads it: the inputs are pending again anyway."""
        if self.storage_problem or self.split.open:
            return None
        if not self.records.enabled:
            return []
        return sorted(tx.work_id for _, tx in self.dispatch.tables.transactions())

    def _journal_settled(self) -> bool:
        """Whether no work is left unfinished on record: none in flight, no commit half done
        (OUT refused a write), no split input with parts to come. A resume from a snapshot
        reads none of the records before it, so only then may one be saved."""
        return not (self.storage_problem or self.dispatch.in_flight or self.split.open)

    # -- reporting -----------------------------------------------------------------------

    def report(self, final: bool = False) -> None:
        if self.reporter is not None:
            self.reporter(self, final)

    def _report_now(self) -> None:
        """Report a recovery at once, not at the next second: a master taking over carries
        the figures on from stats.json, and this one may die within that second."""
        with self.guard:
            self.report()
