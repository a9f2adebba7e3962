"""What a rank takes from the machine it runs on, in one place: its MPI world, its name as an
endpoint, whether fault tolerance is on, the master's doorbell, a worker's ringer and
executor, the coverage probe, and MPI_Finalize. A rank of a real job uses the machine's
(`Host()`); the deterministic simulation (tests/simulation) runs the same session code on
its own."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _endpoint() -> str:
    from symcc_mpi.ulfm.runtime import endpoint

    return endpoint()


def _decide(comm, config):
    from symcc_mpi.ulfm.capability import FaultTolerance, decide

    return decide(comm, FaultTolerance(config.fault_tolerance))


def _doorbell():
    from symcc_mpi.wire.doorbell import Doorbell

    return Doorbell()


def _ringer(address: str):
    from symcc_mpi.wire.doorbell import Ringer

    return Ringer(address)


def _executor(config, *, scratch: Path, coverage_map: Path | None = None):
    from symcc_mpi.executors import make_executor

    return make_executor(config, scratch=scratch, coverage_map=coverage_map)


def _probe(config, scratch: Path | None):
    from symcc_mpi.coverage.forkserver import ForkserverProbe

    return ForkserverProbe(list(config.afl_target), timeout=config.timeout,
                           memory_limit_mb=config.memory_limit_mb, scratch_dir=scratch)


def finalize_within(seconds: int) -> None:
    """MPI_Finalize, bounded: after ranks died, survivors can wait in it for ever (DESIGN §8,
    ompi#11404; seen here). Everything is committed and reported by now. mpi4py holds the
    GIL inside Finalize, so no Python thread could end the wait: SIGALRM, whose default
    action the kernel carries out, ends the rank instead (its campaign's verdict is in
    stats.json, which our launcher reports)."""
    from mpi4py import MPI

    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(seconds)
    MPI.Finalize()
    signal.alarm(0)


@dataclass(frozen=True)
class Host:
    world: Callable[[], Any] = _world  # MPI_COMM_WORLD
    endpoint: Callable[[], str] = _endpoint  # this process, as no other past or present
    decide_fault_tolerance: Callable[[Any, Any], Any] = _decide  # collective over the world
    doorbell: Callable[[], Any] = _doorbell  # the master's (doorbell.Doorbell)
    ringer: Callable[[str], Any] = _ringer  # a worker's, for the master's doorbell address
    executor: Callable[..., Any] = _executor  # a worker's (executors.make_executor)
    # The coverage probe of --afl-target (forkserver.ForkserverProbe): a worker's, for its
    # children; a master's, to replay coverage on resume and to triage imports
    probe: Callable[[Any, Path | None], Any] = _probe
    finalize: Callable[[int], None] = finalize_within  # MPI_Finalize within that many seconds


MACHINE = Host()
