"""A job of several masters (--masters M): the groups, the masters' communicator and their
shared lease table, and the end every master waits for."""

from __future__ import annotations

import logging

from symcc_mpi.config import CampaignConfig, UsageError
from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.durable.storage import STORAGE_EXIT
from symcc_mpi.federation.layout import groups
from symcc_mpi.federation.masters import CONFLICT_EXIT, Federation
from symcc_mpi.federation.ownership import new_epoch
from symcc_mpi.job.assembly import open_or_refuse, refuse_workers
from symcc_mpi.job.ending import end_job, flush
from symcc_mpi.roles.host import MACHINE, Host
from symcc_mpi.roles.worker import run_worker
from symcc_mpi.wire.transport import Channel

log = logging.getLogger(__name__)
FINALIZE_DEADLINE = 10  # seconds (signal.alarm)
FINAL_BARRIER_DEADLINE = 120.0  # seconds the masters wait for each other at the end


def run_federated(world, config: CampaignConfig, *, outlive_ranks: bool,
                   host: Host = MACHINE) -> int:
    """Several masters (federation.py): the ranks split into groups, a master and its
    workers each; the first master opens the campaign before the others join it.
    `outlive_ranks` (ULFM): a worker's death is survived by its master, which goes on with
    the others (roles/recovery.py); a master's stops the campaign cleanly, everything the
    survivors hold committed, instead of ending the job at once."""
    from mpi4py import MPI

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
    federation_comm = world.comm.Dup()  # a worker may take a dead master's place on it
    for comm in (group_comm, masters_comm, federation_comm) if outlive_ranks else ():
        if comm != MPI.COMM_NULL:
            comm.Set_errhandler(MPI.ERRORS_RETURN)
    group = Channel(group_comm)
    finalized = False
    epoch = world.comm.bcast(new_epoch() if world.rank == 0 else None, root=0)
    members = tuple(group_comm.allgather(host.endpoint()))  # to name a rank that dies
    try:
        if not is_master:
            status = run_worker(group, config, fault_rank=world.rank,
                                outlive_master=outlive_ranks, host=host)
        else:
            federation = Federation(Channel(federation_comm), index=index,
                                    masters=config.masters, out=config.out, epoch=epoch,
                                    world_ranks=layout, execution_timeout=config.timeout)
            status = _run_federated_master(group, masters_comm, federation, config,
                                           members, outlive_ranks=outlive_ranks, host=host)
            flush(federation.channel, world.rank)
        if outlive_ranks:  # after a death, MPI_Finalize may wait for ever (DESIGN §8)
            flush(group, world.rank)
            finalized = True
            host.finalize(FINALIZE_DEADLINE)
        return status
    except TimeoutError as error:  # a shared lock held past its deadline (F320 §2.6)
        log.error("rank %d: %s; ending the job", world.rank, error)
        world.comm.Abort(CONFLICT_EXIT)
        raise
    except Exception as error:
        end_job(world, config, error)
        raise
    finally:
        if not finalized:  # under ULFM the group was flushed before MPI_Finalize
            flush(group, world.rank)


def _run_federated_master(group, masters_comm, federation, config: CampaignConfig,
                          members: tuple[str, ...], *, outlive_ranks: bool,
                          host: Host = MACHINE) -> int:
    """Root opens OUT (checks, creates, adds the seeds), then the others open their state;
    any master's refusal refuses the whole job. After the campaign, the masters meet once
    more and root removes the job's lease table."""
    problem = ""
    master = None
    if federation.root:
        status, master = open_or_refuse(group, config, federation=federation, host=host)
        problem = "" if master is not None else "the first master refused the campaign"
    problem = masters_comm.bcast(problem, root=0)
    if not federation.root:
        if problem:
            refuse_workers(group, problem)
            return 2
        status, master = open_or_refuse(group, config, federation=federation, host=host)
    refusals = [p for p in masters_comm.allgather(
        "" if master is not None else f"master {federation.index} refused")]
    if any(refusals):
        if master is not None:
            master.close()
            refuse_workers(group, "; ".join(filter(None, refusals)))
        return status if master is None else 2
    master.outlives_ranks = outlive_ranks
    master.members = members
    master.ranks.first_world_rank = federation.world_ranks[federation.index].start
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
