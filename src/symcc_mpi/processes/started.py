"""When the user's command started: the launcher's clock, else this process's start (/proc)."""

from __future__ import annotations

import os

from symcc_mpi.durable.clock import SYSTEM_CLOCK

COMMAND_TIME_ENV = "SYMCC_MPI_COMMAND_TIME"  # set by the launcher (launch.py)


def command_time() -> float:
    """When the user's command started: the launcher's clock, else this process's start."""
    try:
        return float(os.environ[COMMAND_TIME_ENV])
    except (KeyError, ValueError):
        pass
    try:  # under the user's own launcher: this rank's start, from /proc
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            age = float(uptime.read().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK")
        return SYSTEM_CLOCK.time() - age
    except (OSError, ValueError, IndexError):
        return SYSTEM_CLOCK.time()
