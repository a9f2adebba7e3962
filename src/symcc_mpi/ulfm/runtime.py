"""Generations of the job's communicator, and the repair that makes the next one (F443 §4).

A `Generation` is a communicator and the endpoints of its ranks, numbered in the campaign's
generation log (durable/generations.py). When an MPI call of a generation reports a dead rank
or a revoked communicator (transport.RankFailure), every survivor calls `recover`:

    Revoke -> durable prepare(g) -> Shrink -> endpoint attestation -> Agree
        -> durable commit(g+1) -> the repaired communicator's rank 0 is the master

A failure during the repair itself (a rank dies after the shrink) makes the agreement fail
on every survivor alike (MPI_Comm_agree's outcome is uniform), and they shrink again under
the same plan. Nothing here knows what the ranks were doing: the roles resume their work on
the new generation (roles/master.py, roles/worker.py).
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.ulfm.generations import GenerationLog, GenerationLogError, digest_of
from symcc_mpi.wire.transport import RankFailure, failures_raised

log = logging.getLogger("symcc_mpi.ulfm")

MAX_REPAIRS = 64  # shrinks within one recovery; past it the job is failing faster than it heals


@dataclass
class Generation:
    number: int
    comm: Any  # MPI.Intracomm, or a fake one in tests
    members: tuple[str, ...]  # the endpoint of each rank, in rank order

    @property
    def rank(self) -> int:
        return self.comm.Get_rank()


@dataclass(frozen=True)
class Repair:
    """What a recovery did, as the survivors agreed it."""

    previous: int
    failed: tuple[str, ...]  # endpoints of the previous generation that are gone
    shrinks: int  # >1: ranks died during the recovery itself
    seconds: float


def endpoint() -> str:
    """This process, as no other process past or present: host, pid, and the pid's start."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            started = stat.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        started = "0"
    return f"{socket.gethostname()}/{os.getpid()}/{started}"


def describe_endpoint(name: str, members: tuple[str, ...], generation: int) -> str:
    """A failed process as a user knows it: its rank in its generation, its pid and host."""
    rank = members.index(name) if name in members else "?"
    return f"{describe_process(name, rank)} of generation {generation}"


def describe_process(name: str, rank: int | str) -> str:
    """The process of endpoint `name` (endpoint()), at `rank`, with its pid and host."""
    host, _, rest = name.partition("/")
    return f"rank {rank} (pid {rest.split('/')[0]} on {host})"


def recover(generation: Generation, generations: GenerationLog | None, *,
            errhandler=None) -> tuple[Generation, Repair]:
    """Every survivor of `generation` calls this; all return the same next generation.
    Raises GenerationLogError when the log refuses (a fork): the caller must abort.
    `generations` None: this rank does not see OUT (a worker on a node without it), and the
    survivors that do keep the log; it takes part in the repair alone."""
    began = SYSTEM_CLOCK.monotonic()
    me = generation.members[generation.rank]  # this process's endpoint(), as all ranks saw it
    revoke(generation.comm)
    plan = {"generation": generation.number, "members": list(generation.members)}
    if generations is not None:
        _reconciled(generations.prepare, plan)
    try:
        comm, members, shrinks = shrink(generation.comm, me, errhandler=errhandler)
    except RepairFailing as failing:
        raise GenerationLogError(f"generation {generation.number}: {failing}") from None
    strangers = sorted(set(members) - set(generation.members))
    if strangers:
        raise GenerationLogError(f"ranks {strangers} were not members of generation "
                                 f"{generation.number}")
    failed = tuple(m for m in generation.members if m not in members)
    receipt = {"generation": generation.number + 1, "plan": digest_of(plan),
               "members": members, "failed": list(failed)}
    if generations is not None:
        _reconciled(generations.commit, receipt)
    repaired = Generation(generation.number + 1, comm, tuple(members))
    return repaired, Repair(generation.number, failed, shrinks, SYSTEM_CLOCK.monotonic() - began)


class RepairFailing(Exception):
    """Ranks kept failing through MAX_REPAIRS shrinks."""


def shrink(comm, me: Any, *, errhandler=None) -> tuple[Any, list, int]:
    """Every survivor of revoked `comm` calls this with what the others should know of it
    (`me`): the communicator of the survivors, what each said in rank order, and how many
    shrinks it took. A failure during the shrink itself makes the agreement fail on every
    survivor alike (MPI_Comm_agree's outcome is uniform), and they shrink again."""
    shrinks = 0
    while True:
        shrinks += 1
        if shrinks > MAX_REPAIRS:
            raise RepairFailing(f"ranks kept failing through {MAX_REPAIRS} repairs")
        comm = comm.Shrink()
        if errhandler is not None:
            comm.Set_errhandler(errhandler)
        agreed = 1
        try:
            with failures_raised():
                members = comm.allgather(me)
        except RankFailure:
            agreed, members = 0, []
        try:
            with failures_raised():
                agreed = comm.Agree(agreed)
        except RankFailure:
            agreed = 0
        if agreed:
            return comm, members, shrinks
        log.warning("a rank failed during a repair: shrinking again")


def _reconciled(write, document: dict[str, Any]):
    """Write a plan or receipt to the log, asking once more when the write raised: the error
    may have come after the append reached the file (F443 §5, a commit whose outcome is
    unknown), and under the log's lock the second request is answered from that record, or
    appends it. A second error is the storage's: the caller ends the job."""
    try:
        return write(document)
    except OSError as error:
        log.warning("generation log: %s: asking again", error)
        return write(document)


def revoke(comm) -> None:
    """Revoke `comm` so that every survivor blocked or polling on it learns of the failure;
    revoking twice (another survivor was first) is harmless."""
    try:
        with failures_raised():
            comm.Revoke()
    except RankFailure:
        pass
