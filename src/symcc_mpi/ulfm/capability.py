"""Whether this job can survive the death of a rank, decided the same way by every rank.

F443 §3 step 1: every rank calls the ULFM operations for real on COMM_SELF, and all ranks
agree on the digest of the recovery policy. With `--fault-tolerance on` a rank that cannot
recover, or a policy that differs between ranks, ends the job at once with one line and
MPI_Abort(74): never a silent downgrade. With `auto` (the default under the user's own
mpirun or srun) the job runs with recovery when every rank can, and without it otherwise,
and the log says which in its first lines, and why.

The ULFM calls succeed on COMM_SELF in any Open MPI 5 job, but only a job started with
`--with-ft ulfm` keeps running when a rank dies, and only over the ob1 PML (DESIGN §8): the
launch is checked too, from the MCA parameters mpiexec hands its ranks.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass

from symcc_mpi.config import ulfm_launch

ABORT_STATUS = 74  # F443: the job cannot run with the fault tolerance it was asked for
PROTOCOL = "symcc-generation-fenced-ulfm-recovery-v1"
# What every rank must agree on: a rank that would recover differently must not join.
POLICY = {
    "protocol": PROTOCOL,
    "detect": "error classes of data-plane calls + Get_failed polled by the master",
    "repair": "revoke, durable prepare, shrink, endpoint attestation, agree, durable commit",
    "master": "rank 0 of the repaired communicator",
    "replay": "every dispatch in flight at the failure, the failed ranks' first",
    "spares": "none: shrink only",
}
# mpiexec options that make an Open MPI 5 job survive a rank's death (DESIGN §8).
MPIEXEC_OPTIONS = ("--with-ft", "ulfm", "--mca", "pml", "ob1", "--mca", "btl", "tcp,self")


class FaultTolerance(str, enum.Enum):
    ON = "on"
    OFF = "off"
    AUTO = "auto"


def policy_digest() -> str:
    return hashlib.sha256(json.dumps(POLICY, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Decision:
    enabled: bool
    reason: str  # one line, for the log's first lines


def launch_problem(environ: Mapping[str, str] | None = None) -> str | None:
    """Why the way this job was launched cannot survive a dead rank, or None."""
    from mpi4py import MPI

    if "Open MPI" not in MPI.Get_library_version():
        return "recovery is supported with Open MPI's ULFM only"
    launch = ulfm_launch(environ)
    if not launch.fault_tolerant:
        return "mpiexec was not started with --with-ft ulfm"
    if launch.pml != "ob1":
        return "ULFM needs the ob1 PML (--mca pml ob1)"
    return None


def probe_problem() -> str | None:
    """Call every ULFM operation recovery uses on a copy of COMM_SELF: None if all work."""
    from mpi4py import MPI

    comm = None
    try:
        comm = MPI.COMM_SELF.Dup()
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        failed = comm.Get_failed()
        failed.Free()
        comm.Ack_failed()
        if comm.Agree(1) != 1:
            return "MPI_Comm_agree on COMM_SELF did not return its flag"
        shrunk = comm.Shrink()
        shrunk.Free()
        comm.Revoke()
        if not comm.Is_revoked():
            return "MPI_Comm_revoke on COMM_SELF left it usable"
    except (AttributeError, NotImplementedError, MPI.Exception) as error:
        return f"the ULFM probe on COMM_SELF failed: {error}"
    finally:
        if comm is not None:
            comm.Free()
    return None


def decide(comm, requested: FaultTolerance) -> Decision:
    """Collective over `comm`: every rank returns the same decision, or the job is aborted
    (status 74) when `requested` is ON and some rank cannot recover or disagrees."""
    problem = None
    if requested is not FaultTolerance.OFF:
        problem = launch_problem() or probe_problem()
    views = comm.allgather((problem, policy_digest()))
    if requested is FaultTolerance.OFF:
        return Decision(False, "off (--fault-tolerance off): a dead rank ends the job")
    problems = sorted({f"rank {rank}: {p}" for rank, (p, _) in enumerate(views) if p})
    if len({digest for _, digest in views}) > 1:
        problems.append("ranks disagree on the recovery policy (different symcc-mpi versions)")
    if not problems:
        return Decision(True, f"on ({requested.value}): a dead rank is recovered from "
                              f"({PROTOCOL})")
    if requested is FaultTolerance.ON:
        if comm.Get_rank() == 0:
            print(f"symcc-mpi: error: --fault-tolerance on, but {problems[0]}", flush=True)
        comm.Abort(ABORT_STATUS)
    return Decision(False, f"off (auto): {problems[0]}; a dead rank ends the job")
