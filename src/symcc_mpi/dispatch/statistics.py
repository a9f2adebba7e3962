"""The dispatch coordinator's figures, as stats.json's `extra.dispatch` shows them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DispatchStatistics:
    """The dispatch's figures (stats.json `extra.dispatch`)."""

    watchdog_seconds: float
    watchdog_timeouts: int
    worker_recoveries: int
    protocol_requeued: int
    protocol_deferred: int
    deferred_in_memory: int
    recoveries_by_source: dict[str, int]
    invalid_results: int
    commit_failures: int
    invalid_joins: int
    stale_results: int
    stale_ready: int
    ready_quarantined: int
    parked: list[int]
    retired: list[int]
    retired_for_invalid_results: list[int]
    send_failures: int
    unreadable_inputs: int
    dispatched: int
    inputs_dispatched_again: int
    committed: int
    fenced: int
    rolled_back_before_send: int
    rolled_back_after_send: int
    compensation_failures: int
    preparing: int
    active: int
    committing: int
    objects_shipped: int
    object_bytes_shipped: int
    object_hits: int
