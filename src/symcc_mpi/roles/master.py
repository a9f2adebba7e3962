"""The master loop: owns the campaign directory, dispatches work, verifies and commits results.

One round: drain every pending message (READY, RESULT, FATAL, STOP_ACK), then the
`DispatchCoordinator`'s join, dispatch and deadline sweep (F317 §4.2), then the group commit
and the stop conditions, then the report. Every dispatch is a transaction (F313); the
commit (`commit.Committer`) runs inside its exception boundary.
"""

from __future__ import annotations

import enum
import errno
import logging
import os
import secrets
import signal
import statistics
import sys
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from symcc_mpi.campaign.checkpoint import Checkpointer
from symcc_mpi.campaign.commit import Committer, Refused, Unusable, encode_manifest
from symcc_mpi.campaign.corpus import RUN_ID_ENV, CampaignDir, StopRequest
from symcc_mpi.config import CampaignConfig
from symcc_mpi.coverage.pruning import PruningLedger
from symcc_mpi.dispatch.coordinator import DispatchCoordinator
from symcc_mpi.dispatch.tables import CommitStart, ResultClass
from symcc_mpi.dispatch.watchdog import WatchdogConfig
from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.durable.storage import (
    STOP_ADVICE,
    STORAGE_EXIT,
    describe,
    storage_failing,
    storage_refused,
)
from symcc_mpi.executors import Outcome
from symcc_mpi.federation.masters import CONFLICT_EXIT, OwnMaster
from symcc_mpi.roles.faults import Faults, die, stop_self
from symcc_mpi.scheduling.splitting import TRACE, WorkSource, parse_work_id
from symcc_mpi.ulfm.runtime import describe_endpoint
from symcc_mpi.wire.doorbell import Doorbell
from symcc_mpi.wire.protocol import (
    INTERRUPTED,
    INVALID_INPUT,
    PHASES,
    SHUTDOWN_GRACE,
    STORAGE_REFUSED,
    ConfigVerdict,
    Fatal,
    Ready,
    Release,
    Result,
    ResultField,
    Stop,
    StopAck,
    Tag,
    Work,
)
from symcc_mpi.wire.transport import Channel, Naps, RankFailure

log = logging.getLogger("symcc_mpi.master")

REPORT_INTERVAL = 1.0
SWEEP_INTERVAL = 0.02
STOP_FILE_CHECK_INTERVAL = 0.25
ABORT_SILENT = 70  # MPI_Abort's status when workers stay silent past STOP (F317 W10)
FAILURE_POLL = 0.1  # under ULFM: seconds between asking MPI for dead ranks (Get_failed)


class DispatchNotRecorded(OSError):
    """OUT refused the record a dispatch needs before it leaves: the campaign stops (no
    worker is blamed for it, as for a send that failed)."""

    storage_refused = True

    def __init__(self, error: OSError):
        super().__init__(error.errno, error.strerror, error.filename)


class Phase(enum.Enum):
    RUNNING = "running"
    DRAINING = "draining"  # no new dispatch; waiting for the results in flight
    STOPPING = "stopping"  # STOP sent; waiting for every worker's STOP_ACK
    DONE = "done"


@dataclass
class WorkerStats:
    executions: int = 0
    executor_time: float = 0.0
    host: str = ""
    fatal: str = ""


@dataclass
class MasterStats:
    start_time: float = field(default_factory=SYSTEM_CLOCK.time)
    executions: int = 0
    generated: int = 0
    unique: int = 0
    interesting: int = 0
    crashes: int = 0
    hangs: int = 0
    crashing_runs: int = 0
    hanging_runs: int = 0
    first_crash_seconds: float | None = None  # campaign time to the first crash
    startup_seconds: float | None = None  # from the command (or this rank) to the first WORK
    executor_errors: int = 0
    # Per reason (commit.py): {"count": runs, "example": the first input's SHA-256}
    executor_failures: dict[str, dict] = field(default_factory=dict)
    executor_time: float = 0.0
    solver_time: float = 0.0
    solver_queries: int = 0
    queries_skipped: int = 0
    runs_without_counts: int = 0  # runs whose skipped queries are unknown
    malformed_messages: int = 0
    invalid_results: Counter[str] = field(default_factory=Counter)  # per ResultField value
    staging_rejected: int = 0
    last_find: float = 0.0
    last_crash: float = 0.0
    last_hang: float = 0.0
    resumed_done: int = 0
    max_depth: int = 1
    stop_reason: str = ""
    per_worker: dict[int, WorkerStats] = field(default_factory=dict)
    failures: list[dict] = field(default_factory=list)  # one per recovery (ulfm/)
    redone_commits: int = 0  # commits of a dead master finished from their manifests
    # Worker time per phase (protocol.TaskPhases), summed over the committed results.
    phases: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))


class Master:
    def __init__(self, channel: Channel, config: CampaignConfig, campaign: CampaignDir,
                 *, triage=None, pruning: PruningLedger | None = None, reporter=None,
                 federation=None, importer=None, lower=None,
                 deferrals=None, watchdog: WatchdogConfig, fault_tolerant: bool = False,
                 world_rank: int = 0, doorbell: Doorbell | None = None):
        self.channel = channel
        self.config = config
        self.campaign = campaign
        self.triage = triage  # triage.CoverageMap, or None: novelty by content hash alone
        self.reporter = reporter
        self.frontier = campaign.inputs
        self.pruning = pruning
        self.federation = federation  # the other masters (federation.py), if any
        self.importer = importer  # a hybrid campaign's afl_sync.Importer: the fuzzers' finds
        self.lower = lower  # tiers.lower.LowerTiers: the work past the interesting frontier
        pool = lower.pool if lower is not None else None
        self.split = WorkSource(
            self.frontier, split=config.split,
            shared_admission=self._claim_targets if federation is not None else None,
            on_release=self._release_targets if federation is not None else None,
            mine=federation.mine if federation is not None else None, lower=lower)
        self.dispatch = DispatchCoordinator(self.frontier, watchdog=watchdog,
                                            deferrals=deferrals, load=self._load_input,
                                            pruning=pruning, on_requeue=self._note_requeue,
                                            fatal=(RankFailure, DispatchNotRecorded),
                                            admission=federation,
                                            source=self.split)
        self.checkpoint = Checkpointer(campaign, pruning=pruning, triage=triage,
                                       importer=importer, pool=pool)
        # A worker that took over keeps its own plan.
        self.faults = Faults(world_rank, master_index=federation.index if federation else 0)
        campaign.commit_probe = self.faults.commit_probe()
        self.work_sends = 0
        self.sends_since_recovery: int | None = None  # counted from the first (faults)
        self.commits_seen: Counter[str] = Counter()  # per point of the commit (faults)
        self.object_sends = 0
        self.stats = MasterStats()
        # Under ULFM (ulfm/): the generation of `channel`'s communicator, the endpoint of each
        # of its ranks, and the work records of F443's WAL in the done journal (corpus.py).
        self.fault_tolerant = fault_tolerant
        self.members: tuple[str, ...] = ()
        self.next_failure_check = 0.0
        # With several masters under ULFM (federation.py): a dead worker ends this master's
        # part cleanly (the rest drained and committed) instead of a repair of its group.
        self.outlives_ranks = False
        self.failed_ranks: set[int] = set()
        self.in_flight_at_takeover: list[str] = []  # set by open_master (session.py)
        # The campaign's verdict, in the final stats.json: the launcher's exit status even
        # when mpiexec reports the ranks that died on the way (launch.py).
        self.exit_status: int | None = None
        # Called before the master ends the job with MPI_Abort: under ULFM the survivors
        # would otherwise take the campaign over (session.py leaves the end on record).
        self.before_abort: Callable[[int, str], object] | None = None
        self.own = OwnMaster(
            self.frontier, campaign, count_malformed=self._count_malformed,
            exhausted=lambda: self.dispatch.exhausted,
            busy=lambda: bool(self.split.waiting or self.dispatch.in_flight))
        self.committer = Committer(campaign, self.frontier, self.stats, triage=triage,
                                   pruning=pruning, checkpoint=self.checkpoint,
                                   shared_corpus=federation is not None, pool=pool)
        self.phase = Phase.RUNNING
        self.stop_requested_by_signal = False
        self.storage_problem = ""  # set once OUT refused a write: the campaign is stopping
        self._storage_guard = _StorageGuard(self)
        # A stop request counts only for the run it was made for (corpus.stop_request_verdict).
        self.run_id = os.environ.get(RUN_ID_ENV) or secrets.token_hex(8)
        self.run_started = _command_time()
        # The campaign's clock for --wall-timeout: from the run's first master on, across
        # generations and masters (F443 §4 step 8); open_master sets it from the log.
        self.budget_start = SYSTEM_CLOCK.time()
        self.drain_deadline = 0.0
        self.next_stop_file_check = 0.0
        self.ack_deadline = 0.0
        self.acked: set[int] = set()
        self.workers = list(range(1, channel.size))
        self.dispatch.workers = len(self.workers)
        # Per token in flight: when its WORK went out, and the master time that took.
        self.sends: dict[str, tuple[float, float]] = {}
        # Per rank, the token of the last WORK sent: a worker removes a dispatch's staging
        # when it asks for the next, so a dead one may leave that one behind.
        self.last_work: dict[int, str] = {}
        self.naps = Naps()
        self.doorbell = doorbell if doorbell is not None else Doorbell()
        self.ringing: set[int] = set()  # workers that ring it after each send
        self.wakeups = 0
        # Master time spent on each task (hand-off + handling its RESULT), for benchmarks.
        self.dispatch_mark = 0.0
        self.task_seconds: deque[float] = deque(maxlen=100_000)
        self.loop_cpu_start = 0.0
        self.loop_started = SYSTEM_CLOCK.monotonic()
        for rank in self.workers:
            self.stats.per_worker[rank] = WorkerStats()
        for note in watchdog.notes:
            log.warning("%s", note)
        log.info("dispatch watchdog: %s; %d protocol retries before an input is deferred",
                 f"{watchdog.seconds:g} s" if watchdog.enabled else "off",
                 watchdog.protocol_retries)

    @property
    def generation(self) -> int:
        """The generation of the communicator this master works on (ulfm/)."""
        return self.dispatch.generation

    @generation.setter
    def generation(self, number: int) -> None:
        self.dispatch.generation = number

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> int:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._on_signal)
        for rank in self.workers:
            self.channel.send(rank, Tag.CONFIG, ConfigVerdict(
                ok=True, doorbell=self.doorbell.address, generation=self.generation))
        if self.phase is Phase.STOPPING:  # a generation that began while workers were stopping
            self._send_stops()
        self.next_report = self.next_sweep = 0.0
        self.rang = False
        if not self.loop_cpu_start:  # the figures span every generation this master serves
            self.loop_cpu_start = time.process_time()
            self.loop_started = SYSTEM_CLOCK.monotonic()
        while self.phase is not Phase.DONE:
            try:
                self._round()
            except RankFailure as failure:
                if not self.outlives_ranks:
                    raise  # the job repairs the communicator (ulfm/), or ends
                self._stop_after_failure(failure)
        with self._stopping_if_storage_refuses():
            self.checkpoint.after_round(final=True)
        if self.federation is not None and self.federation.root:
            self.federation.wait_for_final_figures(self.own)
        self.exit_status = self._exit_status()
        with self._stopping_if_storage_refuses():
            self.report(final=True)
        return self._exit_status()

    def _round(self) -> None:
        """One round of the loop: messages, the join, dispatch, deadlines, reports, a nap."""
        handled = 0
        while (incoming := self.channel.poll()) is not None:
            self._handle(incoming)
            handled += 1
        # F317 round order: messages, then the join, then dispatch, then the deadlines.
        # A round that received nothing has nothing to join, and deadlines (seconds) are
        # swept every SWEEP_INTERVAL: an idle round then costs little more than a probe.
        now = SYSTEM_CLOCK.monotonic()
        if (self.fault_tolerant or self.outlives_ranks) and now >= self.next_failure_check:
            # A dead worker with nothing pending is not reported by a probe (F443 §6.1).
            self.next_failure_check = now + FAILURE_POLL
            self.channel.check_peers(known=self.failed_ranks)
        if self.federation is not None:
            self._federation_round(now)
        if self.importer is not None and self.phase is Phase.RUNNING:
            with self._stopping_if_storage_refuses():
                if self.importer.round(now):
                    self.stats.last_find = SYSTEM_CLOCK.time()  # afl-fuzz counts imports as finds
                    handled += 1
        if handled:
            for recovery in self.dispatch.join().recoveries:
                self.sends.pop(recovery.token, None)
                self._discard_staging(recovery.token)  # its worker is done with it
        if self.phase is Phase.RUNNING and self.lower is not None and not self.split.waiting \
                and not self.dispatch.in_flight and self.lower.epoch_due():
            with self._stopping_if_storage_refuses():
                self._begin_epoch()
        if self.phase is Phase.RUNNING:
            self.dispatch_mark = SYSTEM_CLOCK.monotonic()
            with self._stopping_if_storage_refuses():  # the dispatch record (F443)
                handled += self.dispatch.dispatch(self._send_work)
            if len(self.dispatch.retired) >= len(self.workers):  # sends kept failing
                self._stop_if_no_worker_left("every worker retired")
        if handled or now >= self.next_sweep:
            self.next_sweep = now + SWEEP_INTERVAL
            for recovery in self.dispatch.sweep():
                self.sends.pop(recovery.token, None)  # its staging may still grow
            with self._stopping_if_storage_refuses():
                self.checkpoint.after_round()
            self._advance_phase()
        if now >= self.next_report:
            with self._stopping_if_storage_refuses():
                self.report()
            self.next_report = now + REPORT_INTERVAL
        if nap := self.naps.after(active=handled > 0, rang=self.rang):
            self.rang = self.doorbell.wait(nap)
            self.wakeups += 1
        else:
            self.rang = False

    def _stop_after_failure(self, failure: RankFailure) -> None:
        """Ranks of this master's group died (ULFM reported it): their work goes back to the
        frontier, nothing more is sent to them, and the campaign stops with what the others
        commit; `--resume` continues it."""
        dead = self.channel.failed_ranks() - self.failed_ranks
        if not dead:
            raise failure  # not a dead peer (a revoked communicator): nothing to go on with
        self.failed_ranks |= dead
        for rank in sorted(dead):
            log.error("rank %d died (%s)", rank, failure)
            for token in self.dispatch.retire(rank, "it died"):
                self._discard_staging(token)
            if rank in self.last_work:
                self._discard_staging(self.last_work.pop(rank))
            self.acked.add(rank)  # no STOP_ACK will come
        if self.phase is Phase.RUNNING:
            self._begin_stop(f"a worker died (rank{'s' if len(dead) > 1 else ''} "
                             f"{', '.join(map(str, sorted(dead)))}): continue with --resume")
        elif self.phase is Phase.STOPPING:
            self._send_stops()  # those the failure interrupted; a second STOP is ignored

    def _federation_round(self, now: float) -> None:
        federation = self.federation
        with self._stopping_if_storage_refuses():
            federation.round(self.own, now)
        if federation.conflict:
            log.error("the masters disagree on the end of the campaign (%s); ending the job",
                      federation.conflict)
            for handler in logging.getLogger().handlers:
                handler.flush()
            self.channel.comm.Abort(CONFLICT_EXIT)  # MPI_Abort ends every rank of the job

    def _count_malformed(self) -> None:
        self.stats.malformed_messages += 1

    def _exit_status(self) -> int:
        if self.storage_problem:
            return STORAGE_EXIT
        lost = self.failed_ranks or (self.federation is not None and self.federation.lost)
        return 1 if lost or self.stats.stop_reason.startswith("no usable worker") else 0

    def _handle(self, incoming) -> None:
        message = incoming.message
        rank = incoming.source
        if message is None:
            self.stats.malformed_messages += 1
            if incoming.tag == Tag.RESULT:
                # Its token is unknown: the READY the worker sends next (echoing it) is joined
                # with the dispatch, which is then recovered (F316).
                self._refuse(rank, None, incoming.field or ResultField.UNDECODABLE,
                             incoming.error)
                return
            log.warning("malformed message from rank %d (tag %s): %s", rank, incoming.tag,
                        incoming.error)
            if incoming.tag == Tag.READY:
                self.dispatch.ready(rank, None, malformed=True)
            return
        if isinstance(message, Ready):
            if message.rings and rank not in self.ringing:
                self.ringing.add(rank)
                self._count_doorbells()
            self.dispatch.ready(rank, message.token)
        elif isinstance(message, Result):
            self._on_result(rank, message)
        elif isinstance(message, StopAck):
            self.acked.add(rank)
        elif isinstance(message, Fatal):
            self._on_fatal(rank, message)
        else:
            self.stats.malformed_messages += 1
            log.warning("rank %d sent %s, which a worker never sends", rank,
                        type(message).__name__)

    def _note_requeue(self, work: str, why: str) -> None:
        if self.fault_tolerant:  # every dispatch after an input's first is declared
            digest, part = parse_work_id(work)
            with self._stopping_if_storage_refuses():
                self.campaign.record_work("requeue", sha256=digest, reason=why,
                                          **({} if part is None else {"part": part}))

    def _claim_targets(self, work_id: str, targets: tuple[int, ...], worker: int) -> bool:
        return self.federation.targets.claim(work_id, targets, worker)

    def _release_targets(self, work_id: str) -> None:
        self.federation.targets.release(work_id)

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
        log.info("epoch %d: the %d corpus inputs are analysed again under a fresh QSYM map "
                 "(tier 3)", epoch, again)

    def _send_work(self, rank: int, work: Work) -> None:
        self.work_sends += 1
        self.object_sends += bool(work.objects)
        if self.faults.fire("send-fail", self.work_sends) or (
                work.objects and self.faults.fire("object-send-fail", self.object_sends)):
            raise OSError(f"injected failure of WORK send #{self.work_sends} to rank {rank}")
        if self.fault_tolerant:  # F443 §3 step 3: the dispatch is on record before it leaves
            part = parse_work_id(self.dispatch.work_of(rank, preparing=True))[1]
            try:
                self.campaign.record_work("dispatch", sha256=work.input_hash,
                                          token=work.token, generation=self.generation,
                                          rank=rank, **({} if part is None else {"part": part}))
            except OSError as error:
                if storage_failing(error):
                    raise DispatchNotRecorded(error) from error  # not the worker's failure
                raise
        try:
            self.channel.send(rank, Tag.WORK, work)
            if self.faults.fire("die", self.work_sends):
                die(f"fault: SIGKILL of the master after WORK send #{self.work_sends}")
            if self.sends_since_recovery is not None:
                self.sends_since_recovery += 1
                if self.faults.fire_at("die", "after-recovery", self.sends_since_recovery):
                    die("fault: SIGKILL of the master after WORK send "
                        f"#{self.sends_since_recovery} since its first recovery")
            if self.faults.fire("pause", self.work_sends):
                log.warning("fault: SIGSTOP of the master after WORK send #%d", self.work_sends)
                stop_self(time.monotonic() + self.faults.stop_seconds(self.work_sends, "pause"))
            if self.faults.fire("send-ambiguous", self.work_sends):
                raise OSError(f"injected: WORK send #{self.work_sends} to rank {rank} "
                              "delivered, then reported failure")
        except BaseException:
            # Undone as unsent (dispatch/coordinator.py): the input goes out again, and the
            # journal says why before its next dispatch record.
            self._note_requeue(work.input_hash, "its send failed")
            raise
        if self.lower is not None:
            self.lower.schedule.dispatched(self.frontier.tier_of(work.input_hash))
        if self.stats.startup_seconds is None:
            self.stats.startup_seconds = SYSTEM_CLOCK.time() - _command_time()
        if self.stats.failures and self.stats.failures[-1]["first_dispatch"] is None:
            self.stats.failures[-1]["first_dispatch"] = SYSTEM_CLOCK.time()
            self._report_now()
        # A dispatch's master time runs from the previous send (or the round's first) to its
        # own: reading the input, the transaction, the send.
        now = SYSTEM_CLOCK.monotonic()
        self.sends[work.token] = (now, now - self.dispatch_mark)
        self.last_work[rank] = work.token
        self.dispatch_mark = now

    def _on_result(self, rank: int, result: Result) -> None:
        started = SYSTEM_CLOCK.monotonic()
        self._judge_and_commit(rank, result)
        sent = self.sends.pop(result.token, None)
        if sent is not None:
            sent_at, sending = sent
            self.naps.observe_round_trip(started - sent_at)
            self.task_seconds.append(sending + SYSTEM_CLOCK.monotonic() - started)

    def task_time_summary(self) -> dict:
        samples = list(self.task_seconds)
        if not samples:
            return {"tasks": 0}
        samples.sort()
        return {"tasks": len(samples), "median_ms": statistics.median(samples) * 1e3,
                "p90_ms": samples[int(len(samples) * 0.9)] * 1e3,
                "mean_ms": statistics.fmean(samples) * 1e3}

    def _judge_and_commit(self, rank: int, result: Result) -> None:
        if self.dispatch.classify(rank, result.token) is ResultClass.STALE:
            log.warning("stale or foreign RESULT from rank %d dropped (token %s)", rank,
                        result.token[:12])
            if not self.dispatch.holds_token(result.token):
                self._discard_staging(result.token)  # never another rank's live staging
            return
        if result.generation != self.generation:
            self._refuse(rank, result.token, ResultField.GENERATION,
                         f"generation {result.generation} in generation {self.generation}")
            return
        if result.outcome in (STORAGE_REFUSED, INTERRUPTED) or self.storage_problem:
            # Not the input's fault: it goes back to the frontier with no failure counted, and
            # nothing more is committed once OUT refused a write.
            self.dispatch.give_back(rank)
            if result.outcome == STORAGE_REFUSED:
                self._stop_for_resources(f"rank {rank}: {result.message[:500]}")
            return
        work = self.dispatch.work_of(rank)
        digest, part = parse_work_id(work) if work is not None else (None, None)
        try:
            accepted = self.committer.check(result, digest)
        except Refused as refused:
            self._refuse(rank, result.token, refused.field, str(refused))
            return
        except Unusable as problem:
            self.dispatch.note_valid_result(rank)
            log.warning("rank %d did not analyse %s: %s", rank, result.input_hash[:12], problem)
            if result.outcome == INVALID_INPUT and self.pruning is not None:
                self.pruning.forget(rank)  # it may have refused the map bits we sent
            self.dispatch.reject(rank, result.token)
            return  # the worker removes its staging (worker.py), here as after a commit
        self.dispatch.note_valid_result(rank)
        if part == TRACE and result.outcome == Outcome.OK.value \
                and result.path_targets is None and self.split.split:
            log.warning("the workers' executor reports no branch targets: inputs are no "
                        "longer split")
            self.split.split = False
        completes = self.split.completes_input(work, result.path_targets)
        with self._stopping_if_storage_refuses(), self.dispatch.boundary(rank):
            if self.dispatch.begin_commit(rank, result.token, completes_input=completes) \
                    is CommitStart.COMMITTING:
                try:
                    if self.fault_tolerant:  # F443 §3 step 6: the manifest, then publication
                        self.campaign.record_work(
                            "commit", sha256=result.input_hash, token=result.token,
                            generation=self.generation, rank=rank,
                            **encode_manifest(result, accepted),
                            **({} if part is None else {"part": part}))
                        self._fault_in_commit("after-manifest")
                    tier = self.frontier.tier_of(result.input_hash)
                    found = self.committer.commit(rank, result, accepted, part=part,
                                                  completes_input=completes)
                    if self.lower is not None:
                        self.lower.schedule.committed(tier, finds=found.finds,
                                                      edges=found.edges,
                                                      seconds=result.wall_time)
                except OSError as error:
                    if storage_refused(error):
                        raise  # not this input's fault: the campaign stops (storage.py)
                    self._on_commit_failure(rank, result, error)
                    return
                self.dispatch.finish(rank, result.token, path_targets=result.path_targets,
                                     solved_targets=result.solved_targets,
                                     completes_input=completes)
                if self.federation is not None:
                    self.federation.published(self.committer.published)
                if self.fault_tolerant:
                    self._fault_in_commit("after-publish")

    def _fault_in_commit(self, point: str) -> None:
        self.commits_seen[point] += 1
        if self.faults.fire_at("die", point, self.commits_seen[point]):
            die(f"fault: SIGKILL of the master {point} of commit #{self.commits_seen[point]}")

    def _on_commit_failure(self, rank: int, result: Result, error: OSError) -> None:
        """Publishing a result's children raised: its input is retried (deferred after
        repeated failures), never forgotten, and the loop goes on. `error.errno` says why."""
        outcome = self.dispatch.commit_failed(rank, result.token)
        log.warning("committing the result of %s from rank %d failed (%s): input %s",
                    result.input_hash[:12], rank,
                    errno.errorcode.get(error.errno, "no errno") + f": {error.strerror or error}",
                    outcome.action.value if outcome is not None else "already recovered")

    def _refuse(self, rank: int, token: str | None, field: ResultField, reason: str) -> None:
        """An invalid RESULT (DESIGN §2): counted under its field; its dispatch is recovered at
        the join (input requeued, staging discarded); the rank retired after too many."""
        self.stats.invalid_results[field.value] += 1
        log.warning("invalid RESULT from rank %d refused, field %s: %s", rank, field.value,
                    reason)
        if token is not None:
            self.dispatch.reject(rank, token)
        for taken_back in self.dispatch.note_invalid_result(rank, f"{field.value}: {reason}"):
            self._discard_staging(taken_back)  # no join will recover it: its rank is retired
        self._count_doorbells()
        self._stop_if_no_worker_left(f"every worker retired, last rank {rank}: {reason}")

    def _stop_if_no_worker_left(self, reason: str) -> None:
        if self.phase is Phase.RUNNING and self.dispatch.retired.issuperset(self.workers):
            self._begin_stop(f"no usable worker: {reason}")

    def _discard_staging(self, token: str) -> None:
        self.campaign.discard_staging(token)

    def _on_fatal(self, rank: int, fatal: Fatal) -> None:
        worker = self.stats.per_worker[rank]
        worker.host, worker.fatal = fatal.host, fatal.reason
        log.error("rank %d on %s cannot work: %s", rank, fatal.host, fatal.reason)
        self.dispatch.retire(rank, fatal.reason)
        self._count_doorbells()
        self._stop_if_no_worker_left(fatal.reason)

    # -- stopping ------------------------------------------------------------------------

    def _count_doorbells(self) -> None:
        self.naps.doorbell = all(rank in self.ringing or rank in self.dispatch.retired
                                 for rank in self.workers)

    def _on_signal(self, signum, frame) -> None:
        self.stop_requested_by_signal = True

    def _advance_phase(self) -> None:
        now = SYSTEM_CLOCK.monotonic()
        if self.phase is Phase.RUNNING:
            reason = self._stop_reason(now)
            if reason:
                self._begin_stop(reason)
        if self.phase is Phase.DRAINING:
            in_flight = self.dispatch.in_flight
            if not in_flight or now >= self.drain_deadline:
                if in_flight:
                    log.warning("%d results still in flight at shutdown; their inputs stay "
                                "in the frontier for --resume", in_flight)
                self.dispatch.shutdown()
                self.phase = Phase.STOPPING
                self._send_stops()
        if self.phase is Phase.STOPPING:
            if self.acked.issuperset(self.workers):
                self.phase = Phase.DONE
            elif now >= self.ack_deadline:
                missing = sorted(set(self.workers) - self.acked)
                parked = self.dispatch.gate.parked()
                # Whatever is staged now would be refused: the work in flight was taken back,
                # and the ranks that acknowledged STOP removed their own staging.
                self.campaign.clear_staging()
                log.error("workers %s did not acknowledge STOP within %.0f s%s; ending the "
                          "job, what was committed is kept", missing, SHUTDOWN_GRACE,
                          " (parked: silent since the watchdog took back their work)"
                          if parked.keys() & set(missing) else "")
                with self._stopping_if_storage_refuses():
                    self.checkpoint.after_round(final=True)
                with self._stopping_if_storage_refuses():
                    self.report(final=True)
                if self.before_abort is not None:
                    self.before_abort(ABORT_SILENT, "workers did not acknowledge STOP")
                self.channel.comm.Abort(ABORT_SILENT)

    def _send_stops(self) -> None:
        for rank in self.workers:
            if rank not in self.failed_ranks and rank not in self.acked:
                self.channel.send(rank, Tag.STOP, Stop(self.stats.stop_reason))
        self.ack_deadline = SYSTEM_CLOCK.monotonic() + SHUTDOWN_GRACE

    # -- generations (ulfm/) -------------------------------------------------------------

    def begin_generation(self, channel: Channel, generation: int, members: tuple[str, ...],
                         repair, *, detected: float) -> None:
        """Go on with the repaired communicator `channel` (`repair`: ulfm.runtime.Repair):
        every dispatch of the old one is taken back (the failed ranks' first), their staging
        discarded, the ranks renumbered by their endpoints."""
        old_rank = {endpoint: rank for rank, endpoint in enumerate(self.members)}
        failed = {old_rank[e] for e in repair.failed if e in old_rank}
        renumbered = {rank: old_rank.get(endpoint) for rank, endpoint in enumerate(members)}
        retired = {new for new, old in renumbered.items() if old in self.dispatch.retired}
        gone = [describe_endpoint(endpoint, self.members, self.generation)
                for endpoint in repair.failed]
        requeued = self.dispatch.begin_generation(generation, failed, retired - {0})
        self.campaign.clear_staging()  # nobody writes it any more
        per_worker = self.stats.per_worker
        self.stats.per_worker = {new: per_worker.get(old, WorkerStats())
                                 for new, old in renumbered.items() if new != 0}
        self.channel.abandon_sends()
        self.channel = channel
        self.members = members
        self.workers = list(range(1, channel.size))
        self.dispatch.workers = len(self.workers)
        self.acked.clear()
        self.ringing.clear()
        self.sends.clear()
        self.next_failure_check = 0.0
        self._count_doorbells()
        self.note_recovery(generation, gone, requeued, repair.seconds, detected=detected,
                           shrinks=repair.shrinks)
        if not self.workers:
            self._begin_stop("no usable worker: every worker rank died")

    def note_recovery(self, generation: int, failed: list[str], requeued: list[str],
                      seconds: float, *, detected: float | None, shrinks: int = 1,
                      master: str = "kept") -> None:
        """Record a recovery in the journal and the figures, and say it in one line."""
        with self._stopping_if_storage_refuses():
            self.campaign.record_work("recovered", generation=generation, failed=failed,
                                      requeued=requeued, master=master,
                                      seconds=round(seconds, 3))
        self.stats.failures.append({
            "generation": generation, "failed": failed, "requeued": len(requeued),
            "master": master, "shrinks": shrinks, "recovery_seconds": round(seconds, 3),
            "detected": detected, "first_dispatch": None})
        if self.sends_since_recovery is None:
            self.sends_since_recovery = 0
        self._report_now()
        log.warning("generation %d: %s gone, %d inputs in flight requeued, master %s, "
                    "recovered in %.2f s", generation, ", ".join(failed) or "no rank",
                    len(requeued), master, seconds)

    def _stop_reason(self, now: float) -> str:
        if self.stop_requested_by_signal:
            return "interrupted"
        federation = self.federation
        if federation is not None:
            # The frontier is exhausted when every master agrees (quiescence.py); the other
            # reasons root alone sees and relays (a stop request is removed once read).
            if federation.stop_reason:
                return federation.stop_reason
            if federation.done:
                return "frontier exhausted"
            if not federation.root:
                return ""
        if now >= self.next_stop_file_check:  # a stat per round would cost the master ~3% CPU
            self.next_stop_file_check = now + STOP_FILE_CHECK_INTERVAL
            if self._stop_requested():
                return "stop requested"
        if self.dispatch.exhausted and federation is None and self.importer is None:
            return "frontier exhausted"  # a hybrid campaign waits for the fuzzers"
        elapsed = SYSTEM_CLOCK.time() - self.budget_start
        if self.config.wall_timeout is not None and elapsed >= self.config.wall_timeout:
            return "wall-clock budget spent"
        if self.config.max_idle is not None:
            last = max(self.stats.last_find, self.stats.start_time,
                       *(f.get("last_find") or 0 for f in self.federation.figures.values())
                       if self.federation is not None else ())
            if SYSTEM_CLOCK.time() - last >= self.config.max_idle:
                return f"no new finding for {self.config.max_idle:g} s"
        return ""

    def _stop_requested(self) -> bool:
        verdict = StopRequest.NONE
        with self._stopping_if_storage_refuses():
            verdict = self.campaign.take_stop_request(self.run_id, self.run_started)
        if verdict is StopRequest.STALE:
            log.warning("removed %s: a stop request left by an earlier run, not this one",
                        self.campaign.stop_request)
        return verdict is StopRequest.THIS_RUN

    def _begin_stop(self, reason: str) -> None:
        log.info("stopping: %s", reason)
        if self.federation is not None and not self.federation.done:
            self.federation.stopping(reason, failure=bool(self.failed_ranks))  # all stop
        self._drain(reason)

    def _drain(self, reason: str) -> None:
        self.stats.stop_reason = reason
        self.phase = Phase.DRAINING
        self.drain_deadline = SYSTEM_CLOCK.monotonic() + self.config.timeout + SHUTDOWN_GRACE

    def _stopping_if_storage_refuses(self) -> _StorageGuard:
        """Around the master's own writes into OUT (commit, journals, checkpoints, reports):
        a full, over-quota or read-only filesystem stops the campaign, as does an I/O error
        no commit handled (the device is failing: a group commit's fsync, a lease); anything
        else raises."""
        return self._storage_guard

    def _stop_for_resources(self, problem: str) -> None:
        """OUT refuses writes: say so once, dispatch nothing more, give back every result
        still coming (no input is requeued against its retries or deferred for it) and end
        with what was committed intact. Later failures are the same fault: not said again."""
        if self.storage_problem:
            return
        self.storage_problem = problem
        log.error("%s: %s", problem, STOP_ADVICE)
        if self.phase is not Phase.RUNNING:  # not what it stopped for, but what it ended with
            self.stats.stop_reason = problem
            return
        if self.federation is not None and not self.federation.done:
            self.federation.stopping(problem)  # the others cannot go on without it
        self._drain(problem)

    def release_workers(self) -> None:
        """After `close`: the campaign is durable, the workers may go. A rank found dead now
        changes nothing (there is no campaign left to recover it into)."""
        try:
            for rank in self.workers:
                if rank not in self.failed_ranks:
                    self.channel.send(rank, Tag.RELEASE, Release())
        except RankFailure as failure:
            log.warning("a rank died after the campaign was closed (%s): not recovered",
                        failure)

    def close(self) -> None:
        if self.faults.fire_at("die", "closing", 1):
            die("fault: SIGKILL of the master while it closes the campaign")
        if self.importer is not None and self.importer.probe is not None:
            self.importer.probe.close()
        if self.federation is not None and self.federation.targets is not None:
            self.federation.targets.release_all()
        with self._stopping_if_storage_refuses():
            if self.dispatch.deferrals is not None:
                self.dispatch.deferrals.close()
        if not self._journal_settled():
            self.campaign.snapshot_on_close = False
        with self._stopping_if_storage_refuses():
            self.campaign.close()
        self.doorbell.close()

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
        with self._stopping_if_storage_refuses():
            self.report()


class _StorageGuard:
    """Master._stopping_if_storage_refuses: a class, not a @contextmanager generator, since
    the master enters it several times per round."""

    def __init__(self, master: Master):
        self.master = master

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> bool:
        if kind is None or not issubclass(kind, OSError) or not storage_failing(error):
            return False
        self.master._stop_for_resources(describe(error, self.master.config.out))
        return True


def _command_time() -> float:
    """When the user's command started: the launcher's clock, else this process's start."""
    try:
        return float(os.environ["SYMCC_MPI_COMMAND_TIME"])
    except (KeyError, ValueError):
        pass
    try:  # under the user's own launcher: this rank's start, from /proc
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            age = float(uptime.read().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK")
        return SYSTEM_CLOCK.time() - age
    except (OSError, ValueError, IndexError):
        return SYSTEM_CLOCK.time()


def configure_logging(rank: int) -> None:
    logging.basicConfig(
        level=os.environ.get("SYMCC_MPI_LOG", "INFO").upper(),
        format=f"%(asctime)s rank {rank} %(levelname)s %(message)s",
        stream=sys.stderr,
    )
