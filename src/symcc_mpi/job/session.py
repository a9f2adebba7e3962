"""One rank's life under MPI: rank 0 checks the configuration and runs the master loop,
every other rank runs the worker loop. Rank 0's verdict reaches workers before any work.
Under ULFM the rank lives through generations (job/generations.py); with several masters
through their groups (job/federated.py)."""

from __future__ import annotations

import logging
import signal

from symcc_mpi.config import CampaignConfig
from symcc_mpi.durable.storage import STORAGE_EXIT
from symcc_mpi.job.assembly import open_or_refuse
from symcc_mpi.job.ending import ABORT_STATUS, end_job, flush
from symcc_mpi.job.federated import run_federated
from symcc_mpi.job.generations import Generations
from symcc_mpi.job.logs import configure_logging
from symcc_mpi.roles.host import MACHINE, Host
from symcc_mpi.roles.worker import note_termination, run_worker
from symcc_mpi.ulfm.generations import GenerationLogError
from symcc_mpi.wire.transport import Channel

log = logging.getLogger(__name__)
FINALIZE_DEADLINE = 10  # seconds (signal.alarm)


def run_rank(config: CampaignConfig, host: Host = MACHINE) -> int:
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
        return run_federated(world, config, outlive_ranks=decision.enabled, host=host)
    job = Generations(config, host) if decision.enabled else None
    finalized = False
    try:
        if job is None:
            return _run_role(world, config, host)
        status = job.run()
        flush(job.channel, world.rank)
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
        end_job(world, config, error)
        raise
    finally:
        if not finalized:
            flush(job.channel if job is not None else world, world.rank)


def _run_role(channel, config: CampaignConfig, host: Host = MACHINE) -> int:
    if channel.rank != 0:
        return run_worker(channel, config, host=host)
    status, master = open_or_refuse(channel, config, host=host)
    if master is None:
        return status
    try:
        status = master.run()
    finally:
        master.close()
    master.release_workers()
    return STORAGE_EXIT if master.storage_problem else status  # the last sync may fail too
