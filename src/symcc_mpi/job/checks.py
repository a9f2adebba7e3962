"""The checks of a configuration before any work: the launcher's, and rank 0's again on
its own node (the verdict every worker waits for)."""

from __future__ import annotations

import logging

from symcc_mpi.campaign import snapshot
from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.layout import check_out_dir
from symcc_mpi.config import CampaignConfig, UsageError, aside_bounds, check_numbers, check_seeds
from symcc_mpi.coverage.edges import TriageError, check_afl_target
from symcc_mpi.executors import check_executor
from symcc_mpi.processes.scratch import check_scratch
from symcc_mpi.roles.faults import Faults

log = logging.getLogger(__name__)


def check_config(config: CampaignConfig, *, lock_held: bool = False) -> None:
    """Everything that can be refused before a rank is started. `lock_held`: this process
    holds the campaign lock already (a master taking over)."""
    check_numbers(config)
    if config.seeds is not None and (not config.resume or config.seeds.exists()):
        check_seeds(config.seeds)
    check_executor(config.executor, config.target)
    check_fault_plan()
    aside_bounds()  # refuses a bad SYMCC_ASIDE_MAX_* setting
    if config.afl_target:
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
        # serves vouches for the records it covers: only those after it are read.
        saved = snapshot.serving(campaign)
        campaign.inspect_journal(after=(saved.journal_size, saved.journal_lines)
                                 if saved is not None else (0, 0))


def check_fault_plan() -> None:
    try:
        Faults(0)
    except ValueError as error:
        raise UsageError(str(error)) from None
