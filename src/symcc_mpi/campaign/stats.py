"""The master's figures of a campaign: per run, per worker, per recovery; the reports read them."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.wire.protocol import PHASES


@dataclass
class WorkerStats:
    executions: int = 0
    executor_time: float = 0.0
    host: str = ""
    fatal: str = ""


@dataclass
class MasterStats:
    start_time: float = field(default_factory=SYSTEM_CLOCK.time)
    executions: int = 0
    generated: int = 0
    unique: int = 0
    interesting: int = 0
    crashes: int = 0
    hangs: int = 0
    crashing_runs: int = 0
    hanging_runs: int = 0
    first_crash_seconds: float | None = None  # campaign time to the first crash
    startup_seconds: float | None = None  # from the command (or this rank) to the first WORK
    executor_errors: int = 0
    # Per reason (commit.py): {"count": runs, "example": the first input's SHA-256}
    executor_failures: dict[str, dict] = field(default_factory=dict)
    executor_time: float = 0.0
    solver_time: float = 0.0
    solver_queries: int = 0
    queries_skipped: int = 0
    runs_without_counts: int = 0  # runs whose skipped queries are unknown
    malformed_messages: int = 0
    invalid_results: Counter[str] = field(default_factory=Counter)  # per ResultField value
    staging_rejected: int = 0
    last_find: float = 0.0
    last_crash: float = 0.0
    last_hang: float = 0.0
    resumed_done: int = 0
    max_depth: int = 1
    stop_reason: str = ""
    per_worker: dict[int, WorkerStats] = field(default_factory=dict)
    failures: list[dict] = field(default_factory=list)  # one per recovery (ulfm/)
    redone_commits: int = 0  # commits of a dead master finished from their manifests
    # Worker time per phase (protocol.TaskPhases), summed over the committed results.
    phases: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
