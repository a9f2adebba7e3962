"""One rank's life under MPI: rank 0 checks the configuration and runs the master loop,
every other rank runs the worker loop. Rank 0's verdict reaches workers before any work."""

from __future__ import annotations

import logging
import shutil

from .config import CampaignConfig, UsageError, check_numbers, check_seeds
from .corpus import CampaignDir, CampaignError, check_out_dir
from .executors import check_available
from .faults import Faults
from .protocol import ConfigVerdict, Tag
from .storage import STOP_ADVICE, STORAGE_EXIT, describe, storage_refused

log = logging.getLogger("symcc_mpi.session")
SEND_FLUSH_TIMEOUT = 10.0
ABORT_STATUS = 1  # MPI_Abort's status when a rank fails with an unexpected error


def run_rank(config: CampaignConfig) -> int:
    from mpi4py import MPI

    from .roles.master import configure_logging
    from .transport import Channel

    channel = Channel(MPI.COMM_WORLD)
    configure_logging(channel.rank)
    try:
        return _run_role(channel, config)
    except Exception:
        # Left to unwind, the error would end this rank in MPI_Finalize, which waits for
        # every other rank, and they for it: the job would hang. Say it, then end the job.
        log.exception("rank %d failed; ending the job", channel.rank)
        channel.comm.Abort(ABORT_STATUS)
        raise
    finally:
        if not channel.flush(timeout=SEND_FLUSH_TIMEOUT):
            log.warning("rank %d: messages still unsent after %g s at exit", channel.rank,
                        SEND_FLUSH_TIMEOUT)


def _run_role(channel, config: CampaignConfig) -> int:
    if channel.rank != 0:
        from .roles.worker import run_worker

        return run_worker(channel, config)
    try:
        if channel.size < 2:
            raise UsageError("a campaign needs at least 2 MPI ranks (1 master + 1 worker)")
        master = open_master(channel, config)
    except (UsageError, CampaignError, OSError) as error:
        if isinstance(error, OSError) and not storage_refused(error):
            raise
        refused = isinstance(error, OSError)
        problem = f"{describe(error, config.out)}: {STOP_ADVICE}" if refused else str(error)
        print(f"symcc-mpi: error: {problem}", flush=True)
        for rank in range(1, channel.size):
            channel.send(rank, Tag.CONFIG, ConfigVerdict(ok=False, error=problem))
        return STORAGE_EXIT if refused else 2
    try:
        status = master.run()
    finally:
        master.close()
    return STORAGE_EXIT if master.storage_problem else status  # the last sync may fail too


def check_config(config: CampaignConfig) -> None:
    """Everything that can be refused before a rank is started."""
    check_numbers(config)
    if not config.resume or config.seeds.exists():
        check_seeds(config.seeds)
    check_available(config.executor)
    check_fault_plan()
    if config.afl_target:
        from .triage import check_afl_target

        check_afl_target(list(config.afl_target))
    check_out_dir(config.out, resume=config.resume)  # it may create the directory
    if config.resume:
        campaign = CampaignDir(config.out)
        campaign.check_not_running()  # before mpiexec, and before anything reads its state
        # A corrupt journal is refused before launch. Read-only: the campaign lock is not
        # held here (the master takes it), so a torn tail is not cut here.
        campaign.read_done()


def check_fault_plan() -> None:
    try:
        Faults(0)
    except ValueError as error:
        raise UsageError(str(error)) from None


def open_master(channel, config: CampaignConfig):
    from .dispatch.watchdog import WatchdogConfig
    from .durable.journal import DEFERRED_JOURNAL_NAME, DeferredWorkJournal
    from .progress import CampaignReporter
    from .roles.master import Master

    check_config(config)
    campaign = CampaignDir(config.out)
    campaign.lock()
    try:
        if not config.resume:
            campaign.create(config.to_json())
        campaign.read_queues()
        coverage, covered_entries = _coverage_map(config, campaign)
        deferrals = DeferredWorkJournal(campaign.state / DEFERRED_JOURNAL_NAME,
                                        quarantine_dir=campaign.quarantine)
        for damage in deferrals.damage:
            log.warning("deferred-work journal: %s", damage)
        master = Master(channel, config, campaign, triage=coverage,
                        pruning=_pruning_ledger(config, campaign),
                        reporter=CampaignReporter(config), deferrals=deferrals,
                        watchdog=WatchdogConfig.from_env(execution_timeout=config.timeout))
        _load_state(master, config, campaign, covered_entries)
    except BaseException:
        campaign.close()
        raise
    return master


def _coverage_map(config: CampaignConfig, campaign: CampaignDir):
    """The triage map, and how many queue/ entries it covers already (resume)."""
    if not config.afl_target:
        return None, 0
    from .checkpoint import load_triage
    from .triage import CoverageMap

    saved, covered = load_triage(campaign) if config.resume else (None, 0)
    return (saved, covered) if saved is not None else (CoverageMap(), 0)


def _pruning_ledger(config: CampaignConfig, campaign: CampaignDir):
    if not config.prunes:
        return None
    from .checkpoint import load_pruning
    from .pruning import PruningLedger, PruningMode

    saved = load_pruning(campaign) if config.resume else {}
    return PruningLedger(PruningMode(config.pruning), saved)


def _load_state(master, config: CampaignConfig, campaign: CampaignDir,
                covered_entries: int) -> None:
    """Seeds in, then the frontier: every corpus input not yet in the done journal."""
    for leftover in campaign.leftover_staging():
        shutil.rmtree(leftover, ignore_errors=True)  # nothing is in flight before we start
    if config.seeds.is_dir():
        for path in check_seeds(config.seeds):
            campaign.add_seed(path.read_bytes(), path.name)
    campaign.sync_done()  # the new seeds are durable before any done line vouches for one
    # The lock is held: a torn last line is cut (and quarantined) here, and only here.
    done = {record["sha256"] for record in
            campaign.open_done(writer=master.faults.done_writer(config.out))}
    corpus = campaign.corpus_hashes()
    for digest in corpus:
        if campaign.inputs.queue_id(digest) is None:  # promoted, then killed before queueing
            campaign.add_to_queue(digest, parent="")
    ordered = sorted(corpus, key=campaign.inputs.queue_id)
    for digest in ordered:
        master.frontier.add(digest, done=digest in done)
    master.stats.resumed_done = len(done & corpus)
    if master.triage is not None:
        uncovered = [d for d in ordered if campaign.inputs.queue_id(d) >= covered_entries]
        if covered_entries:
            log.info("triage map saved over %d queue entries: replaying %d through "
                     "afl-showmap", covered_entries, len(uncovered))
        _replay_coverage(master, config, campaign, uncovered)
    log.info("campaign %s: %d inputs, %d already analysed, %d in the frontier", config.out,
             len(corpus), master.stats.resumed_done, len(master.frontier))


def _replay_coverage(master, config, campaign: CampaignDir, ordered: list[str]) -> None:
    from .triage import CoverageProbe

    probe = CoverageProbe(list(config.afl_target), timeout=config.timeout,
                          memory_limit_mb=config.memory_limit_mb)
    paths = [campaign.corpus / digest for digest in ordered]
    for coverage in probe.probe(paths):
        master.triage.merge(coverage)
    master.checkpoint.triage_dirty = bool(paths)
