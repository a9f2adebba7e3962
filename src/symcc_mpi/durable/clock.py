"""The one clock: nothing in src/ reads time but through this module. Dispatch deadlines,
journal timestamps, work leases and lock waits take an injected Clock, so tests move it.

SYSTEM_CLOCK is the process's clock, which every loop reads and naps on: the system's, unless
the deterministic simulation (tests/simulation) points its `source` at virtual time."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock Unix seconds, comparable across hosts: journal stamps, work-lease expiry."""

    def monotonic(self) -> float:
        """This process's monotonic seconds: for waits and deadlines."""


class SystemClock:
    def __init__(self) -> None:
        self.source = time  # anything with time(), monotonic() and sleep()

    def time(self) -> float:
        return self.source.time()

    def monotonic(self) -> float:
        return self.source.monotonic()

    def sleep(self, seconds: float) -> None:
        self.source.sleep(seconds)

    @staticmethod
    def time_ns() -> int:
        """Wall-clock Unix nanoseconds of the host, never simulated: for names that must not
        repeat within a host."""
        return time.time_ns()

    @staticmethod
    def process_time() -> float:
        """CPU seconds this process has used: measured, never simulated."""
        return time.process_time()


class ManualClock:
    """A clock that only moves when told to."""

    def __init__(self, start: float = 1_000_000.0):
        self.now = start
        self.mono = 0.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.mono += seconds


SYSTEM_CLOCK = SystemClock()
