"""The master put together from the campaign directory and the configuration: its
collaborators, the tiers, the hybrid importer, the maps; or the refusal every worker hears."""

from __future__ import annotations

import logging
from dataclasses import replace

from symcc_mpi.campaign import snapshot
from symcc_mpi.campaign.afl_sync import CURSORS_FILE, FleetQueues, Importer, load_cursors
from symcc_mpi.campaign.checkpoint import load_pruning, load_triage
from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.layout import CampaignError
from symcc_mpi.config import CampaignConfig, UsageError, aside_bounds
from symcc_mpi.coverage.pruning import PruningLedger, PruningMode
from symcc_mpi.coverage.triage import CoverageMap
from symcc_mpi.dispatch.watchdog import WatchdogConfig
from symcc_mpi.durable.deferred import DEFERRED_JOURNAL_NAME, DeferredWorkJournal
from symcc_mpi.durable.storage import (
    STOP_ADVICE,
    STORAGE_EXIT,
    describe,
    storage_refused,
)
from symcc_mpi.job.checks import check_config
from symcc_mpi.job.progress import CampaignReporter, master_snapshot
from symcc_mpi.job.resume import load_state
from symcc_mpi.roles.host import MACHINE, Host
from symcc_mpi.roles.master import Master
from symcc_mpi.scheduling.tiers.lower import LowerTiers
from symcc_mpi.scheduling.tiers.pool import POOL_DIRECTORY, AsidePool
from symcc_mpi.scheduling.tiers.schedule import TierSchedule
from symcc_mpi.wire.protocol import ConfigVerdict, Tag

log = logging.getLogger(__name__)
TAKEOVER_LOCK_WAIT = 120.0  # NFS keeps a dead client's locks until its lease expires (~90 s)


def open_or_refuse(channel, config: CampaignConfig, *, fault_tolerant: bool = False,
                    federation=None, taking_over: bool = False, host: Host = MACHINE):
    """(None, the master), or (exit status, None) once every worker was told why not."""
    try:
        if channel.size < 2 and not taking_over:  # a lone successor withdraws from the work
            raise UsageError("a campaign needs at least 2 MPI ranks (1 master + 1 worker)")
        return None, open_master(channel, config, fault_tolerant=fault_tolerant,
                                 federation=federation, taking_over=taking_over, host=host)
    except (UsageError, CampaignError, OSError) as error:
        if isinstance(error, OSError) and not storage_refused(error):
            raise
        refused = isinstance(error, OSError)
        problem = f"{describe(error, config.out)}: {STOP_ADVICE}" if refused else str(error)
        print(f"symcc-mpi: error: {problem}", flush=True)
        refuse_workers(channel, problem)
        return STORAGE_EXIT if refused else 2, None


def refuse_workers(channel, problem: str) -> None:
    for rank in range(1, channel.size):
        channel.send(rank, Tag.CONFIG, ConfigVerdict(ok=False, error=problem))


def open_master(channel, config: CampaignConfig, *, fault_tolerant: bool = False,
                world_rank: int = 0, taking_over: bool = False, federation=None,
                host: Host = MACHINE):
    """The master of `channel`'s ranks, its campaign open. With several masters
    (`federation`), the first opens OUT as a lone master does and the others join it: their
    own state under state/master-k/, the seeds and queue/ left to the first."""

    joining = federation is not None and not federation.root
    if federation is not None:
        world_rank = federation.roster.world_of[federation.index]
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
        elif not joining:
            campaign.upgrade_layout()
        campaign.keep_queue_names = config.hybrid
        # Taken by every master that opens OUT, used or not: it serves once, and a snapshot
        # left in place would not know what this run publishes before its own first one.
        saved = snapshot.take(campaign)
        unqueued: list[str] = []
        if saved is not None and config.resume and federation is None and not taking_over:
            unqueued = campaign.restore(saved)
        else:
            saved = None
            campaign.read_queues()
        campaign.snapshot_on_close = federation is None
        coverage, covered_entries = _coverage_map(config, campaign)
        importer = _importer(config, campaign, coverage, host) if config.hybrid else None
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
        load_state(master, config, campaign, covered_entries, taking_over=taking_over,
                    names_entries=not joining, saved=saved, unqueued=unqueued,
                    probe=lambda: host.probe(config, config.scratch))
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

    schedule = TierSchedule(enabled=config.budgeted, aside=coverage is not None,
                            rerun=config.prunes)
    pool = None
    if coverage is not None:
        bounds = aside_bounds()
        pool = AsidePool(config.out / POOL_DIRECTORY, max_inputs=bounds.max_inputs,
                         max_bytes=bounds.max_bytes)
    return LowerTiers(campaign.inputs, schedule, pool)


def _importer(config: CampaignConfig, campaign: CampaignDir, coverage, host: Host):
    """A hybrid campaign's importer of the fuzzers' queues; the frontier takes its ranking."""

    fleet = FleetQueues(config.afl_sync, config.out.name,
                        load_cursors(campaign.state / CURSORS_FILE))
    importer = Importer(campaign, campaign.inputs, fleet, probe=host.probe(config, config.scratch),
                        triage=coverage)
    campaign.inputs.rank_by(importer.priority)
    return importer


def _coverage_map(config: CampaignConfig, campaign: CampaignDir):
    """The triage map, and how many queue/ entries it covers already (resume)."""
    if not config.afl_target:
        return None, 0

    saved, covered = load_triage(campaign) if config.resume else (None, 0)
    return (saved, covered) if saved is not None else (CoverageMap(), 0)


def _pruning_ledger(config: CampaignConfig, campaign: CampaignDir):
    if not config.prunes:
        return None

    saved = load_pruning(campaign) if config.resume else {}
    return PruningLedger(PruningMode(config.pruning), saved)
