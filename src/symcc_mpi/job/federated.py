"""A job of several masters (--masters M): the groups, the masters' communicator and their
shared lease table, a dead master's place taken by one of its workers, and the end every
master waits for."""

from __future__ import annotations

import functools
import logging
from dataclasses import replace

from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.wal import Kind, kind_of
from symcc_mpi.config import CampaignConfig, UsageError
from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.durable.storage import STORAGE_EXIT
from symcc_mpi.federation.layout import groups
from symcc_mpi.federation.masters import CONFLICT_EXIT, Federation
from symcc_mpi.federation.ownership import new_epoch
from symcc_mpi.federation.succession import FirstMastersPlace
from symcc_mpi.job.assembly import open_or_refuse, refuse_workers
from symcc_mpi.job.ending import end_job, flush
from symcc_mpi.roles.faults import FaultKind, die
from symcc_mpi.roles.host import MACHINE, Host
from symcc_mpi.roles.worker import Worker, run_worker
from symcc_mpi.ulfm.runtime import describe_process, revoke, shrink
from symcc_mpi.wire.protocol import Death, Successor
from symcc_mpi.wire.transport import Channel, RankFailure

log = logging.getLogger(__name__)
FINALIZE_DEADLINE = 10  # seconds (signal.alarm)
FINAL_BARRIER_DEADLINE = 120.0  # seconds the masters wait for each other at the end


def run_federated(world, config: CampaignConfig, *, outlive_ranks: bool,
                   host: Host = MACHINE) -> int:
    """Several masters (federation.py): the ranks split into groups, a master and its
    workers each; the first master opens the campaign before the others join it.
    `outlive_ranks` (ULFM): a worker's death is survived by its master, which goes on with
    the others (roles/recovery.py); a master's by one of its workers, which takes its place
    (`_serve_or_succeed`), the first master's too."""
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
        if not is_master and outlive_ranks:
            status = _serve_or_succeed(group, federation_comm, config, index=index,
                                       layout=layout, epoch=epoch, world_rank=world.rank,
                                       members=members, host=host)
        elif not is_master:
            status = run_worker(group, config, fault_rank=world.rank,
                                outlive_master=outlive_ranks, host=host)
        else:
            federation = Federation(Channel(federation_comm), index=index,
                                    masters=config.masters, out=config.out, epoch=epoch,
                                    world_ranks=layout, execution_timeout=config.timeout)
            heir = _heir(federation_comm, config, layout, epoch, world.rank, host) \
                if outlive_ranks else None
            status = _run_federated_master(group, masters_comm, federation, config,
                                           members, outlive_ranks=outlive_ranks, host=host,
                                           heir=heir)
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
                          host: Host = MACHINE, heir=None) -> int:
    """Root opens OUT (checks, creates, adds the seeds), then the others open their state;
    any master's refusal refuses the whole job. After the campaign, the masters meet once
    more and root removes the job's lease table. `heir`: see `_run_to_the_end`."""
    problem = ""
    master = None
    if federation.root:
        status, master = open_or_refuse(group, config, federation=federation,
                                        fault_tolerant=outlive_ranks, host=host)
        problem = "" if master is not None else "the first master refused the campaign"
    problem = masters_comm.bcast(problem, root=0)
    if not federation.root:
        if problem:
            refuse_workers(group, problem)
            return 2
        status, master = open_or_refuse(group, config, federation=federation,
                                        fault_tolerant=outlive_ranks, host=host)
    refusals = [p for p in masters_comm.allgather(
        "" if master is not None else f"master {federation.index} refused")]
    if any(refusals):
        if master is not None:
            master.close()
            refuse_workers(group, "; ".join(filter(None, refusals)))
        return status if master is None else 2
    # Every master has opened, and finished the commits its last run left half done: what
    # the others finished after this one read their journals is no work of anyone's now.
    for digest in master.campaign.done_elsewhere():
        master.frontier.mark_done(digest)
    master.outlives_ranks = outlive_ranks
    master.members = members
    master.ranks.world_ranks = tuple(federation.world_ranks[federation.index])
    federation.open()
    return _run_to_the_end(master, federation, heir)


def _run_to_the_end(master, federation, heir=None) -> int:
    """The master's campaign, its close, and the last word between masters: root removes
    the job's lease table once every other master is done with it (a master stuck past the
    deadline keeps it there, for the next run's root to remove). `heir` (under ULFM): if the
    first master's group dies whole and this master is its heir (FirstMastersPlace), it
    hands its work over and `heir(group, index, detected)` runs the rest of the job as the
    first master."""
    handing_over = False
    try:
        status = master.run()
    except FirstMastersPlace:
        if heir is None:
            raise
        handing_over = True
        master.hand_over()
    finally:
        master.close()
    if handing_over:
        federation.farewell()  # on record, with its final figures, for the new root
        flush(federation.channel, master.ranks.world_ranks[0])
        return heir(master.channel, federation.index, federation.root_gone_at)
    master.release_workers()
    federation.farewell()
    if federation.root and federation.await_farewells(master.own, FINAL_BARRIER_DEADLINE):
        federation.remove_lease_directory()
    return STORAGE_EXIT if master.storage_problem else status


def _serve_or_succeed(group: Channel, federation_comm, config: CampaignConfig, *, index: int,
                      layout: list[range], epoch: bytes, world_rank: int,
                      members: tuple[str, ...], host: Host = MACHINE) -> int:
    """A worker of master `index`, under ULFM. If its master dies while the campaign runs,
    the survivors of the group shrink its communicator, and its new rank 0 (the lowest world
    rank) takes the master's place: it opens the dead master's state as a master taking
    over does (its journal read back, the commits it left redone) and tells the first master
    (or, the first master's successor, all the others), which wait for it
    (federation/succession.py). The others serve it; a master made of the group's last rank
    has nobody to run its inputs, and withdraws from the work once it has taken over
    (federation/withdrawal.py). A death after STOP, when the campaign is ending, has nothing
    left to take over."""
    from mpi4py import MPI

    worker = Worker(group.rank, config, fault_rank=world_rank, host=host, serves=index)
    gathered = list(zip(layout[index], members, strict=True))  # (world rank, endpoint) by rank
    deaths: list[Death] = []  # of this group's masters
    try:
        while True:
            try:
                return worker.serve(group, watch_during_runs=True)
            except RankFailure as failure:
                detected = SYSTEM_CLOCK.time()
                if worker.stopped:
                    log.warning("rank %d: its master is gone (%s) after STOP: exiting",
                                world_rank, failure)
                    return 1
                index = worker.serves  # the first master's, if its group took that place
                master_was = gathered[0]
                log.warning("rank %d: master %d's group failed (%s): it shrinks",
                            world_rank, index, failure)
                began = SYSTEM_CLOCK.monotonic()
                revoke(group.comm)
                comm, gathered, _ = shrink(group.comm, (world_rank, host.endpoint()),
                                           errhandler=MPI.ERRORS_RETURN)
                group = Channel(comm)
                if gathered[0][0] == master_was[0]:  # it lives: it took the first one's place
                    log.warning("rank %d: master %d (rank %d) serves as the first master now",
                                world_rank, index, master_was[0])
                    continue
                deaths.append(Death(describe_process(master_was[1], master_was[0]), detected,
                                    SYSTEM_CLOCK.monotonic() - began))
                if group.rank != 0:
                    continue
                worker.close()
                worker = None
                return _succeed(group, federation_comm, config, index=index, layout=layout,
                                epoch=epoch, gathered=gathered, deaths=deaths, host=host)
    finally:
        if worker is not None:
            worker.close()
        flush(group, world_rank)


def _heir(federation_comm, config: CampaignConfig, layout: list[range], epoch: bytes,
          world_rank: int, host: Host):
    """What a master runs if it turns out the heir (`_run_to_the_end`)."""
    return functools.partial(_take_the_first_masters_place, federation_comm, config,
                             layout=layout, epoch=epoch, world_rank=world_rank, host=host)


def _take_the_first_masters_place(federation_comm, config: CampaignConfig, group: Channel,
                                  index: int, detected: float, *, layout: list[range],
                                  epoch: bytes, world_rank: int, host: Host = MACHINE) -> int:
    """Master `index`, the heir of the first master whose group died whole, has handed its
    work over (Master.hand_over): its group's communicator is revoked and shrunk, so that
    its workers serve it in a new generation (their packs of its dispatches are removed, as
    a successor removes a dead master's), and it takes the first master's place as a worker
    taking a dead master's place does (`_succeed`), its own index left."""
    from mpi4py import MPI

    began = SYSTEM_CLOCK.monotonic()
    revoke(group.comm)
    comm, gathered, _ = shrink(group.comm, (world_rank, host.endpoint()),
                               errhandler=MPI.ERRORS_RETURN)
    left = CampaignDir(config.out, master=index)
    records, _ = left.inspect_journal()
    left.clear_staging({r["token"] for r in records if kind_of(r) is Kind.DISPATCH})
    first = layout[0]
    death = Death(f"ranks {first.start}-{first.stop - 1} (the first master's whole group)",
                  detected, SYSTEM_CLOCK.monotonic() - began)
    return _succeed(Channel(comm), federation_comm, config, index=0, layout=layout,
                    epoch=epoch, gathered=gathered, deaths=[death], host=host, left=index)


def _succeed(group: Channel, federation_comm, config: CampaignConfig, *, index: int,
             layout: list[range], epoch: bytes, gathered: list, deaths: list[Death],
             host: Host = MACHINE, left: int | None = None) -> int:
    """This worker is master `index` now (`_serve_or_succeed`); or master `left`, whose
    group took the first master's place (`_take_the_first_masters_place`)."""
    world_ranks = tuple(world for world, _ in gathered)
    log.warning("rank %d: taking master %d's place", world_ranks[0], index)
    federation = Federation(Channel(federation_comm), index=index, masters=config.masters,
                            out=config.out, epoch=epoch, world_ranks=layout,
                            execution_timeout=config.timeout)
    federation.roster.world_of[index] = world_ranks[0]
    federation.locate(federation.channel.failed_ranks())
    inherited = None
    # The first master hears of it first: what the takeover hands it (the findings of
    # commits it redoes) comes from this world rank. A new first master tells the others.
    if index == 0:
        inherited = federation.inherit_root()
        if left is not None:  # it said farewell on record (inherit_root read it)
            federation.roster.dead.add(left)
            federation.coordinator.leave(left)
        federation.announce_root(Successor(0, deaths, decided=inherited.decided))
    else:
        federation.announce(Successor(index, deaths))
    status, master = open_or_refuse(group, replace(config, resume=True),
                                    federation=federation, fault_tolerant=True,
                                    taking_over=True, host=host)
    if master is None:
        return status
    master.outlives_ranks = True
    master.members = tuple(endpoint for _, endpoint in gathered)
    master.ranks.world_ranks = world_ranks
    federation.open()
    taken = federation.take_over(master.frontier)
    if master.faults.fire_at(FaultKind.DIE, "recovery", len(deaths)):
        die(f"fault: SIGKILL of rank {world_ranks[0]} inside its takeover of master {index}")
    if inherited is not None:
        if inherited.start_time is not None:  # the reports' run time is the campaign's
            master.stats.start_time = inherited.start_time
        if inherited.budget_start is not None:  # the budget is the campaign's, not its own
            master.stopping.budget_start = inherited.budget_start
        if inherited.ending:
            master.stopping.begin(inherited.ending)
    else:
        for finding in master.campaign.findings_to_forward():
            federation.forward(finding)
    if left is not None:  # what it handed the dead first master may not be named
        for finding in CampaignDir(config.out, master=left).findings_to_forward():
            federation.name_finding(master.campaign, finding)
    last = deaths[-1]
    # What the dead master had out goes out again: on record as taken back (F443).
    master.records.recovered(master.generation, [last.failed], master.in_flight_at_takeover,
                             "new", last.seconds)
    master.recovery.count(f"master {index}", [last.failed], taken, last.seconds,
                          detected=last.detected, master="new")
    try:  # the heir of a first master whose group dies whole, as its predecessor was
        return _run_to_the_end(master, federation,
                               _heir(federation_comm, config, layout, epoch, world_ranks[0],
                                     host))
    finally:
        flush(federation.channel, world_ranks[0])
