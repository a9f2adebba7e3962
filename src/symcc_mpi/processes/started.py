"""When the user's command started: the launcher's clock, else this process's start (/proc)."""

from __future__ import annotations

import os

from symcc_mpi.config import launch_environment
from symcc_mpi.durable.clock import SYSTEM_CLOCK


def command_time() -> float:
    """When the user's command started: the launcher's clock, else this process's start."""
    started = launch_environment().command_time
    if started is not None:
        return started
    try:  # under the user's own launcher: this rank's start, from /proc
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            age = float(uptime.read().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK")
        return SYSTEM_CLOCK.time() - age
    except (OSError, ValueError, IndexError):
        return SYSTEM_CLOCK.time()
