"""How a rank ends: its unsent messages flushed, or the whole job aborted after an error it
cannot get past (one line when OUT refuses writes, the traceback otherwise)."""

from __future__ import annotations

import logging

from symcc_mpi.config import CampaignConfig
from symcc_mpi.durable.storage import STOP_ADVICE, STORAGE_EXIT, describe, storage_failing
from symcc_mpi.wire.transport import RankFailure

log = logging.getLogger(__name__)
SEND_FLUSH_TIMEOUT = 10.0
ABORT_STATUS = 1  # MPI_Abort's status when a rank fails with an unexpected error


def end_job(world, config: CampaignConfig, error: Exception) -> None:
    """MPI_Abort after `error`: OUT failing (a recovery's generation log, say) in one line,
    anything else with its traceback."""
    if storage_failing(error):
        log.error("rank %d: %s: %s; ending the job", world.rank, describe(error, config.out),
                  STOP_ADVICE)
        world.comm.Abort(STORAGE_EXIT)
    log.exception("rank %d failed; ending the job", world.rank)
    world.comm.Abort(ABORT_STATUS)


def flush(channel, rank: int) -> None:
    try:
        if channel is not None and not channel.flush(timeout=SEND_FLUSH_TIMEOUT):
            log.warning("rank %d: messages still unsent after %g s at exit", rank,
                        SEND_FLUSH_TIMEOUT)
    except RankFailure as failure:  # the campaign is over: nobody waits for them any more
        log.warning("rank %d: messages unsent at exit: %s", rank, failure)
