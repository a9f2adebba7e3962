"""The master's own time, for benchmarks and its naps: per task (the hand-off and the handling
of its RESULT), each WORK's round trip, and its loop's CPU."""

from __future__ import annotations

import statistics
from collections import deque

from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.wire.transport import Naps


class TaskTimes:
    def __init__(self) -> None:
        # Per token in flight: when its WORK went out, and the master time that took.
        self.sends: dict[str, tuple[float, float]] = {}
        self.mark = 0.0  # the previous send, or the round's first dispatch
        self.task_seconds: deque[float] = deque(maxlen=100_000)
        self.loop_cpu_start = 0.0
        self.loop_started = SYSTEM_CLOCK.monotonic()

    def loop_starts(self) -> None:
        if not self.loop_cpu_start:  # the figures span every generation this master serves
            self.loop_cpu_start = SYSTEM_CLOCK.process_time()
            self.loop_started = SYSTEM_CLOCK.monotonic()

    def dispatch_starts(self) -> None:
        self.mark = SYSTEM_CLOCK.monotonic()

    def sent(self, token: str) -> None:
        """A dispatch's master time runs from the previous send (or the round's first) to its
        own: reading the input, the transaction, the send."""
        now = SYSTEM_CLOCK.monotonic()
        self.sends[token] = (now, now - self.mark)
        self.mark = now

    def handled(self, token: str, started: float, naps: Naps) -> None:
        """The RESULT of `token`, received at `started`, is handled."""
        sent = self.sends.pop(token, None)
        if sent is not None:
            sent_at, sending = sent
            naps.observe_round_trip(started - sent_at)
            self.task_seconds.append(sending + SYSTEM_CLOCK.monotonic() - started)

    def summary(self) -> dict:
        samples = list(self.task_seconds)
        if not samples:
            return {"tasks": 0}
        samples.sort()
        return {"tasks": len(samples), "median_ms": statistics.median(samples) * 1e3,
                "p90_ms": samples[int(len(samples) * 0.9)] * 1e3,
                "mean_ms": statistics.fmean(samples) * 1e3}
