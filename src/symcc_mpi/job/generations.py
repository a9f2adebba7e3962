"""One rank's life under ULFM: its role on each generation of the communicator, and the
recovery between two (ulfm/runtime.py); a worker that becomes rank 0 takes the campaign over."""

from __future__ import annotations

import logging
import socket
from dataclasses import replace

from symcc_mpi.config import CampaignConfig
from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.durable.storage import STORAGE_EXIT
from symcc_mpi.job.assembly import open_master, open_or_refuse
from symcc_mpi.job.progress import carry_stats
from symcc_mpi.roles.faults import FaultKind, die
from symcc_mpi.roles.host import MACHINE, Host
from symcc_mpi.roles.worker import Worker
from symcc_mpi.ulfm.generations import GENERATIONS_JOURNAL, GenerationLog, GenerationLogError
from symcc_mpi.ulfm.runtime import Generation, describe_endpoint, recover
from symcc_mpi.wire.transport import Channel, RankFailure, failures_raised

log = logging.getLogger(__name__)


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
        status, master = open_or_refuse(self.channel, self.config, fault_tolerant=True,
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
        sees_out = self.worker is None or self.worker.sees_out
        if sees_out:
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
        # A worker whose node does not see OUT counts generations by its CONFIGs: its number
        # names no record, the survivors that see OUT keep the log, and the next CONFIG
        # fences its work.
        self.recoveries += 1
        if (self.master or self.worker).faults.fire_at(FaultKind.DIE, "recovery", self.recoveries):
            die(f"fault: SIGKILL of rank {generation.rank} inside recovery #{self.recoveries}")
        repaired, repair = recover(generation, self.log if sees_out else None,
                                   errhandler=self.errhandler)
        self.channel = Channel(repaired.comm)
        if self.master is not None:
            self.master.begin_generation(self.channel, repaired.number, repaired.members,
                                         repair, detected=detected)
        elif repaired.rank == 0:
            if not sees_out:
                raise GenerationLogError(
                    f"the master died and the first rank left, on {socket.gethostname()}, "
                    f"does not see --out {self.config.out}: nobody here can take the campaign "
                    "over; continue with --resume")
            self._take_over(repaired, repair, detected)
        return repaired

    def _take_over(self, generation, repair, detected: float) -> None:
        """This worker is rank 0 now: the master died. It rebuilds the campaign from OUT
        alone (open_master, as --resume does: the commits with a manifest and no done
        record are redone, what was in flight is in the frontier again) and carries on."""

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
