"""One rank's life under MPI: rank 0 checks the configuration and runs the master loop,
every other rank runs the worker loop. Rank 0's verdict reaches workers before any work."""

from __future__ import annotations

import logging
import signal
from dataclasses import replace

from symcc_mpi.campaign import snapshot, wal
from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.layout import CampaignError, check_out_dir
from symcc_mpi.campaign.wal import outstanding, replay_epochs, work_of
from symcc_mpi.config import CampaignConfig, UsageError, check_numbers, check_seeds
from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.durable.storage import (
    STOP_ADVICE,
    STORAGE_EXIT,
    describe,
    storage_failing,
    storage_refused,
)
from symcc_mpi.executors import check_executor
from symcc_mpi.processes.scratch import check_scratch
from symcc_mpi.roles.faults import Faults
from symcc_mpi.roles.host import MACHINE, Host
from symcc_mpi.scheduling.splitting import SPLIT_ANEW, parse_work_id
from symcc_mpi.ulfm.generations import GenerationLogError
from symcc_mpi.wire.protocol import ConfigVerdict, Tag

log = logging.getLogger("symcc_mpi.job.session")
SEND_FLUSH_TIMEOUT = 10.0
ABORT_STATUS = 1  # MPI_Abort's status when a rank fails with an unexpected error
FINALIZE_DEADLINE = 10  # seconds (signal.alarm)
FINAL_BARRIER_DEADLINE = 120.0  # seconds the masters wait for each other at the end
TAKEOVER_LOCK_WAIT = 120.0  # NFS keeps a dead client's locks until its lease expires (~90 s)


def run_rank(config: CampaignConfig, host: Host = MACHINE) -> int:
    from symcc_mpi.job.logs import configure_logging
    from symcc_mpi.roles.worker import note_termination
    from symcc_mpi.wire.transport import Channel

    world = Channel(host.world())
    configure_logging(world.rank)
    if world.rank != 0:
        # Ctrl-C on a terminal, and a scheduler's SIGTERM, reach every rank; only the master
        # decides when work stops (a rank that becomes one takes both signals over).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, note_termination)
    decision = host.decide_fault_tolerance(world.comm, config)
    if world.rank == 0:
        log.info("fault tolerance %s", decision.reason)
    if config.masters > 1:
        return _run_federated(world, config, outlive_ranks=decision.enabled, host=host)
    job = Generations(config, host) if decision.enabled else None
    finalized = False
    try:
        if job is None:
            return _run_role(world, config, host)
        status = job.run()
        _flush(job.channel, world.rank)
        finalized = True
        host.finalize(FINALIZE_DEADLINE)
        return status
    except GenerationLogError as error:  # recovery refused: fail closed, in one line
        log.error("rank %d: cannot recover: %s; ending the job", world.rank, error)
        world.comm.Abort(ABORT_STATUS)
        raise
    except Exception as error:
        # Left to unwind, the error would end this rank in MPI_Finalize, which waits for
        # every other rank, and they for it: the job would hang. Say it, then end the job.
        _end_job(world, config, error)
        raise
    finally:
        if not finalized:
            _flush(job.channel if job is not None else world, world.rank)


def _end_job(world, config: CampaignConfig, error: Exception) -> None:
    """MPI_Abort after `error`: OUT failing (a recovery's generation log, say) in one line,
    anything else with its traceback."""
    if storage_failing(error):
        log.error("rank %d: %s: %s; ending the job", world.rank, describe(error, config.out),
                  STOP_ADVICE)
        world.comm.Abort(STORAGE_EXIT)
    log.exception("rank %d failed; ending the job", world.rank)
    world.comm.Abort(ABORT_STATUS)


def _flush(channel, rank: int) -> None:
    from symcc_mpi.wire.transport import RankFailure

    try:
        if channel is not None and not channel.flush(timeout=SEND_FLUSH_TIMEOUT):
            log.warning("rank %d: messages still unsent after %g s at exit", rank,
                        SEND_FLUSH_TIMEOUT)
    except RankFailure as failure:  # the campaign is over: nobody waits for them any more
        log.warning("rank %d: messages unsent at exit: %s", rank, failure)


class JobEnded(Exception):
    """The master ended the job on purpose (its end is in the generation log)."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


class Generations:
    """One rank's life under ULFM: its role on each generation of the communicator, and the
    recovery between two (ulfm/runtime.py). Rank 0 of each generation is the master; a
    worker that becomes rank 0 after the master died takes the campaign over from OUT."""

    def __init__(self, config: CampaignConfig, host: Host = MACHINE):
        from mpi4py import MPI

        from symcc_mpi.ulfm.generations import GENERATIONS_JOURNAL, GenerationLog

        self.config = config
        self.host = host
        self.errhandler = MPI.ERRORS_RETURN
        self.log = GenerationLog(config.out / "state" / GENERATIONS_JOURNAL,
                                 quarantine_dir=config.out / "quarantine")
        self.channel = None
        self.master = None
        self.worker = None
        self.recoveries = 0
        self.world_rank = host.world().Get_rank()

    def run(self) -> int:
        from symcc_mpi.ulfm.runtime import Generation
        from symcc_mpi.wire.transport import Channel, RankFailure, failures_raised

        comm = self.host.world().Dup()
        comm.Set_errhandler(self.errhandler)
        with failures_raised():  # a rank lost before the campaign began ends the job
            members = tuple(comm.allgather(self.host.endpoint()))
        generation = Generation(-1, comm, members)
        self.channel = Channel(comm)
        if comm.Get_rank() == 0:
            status = self._open(members)
            if status is not None:
                return status
        else:
            from symcc_mpi.roles.worker import Worker

            self.worker = Worker(comm.Get_rank(), self.config, host=self.host)
        while True:
            try:
                return self._serve()
            except RankFailure as failure:
                detected = SYSTEM_CLOCK.time()
                log.warning("rank %d: %s: recovering", generation.rank, failure)
                try:
                    generation = self._recover(generation, detected)
                except JobEnded as end:
                    return end.status

    def _open(self, members: tuple[str, ...]) -> int | None:
        """Rank 0 of the first generation: the master, and the run's first generation."""
        status, master = _open_or_refuse(self.channel, self.config, fault_tolerant=True,
                                         host=self.host)
        if master is None:
            return status
        try:
            record = self.log.start(list(members), {"began": master.stopping.budget_start,
                                                    "run": master.run_id})
        except BaseException:
            master.close()
            raise
        master.generation, master.members = record.generation, members
        self._adopt(master)
        return None

    def _adopt(self, master) -> None:
        """`master` is this rank's role now; it leaves its end on record before it aborts."""
        master.stopping.before_abort = lambda status, reason: self.log.end(
            master.generation, status, reason)
        self.master = master

    def _serve(self) -> int:
        if self.master is not None:
            status = self.master.run()  # a RankFailure leaves the campaign open
            self.master.close()
            self.master.release_workers()
            return STORAGE_EXIT if self.master.storage_problem else status
        status = self.worker.serve(self.channel, watch_during_runs=True)
        self.worker.close()
        return status

    def _recover(self, generation, detected: float):
        from symcc_mpi.roles.faults import die
        from symcc_mpi.ulfm.runtime import Generation, recover
        from symcc_mpi.wire.transport import Channel

        # The log, not this rank's memory, says which generation ends: a worker may have
        # lost its master before the CONFIG that names it.
        current = self.log.current()
        if current is None or current.body.get("members") != list(generation.members):
            raise GenerationLogError("a rank died before the campaign's first generation "
                                     "began: nothing to recover, continue with --resume")
        generation = Generation(current.generation, generation.comm, generation.members)
        ended = self.log.ended(generation.number)
        if ended is not None:  # not a failure: the master ended the job, and it ends so
            log.warning("rank %d: the master ended the job (%s): not recovering",
                        generation.rank, ended.body["reason"])
            raise JobEnded(ended.body["status"])
        self.recoveries += 1
        if (self.master or self.worker).faults.fire_at("die", "recovery", self.recoveries):
            die(f"fault: SIGKILL of rank {generation.rank} inside recovery #{self.recoveries}")
        repaired, repair = recover(generation, self.log, errhandler=self.errhandler)
        self.channel = Channel(repaired.comm)
        if self.master is not None:
            self.master.begin_generation(self.channel, repaired.number, repaired.members,
                                         repair, detected=detected)
        elif repaired.rank == 0:
            self._take_over(repaired, repair, detected)
        return repaired

    def _take_over(self, generation, repair, detected: float) -> None:
        """This worker is rank 0 now: the master died. It rebuilds the campaign from OUT
        alone (open_master, as --resume does: the commits with a manifest and no done
        record are redone, what was in flight is in the frontier again) and carries on."""
        from symcc_mpi.job.progress import carry_stats
        from symcc_mpi.ulfm.runtime import describe_endpoint

        log.warning("rank 0 of generation %d: the master is gone, taking the campaign over",
                    generation.number)
        self.worker.close()
        self.worker = None
        master = open_master(self.channel, replace(self.config, resume=True),
                             fault_tolerant=True, world_rank=self.world_rank, taking_over=True,
                             host=self.host)
        master.generation, master.members = generation.number, generation.members
        first = self.log.first_of_run(generation.number)
        if first is not None:
            master.stopping.budget_start = first.body.get("began",
                                                          master.stopping.budget_start)
        carry_stats(master, self.config.out)
        previous = self.log.find("commit", repair.previous) or self.log.first_of_run(
            repair.previous)
        members = tuple(previous.body["members"]) if previous is not None else ()
        failed = [describe_endpoint(endpoint, members, repair.previous)
                  for endpoint in repair.failed]
        master.note_recovery(generation.number, failed, master.in_flight_at_takeover,
                             repair.seconds, detected=detected, shrinks=repair.shrinks,
                             master="new")
        if not master.workers:
            master.stopping.begin("no usable worker: every worker rank died")
        self._adopt(master)


def _run_federated(world, config: CampaignConfig, *, outlive_ranks: bool,
                   host: Host = MACHINE) -> int:
    """Several masters (federation.py): the ranks split into groups, a master and its
    workers each; the first master opens the campaign before the others join it.
    `outlive_ranks` (ULFM): a rank's death stops the campaign cleanly, everything the
    survivors hold committed, instead of ending the job at once."""
    from mpi4py import MPI

    from symcc_mpi.federation.layout import groups
    from symcc_mpi.federation.masters import CONFLICT_EXIT, Federation
    from symcc_mpi.federation.ownership import new_epoch
    from symcc_mpi.wire.transport import Channel

    try:
        layout = groups(world.size, config.masters)
    except UsageError as error:
        if world.rank == 0:
            print(f"symcc-mpi: error: {error}", flush=True)
        return 2
    index = next(k for k, ranks in enumerate(layout) if world.rank in ranks)
    group_comm = world.comm.Split(index, world.rank)
    is_master = group_comm.Get_rank() == 0
    masters_comm = world.comm.Split(0 if is_master else MPI.UNDEFINED, world.rank)
    for comm in (group_comm, masters_comm) if outlive_ranks else ():
        if comm != MPI.COMM_NULL:
            comm.Set_errhandler(MPI.ERRORS_RETURN)
    group = Channel(group_comm)
    finalized = False
    epoch = world.comm.bcast(new_epoch() if world.rank == 0 else None, root=0)
    try:
        if not is_master:
            from symcc_mpi.roles.worker import run_worker

            status = run_worker(group, config, fault_rank=world.rank,
                                outlive_master=outlive_ranks, host=host)
        else:
            federation = Federation(Channel(masters_comm), index=index,
                                    masters=config.masters, out=config.out, epoch=epoch,
                                    world_ranks=layout, execution_timeout=config.timeout)
            status = _run_federated_master(group, masters_comm, federation, config,
                                           outlive_ranks=outlive_ranks, host=host)
            _flush(federation.channel, world.rank)
        if outlive_ranks:  # after a death, MPI_Finalize may wait for ever (DESIGN §8)
            _flush(group, world.rank)
            finalized = True
            host.finalize(FINALIZE_DEADLINE)
        return status
    except TimeoutError as error:  # a shared lock held past its deadline (F320 §2.6)
        log.error("rank %d: %s; ending the job", world.rank, error)
        world.comm.Abort(CONFLICT_EXIT)
        raise
    except Exception as error:
        _end_job(world, config, error)
        raise
    finally:
        if not finalized:  # under ULFM the group was flushed before MPI_Finalize
            _flush(group, world.rank)


def _run_federated_master(group, masters_comm, federation, config: CampaignConfig, *,
                          outlive_ranks: bool, host: Host = MACHINE) -> int:
    """Root opens OUT (checks, creates, adds the seeds), then the others open their state;
    any master's refusal refuses the whole job. After the campaign, the masters meet once
    more and root removes the job's lease table."""
    problem = ""
    master = None
    if federation.root:
        status, master = _open_or_refuse(group, config, federation=federation, host=host)
        problem = "" if master is not None else "the first master refused the campaign"
    problem = masters_comm.bcast(problem, root=0)
    if not federation.root:
        if problem:
            _refuse_workers(group, problem)
            return 2
        status, master = _open_or_refuse(group, config, federation=federation, host=host)
    refusals = [p for p in masters_comm.allgather(
        "" if master is not None else f"master {federation.index} refused")]
    if any(refusals):
        if master is not None:
            master.close()
            _refuse_workers(group, "; ".join(filter(None, refusals)))
        return status if master is None else 2
    master.outlives_ranks = outlive_ranks
    try:
        federation.open()
        status = master.run()
    finally:
        master.close()
    master.release_workers()
    # Every master is done with the lease table; a master stuck past the deadline keeps it.
    if _barrier_within(masters_comm, FINAL_BARRIER_DEADLINE) and federation.root:
        federation.remove_lease_directory()
    return STORAGE_EXIT if master.storage_problem else status


def _barrier_within(comm, seconds: float) -> bool:
    """A barrier that gives up after `seconds` (F320 §2.6: every wait is bounded), or when a
    master died (ULFM); False then, and the job's lease table stays in OUT (harmless: the
    next run's first master removes it)."""
    from mpi4py import MPI

    deadline = SYSTEM_CLOCK.monotonic() + seconds
    try:
        request = comm.Ibarrier()
        while not request.Test():
            if SYSTEM_CLOCK.monotonic() >= deadline:
                log.warning("the other masters did not finish within %g s", seconds)
                return False
            SYSTEM_CLOCK.sleep(0.01)
    except MPI.Exception as error:
        log.warning("the masters' last meeting failed: %s", error)
        return False
    return True


def _refuse_workers(channel, problem: str) -> None:
    for rank in range(1, channel.size):
        channel.send(rank, Tag.CONFIG, ConfigVerdict(ok=False, error=problem))


def _run_role(channel, config: CampaignConfig, host: Host = MACHINE) -> int:
    if channel.rank != 0:
        from symcc_mpi.roles.worker import run_worker

        return run_worker(channel, config, host=host)
    status, master = _open_or_refuse(channel, config, host=host)
    if master is None:
        return status
    try:
        status = master.run()
    finally:
        master.close()
    master.release_workers()
    return STORAGE_EXIT if master.storage_problem else status  # the last sync may fail too


def _open_or_refuse(channel, config: CampaignConfig, *, fault_tolerant: bool = False,
                    federation=None, host: Host = MACHINE):
    """(None, the master), or (exit status, None) once every worker was told why not."""
    try:
        if channel.size < 2:
            raise UsageError("a campaign needs at least 2 MPI ranks (1 master + 1 worker)")
        return None, open_master(channel, config, fault_tolerant=fault_tolerant,
                                 federation=federation, host=host)
    except (UsageError, CampaignError, OSError) as error:
        if isinstance(error, OSError) and not storage_refused(error):
            raise
        refused = isinstance(error, OSError)
        problem = f"{describe(error, config.out)}: {STOP_ADVICE}" if refused else str(error)
        print(f"symcc-mpi: error: {problem}", flush=True)
        _refuse_workers(channel, problem)
        return STORAGE_EXIT if refused else 2, None


def check_config(config: CampaignConfig, *, lock_held: bool = False) -> None:
    """Everything that can be refused before a rank is started. `lock_held`: this process
    holds the campaign lock already (a master taking over)."""
    check_numbers(config)
    if config.seeds is not None and (not config.resume or config.seeds.exists()):
        check_seeds(config.seeds)
    check_executor(config.executor, config.target)
    check_fault_plan()
    check_pool_bounds()
    if config.afl_target:
        from symcc_mpi.coverage.edges import TriageError, check_afl_target

        try:
            check_afl_target(list(config.afl_target))
        except TriageError as error:
            raise UsageError(f"--afl-target: {error}") from None
    check_scratch(config.scratch)  # this node's: each worker checks its own (scratch.py)
    check_out_dir(config.out, resume=config.resume)  # it may create the directory
    if config.resume:
        campaign = CampaignDir(config.out)
        if not lock_held:
            campaign.check_not_running()  # before mpiexec, and before anything reads it
        # A corrupt journal is refused before launch. Read-only: the campaign lock is not
        # held here (the master takes it), so a torn tail is not cut here. A snapshot that
        # covers it vouches for it (the run that wrote both checked it at its close).
        if not snapshot.covers_journal(campaign):
            campaign.read_done()


def check_pool_bounds() -> None:
    from symcc_mpi.scheduling.tiers.pool import bounds_from_env

    try:
        bounds_from_env()
    except ValueError as error:
        raise UsageError(str(error)) from None


def check_fault_plan() -> None:
    try:
        Faults(0)
    except ValueError as error:
        raise UsageError(str(error)) from None


def open_master(channel, config: CampaignConfig, *, fault_tolerant: bool = False,
                world_rank: int = 0, taking_over: bool = False, federation=None,
                host: Host = MACHINE):
    """The master of `channel`'s ranks, its campaign open. With several masters
    (`federation`), the first opens OUT as a lone master does and the others join it: their
    own state under state/master-k/, the seeds and queue/ left to the first."""
    from symcc_mpi.dispatch.watchdog import WatchdogConfig
    from symcc_mpi.durable.deferred import DEFERRED_JOURNAL_NAME, DeferredWorkJournal
    from symcc_mpi.job.progress import CampaignReporter, master_snapshot
    from symcc_mpi.roles.master import Master

    joining = federation is not None and not federation.root
    if federation is not None:
        world_rank = federation.world_ranks[federation.index].start
    campaign = CampaignDir(config.out, master=federation.index if federation else 0)
    if taking_over:  # the dead master's lock may outlive it a little (NFS)
        campaign.lock(wait=TAKEOVER_LOCK_WAIT)
    if joining:  # the first master checked OUT, created it and holds its lock
        config = replace(config, resume=True)
    check_config(config, lock_held=taking_over or joining)
    if not taking_over:
        campaign.lock()
    try:
        if not config.resume:
            campaign.create(config.to_json())
        campaign.keep_queue_names = config.hybrid
        saved = snapshot.take(campaign) if config.resume else None  # it serves once
        if saved is not None and federation is None and not taking_over:
            campaign.restore(saved)
        else:
            saved = None
            campaign.read_queues()
        campaign.snapshot_on_close = federation is None
        coverage, covered_entries = _coverage_map(config, campaign)
        importer = _importer(config, campaign, coverage) if config.hybrid else None
        deferrals = DeferredWorkJournal(campaign.state / DEFERRED_JOURNAL_NAME,
                                        quarantine_dir=campaign.quarantine)
        for damage in deferrals.damage:
            log.warning("deferred-work journal: %s", damage)
        reporter = CampaignReporter(config)
        if joining:  # its figures go to the first master, which reports for all
            reporter = lambda master, final: federation.report(  # noqa: E731
                master_snapshot(master), final)
            campaign.forward_finding = federation.forward
        master = Master(channel, config, campaign, triage=coverage,
                        pruning=_pruning_ledger(config, campaign),
                        lower=_lower_tiers(config, campaign, coverage, federation),
                        reporter=reporter, deferrals=deferrals,
                        watchdog=WatchdogConfig.from_env(execution_timeout=config.timeout),
                        fault_tolerant=fault_tolerant, world_rank=world_rank,
                        federation=federation, importer=importer, doorbell=host.doorbell())
        _load_state(master, config, campaign, covered_entries, taking_over=taking_over,
                    names_entries=not joining, saved=saved)
    except BaseException:
        campaign.close()
        raise
    return master


def _lower_tiers(config: CampaignConfig, campaign: CampaignDir, coverage, federation):
    """Tiers 2 and 3 (tiers/), with one master: the aside pool where triage drops inputs,
    epochs where runs prune; used once the interesting frontier is empty if the campaign
    has a budget (the pool fills either way, for a resume with one)."""
    if federation is not None:
        return None
    from symcc_mpi.scheduling.tiers.lower import LowerTiers
    from symcc_mpi.scheduling.tiers.pool import POOL_DIRECTORY, AsidePool, bounds_from_env
    from symcc_mpi.scheduling.tiers.schedule import TierSchedule

    schedule = TierSchedule(enabled=config.budgeted, aside=coverage is not None,
                            rerun=config.prunes)
    pool = None
    if coverage is not None:
        max_inputs, max_bytes = bounds_from_env()
        pool = AsidePool(config.out / POOL_DIRECTORY, max_inputs=max_inputs,
                         max_bytes=max_bytes)
    return LowerTiers(campaign.inputs, schedule, pool)


def _importer(config: CampaignConfig, campaign: CampaignDir, coverage):
    """A hybrid campaign's importer of the fuzzers' queues; the frontier takes its ranking."""
    from symcc_mpi.campaign.afl_sync import CURSORS_FILE, FleetQueues, Importer, load_cursors

    fleet = FleetQueues(config.afl_sync, config.out.name,
                        load_cursors(campaign.state / CURSORS_FILE))
    importer = Importer(campaign, campaign.inputs, fleet, probe=_master_probe(config),
                        triage=coverage)
    campaign.inputs.rank_by(importer.priority)
    return importer


def _coverage_map(config: CampaignConfig, campaign: CampaignDir):
    """The triage map, and how many queue/ entries it covers already (resume)."""
    if not config.afl_target:
        return None, 0
    from symcc_mpi.campaign.checkpoint import load_triage
    from symcc_mpi.coverage.triage import CoverageMap

    saved, covered = load_triage(campaign) if config.resume else (None, 0)
    return (saved, covered) if saved is not None else (CoverageMap(), 0)


def _pruning_ledger(config: CampaignConfig, campaign: CampaignDir):
    if not config.prunes:
        return None
    from symcc_mpi.campaign.checkpoint import load_pruning
    from symcc_mpi.coverage.pruning import PruningLedger, PruningMode

    saved = load_pruning(campaign) if config.resume else {}
    return PruningLedger(PruningMode(config.pruning), saved)


def _load_state(master, config: CampaignConfig, campaign: CampaignDir,
                covered_entries: int, *, taking_over: bool = False,
                names_entries: bool = True, saved=None) -> None:
    """Seeds in, then the frontier: every corpus input not yet in a done journal (every
    master's); the commits a dead master left half done are finished first (F443 §4 step 7).
    `names_entries`: this master names queue/ entries (not a master joining another).
    `saved`: the snapshot the last run left at its clean close (snapshot.py), restored
    already: only the journal records after it are read, the directories not listed."""
    seeds = []
    if config.seeds is not None and config.seeds.is_dir() and not taking_over \
            and names_entries:
        seeds = [campaign.add_seed(path.read_bytes(), path.name)  # by the run's first master
                 for path in check_seeds(config.seeds)]
    master.dispatch.seeds.update(seeds)
    campaign.sync_done()  # the new seeds are durable before any done line vouches for one
    # The lock is held: a torn last line is cut (and quarantined) here, and only here.
    everything = campaign.open_journal(writer=master.faults.done_writer(config.out),
                                       after=saved)
    past = replay_epochs(everything, epoch=campaign.epoch)
    campaign.epoch = master.dispatch.epoch = past.epoch
    if master.lower is not None:
        master.lower.schedule.epoch = past.epoch
    journal = past.current  # earlier epochs' work is settled: none was in flight at their end
    done = past.done | campaign.done_elsewhere()  # other masters', of this run or another
    if saved is None:
        _rebuild_frontier(master, campaign, past, done, journal, names_entries)
    else:  # the snapshot's table knows every input but the seeds new to this run
        for digest in seeds:
            master.frontier.add(digest, done=digest in done)
        master.stats.resumed_done = len(master.frontier.done)
    if names_entries and campaign.adopt_findings():
        log.warning("named the crashes and hangs other masters found before the last run "
                    "ended")
    done |= _redo_commits(master, journal, done)
    if master.triage is not None:  # after the redone commits, which publish unprobed
        uncovered = sorted((d for d in master.frontier.known
                            if campaign.inputs.queue_id(d) >= covered_entries),
                           key=campaign.inputs.queue_id) \
            if covered_entries < campaign.queue_entries else []
        if covered_entries:
            log.info("triage map saved over %d queue entries: replaying %d through "
                     "the AFL build", covered_entries, len(uncovered))
        _replay_coverage(master, config, campaign, uncovered)
    if master.lower is not None and master.lower.pool is not None:
        frontier = master.frontier
        pooled = master.lower.pool.load(
            lambda digest: frontier.seen_before(digest) and not frontier.awaits_aside(digest))
        for digest in master.lower.pool.pending_digests():
            master.frontier.set_aside(digest)
        if pooled:
            log.info("%d inputs set aside earlier wait in the aside pool (tier 2)", pooled)
    # Work the last master dispatched and neither committed nor took back: in the frontier
    # again, and on record as in flight at its end (the journal's dispatch records).
    master.in_flight_at_takeover = sorted(work for work in outstanding(journal)
                                          if parse_work_id(work)[0] not in done)
    # An input split and not finished is split anew: each part it had goes out again.
    split_again = {work_of(r) for r in journal if r.get("kind") == "part"
                   and r["sha256"] not in done} - set(master.in_flight_at_takeover)
    for work in sorted(split_again):
        digest, part = parse_work_id(work)
        campaign.record_work(wal.Requeue(sha256=digest, part=part, reason=SPLIT_ANEW))
    if not taking_over:  # a resumed run: the last run's master died, or was stopped so
        for work in master.in_flight_at_takeover:
            digest, part = parse_work_id(work)
            campaign.record_work(wal.Requeue(sha256=digest, reason="the last run ended",
                                             part=part))
    campaign.clear_staging()  # nothing is in flight before we start
    log.info("campaign %s: %d inputs, %d already analysed, %d in the frontier%s",
             config.out, len(master.frontier.known), master.stats.resumed_done,
             len(master.frontier), " (from the last run's snapshot)" if saved else "")


def _rebuild_frontier(master, campaign: CampaignDir, past, done: set[str],
                      journal: list[dict], names_entries: bool) -> None:
    """The frontier from the directories and the journal, when no snapshot serves."""
    corpus = campaign.corpus_digests()
    for digest in corpus if names_entries else ():
        if campaign.inputs.queue_id(digest) is None:  # promoted, then killed before queueing
            campaign.add_to_queue(digest, parent="")
    ordered = sorted(corpus, key=campaign.inputs.queue_id)
    committing = {r["sha256"] for r in journal
                  if r.get("kind") == "commit" and r.get("part") is None} - done
    for digest in ordered:  # a commit left half done is finished below, not analysed again
        if digest in past.done_before and digest not in done and digest not in committing:
            master.frontier.add_rerun(digest)  # tier 3 of the epoch in progress
        else:
            master.frontier.add(digest, done=digest in done or digest in committing)
    for digest in (past.done | past.done_before) - corpus:  # tier 2's, analysed
        master.frontier.see(digest)
        if digest in done:
            master.frontier.mark_done(digest)
    master.stats.resumed_done = len(done & corpus)


def _redo_commits(master, journal: list[dict], done: set[str]) -> set[str]:
    """Finish every commit whose manifest is in the journal without its done record: check
    the manifest's staged files again and commit them as the dead master would have. One
    that cannot be finished (its staging is gone or refused) leaves its input in the
    frontier, to be analysed again. Returns the inputs committed."""
    from symcc_mpi.campaign.commit import Unusable, decode_manifest
    from symcc_mpi.wire.protocol import MalformedMessage

    redone: set[str] = set()
    parts_done = {work_of(r) for r in journal if r.get("kind") == "part"}
    pending = {work_of(r): r for r in journal if r.get("kind") == "commit"
               and r["sha256"] not in done and work_of(r) not in parts_done}
    for work, record in pending.items():
        digest, part = parse_work_id(work)
        try:
            result = decode_manifest(record)
            accepted = master.committer.check(result, digest)
        except (MalformedMessage, Unusable) as problem:
            log.warning("the commit of %s left by the last master cannot be finished (%s): "
                        "it is analysed again", work[:12], problem)
            if part is None:
                master.frontier.reopen(digest)
            continue
        # A part's children are published; its input, not done, is split anew.
        master.committer.commit(None, result, accepted, part=part,
                                completes_input=part is None)
        if part is None:
            redone.add(digest)
    if redone:
        master.stats.redone_commits += len(redone)
        log.info("finished %d commits the last master left half done", len(redone))
    return redone


def _master_probe(config: CampaignConfig):
    """The master's own coverage probe (replay on resume, the hybrid importer)."""
    from symcc_mpi.coverage.forkserver import ForkserverProbe

    return ForkserverProbe(list(config.afl_target), timeout=config.timeout,
                           memory_limit_mb=config.memory_limit_mb, scratch_dir=config.scratch)


def _replay_coverage(master, config, campaign: CampaignDir, ordered: list[str]) -> None:
    if not ordered:
        return
    with _master_probe(config) as probe:
        for digest in ordered:
            try:
                data = campaign.read_input(digest)
            except OSError as error:  # quarantined (corrupt) or gone: its dispatch says so
                log.warning("replaying the coverage of %s: %s", digest[:12], error)
                continue
            master.triage.merge(probe.probe_bytes(data))
    master.checkpoint.triage_dirty = True
