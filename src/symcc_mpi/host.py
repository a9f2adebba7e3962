"""What a rank takes from the machine it runs on, in one place: its MPI world, its name as an
endpoint, whether fault tolerance is on, the master's doorbell, a worker's ringer and
executor, and MPI_Finalize. A rank of a real job uses the machine's (`Host()`); the
deterministic simulation (tests/simulation) runs the same session code on its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _endpoint() -> str:
    from .ulfm.runtime import endpoint

    return endpoint()


def _decide(comm, config):
    from .ulfm.capability import FaultTolerance, decide

    return decide(comm, FaultTolerance(config.fault_tolerance))


def _doorbell():
    from .doorbell import Doorbell

    return Doorbell()


def _ringer(address: str):
    from .doorbell import Ringer

    return Ringer(address)


def _executor(config, *, scratch: Path, coverage_map: Path | None = None):
    from .executors import make_executor

    return make_executor(config, scratch=scratch, coverage_map=coverage_map)


def _finalize(seconds: int) -> None:
    from .session import finalize_within

    finalize_within(seconds)


@dataclass(frozen=True)
class Host:
    world: Callable[[], Any] = _world  # MPI_COMM_WORLD
    endpoint: Callable[[], str] = _endpoint  # this process, as no other past or present
    decide_fault_tolerance: Callable[[Any, Any], Any] = _decide  # collective over the world
    doorbell: Callable[[], Any] = _doorbell  # the master's (doorbell.Doorbell)
    ringer: Callable[[str], Any] = _ringer  # a worker's, for the master's doorbell address
    executor: Callable[..., Any] = _executor  # a worker's (executors.make_executor)
    finalize: Callable[[int], None] = _finalize  # MPI_Finalize within that many seconds


MACHINE = Host()
