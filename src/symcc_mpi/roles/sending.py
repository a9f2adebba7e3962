"""The master's WORK send, which the dispatch coordinator calls inside each dispatch's
transaction (F313): the dispatch record first (F443), the send, the master's fault hooks
around it (faults.py), then what a send means to the tiers, the figures and the task times."""

from __future__ import annotations

import logging
from collections.abc import Callable

from symcc_mpi.campaign.stats import MasterStats
from symcc_mpi.dispatch.coordinator import DispatchCoordinator
from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.processes.started import command_time
from symcc_mpi.roles.faults import FaultKind, Faults, die, hold_until_released, stop_self
from symcc_mpi.roles.ranks import Ranks
from symcc_mpi.roles.records import WorkRecords
from symcc_mpi.roles.timing import TaskTimes
from symcc_mpi.wire.protocol import Tag, Work

log = logging.getLogger("symcc_mpi.master")


class WorkSender:
    def __init__(self, ranks: Ranks, dispatch: DispatchCoordinator, records: WorkRecords,
                 faults: Faults, stats: MasterStats, times: TaskTimes, *, frontier, lower,
                 report_now: Callable[[], object]):
        self.ranks = ranks
        self.dispatch = dispatch
        self.records = records
        self.faults = faults
        self.stats = stats
        self.times = times
        self.frontier = frontier
        self.lower = lower  # tiers.lower.LowerTiers, or None
        self.report_now = report_now
        self.work_sends = 0
        self.object_sends = 0
        self.since_recovery: int | None = None  # sends counted from the first recovery (faults)

    def send(self, rank: int, work: Work) -> None:
        faults = self.faults
        self.work_sends += 1
        self.object_sends += bool(work.objects)
        if faults.fire(FaultKind.SEND_FAIL, self.work_sends) or (
                work.objects and faults.fire(FaultKind.OBJECT_SEND_FAIL, self.object_sends)):
            raise OSError(f"injected failure of WORK send #{self.work_sends} to rank {rank}")
        work_id = self.dispatch.work_of(rank, preparing=True)  # a part's: "<digest>#<n>"
        self.records.dispatch(work, work_id, rank)
        try:
            self.ranks.channel.send(rank, Tag.WORK, work)
            self._after_send(rank)
        except BaseException:
            # Undone as unsent (dispatch/coordinator.py): the input goes out again, and the
            # journal says why before its next dispatch record.
            self.records.requeue(work_id, "its send failed")
            raise
        if self.lower is not None:
            self.lower.schedule.dispatched(self.frontier.tier_of(work.digest))
        if self.stats.startup_seconds is None:
            self.stats.startup_seconds = SYSTEM_CLOCK.time() - command_time()
        if self.stats.failures and self.stats.failures[-1]["first_dispatch"] is None:
            self.stats.failures[-1]["first_dispatch"] = SYSTEM_CLOCK.time()
            self.report_now()
        self.times.sent(work.token)
        self.ranks.recent_work[rank] = (*self.ranks.recent_work.get(rank, ())[-1:], work.token)

    def _after_send(self, rank: int) -> None:
        """The faults planned after a WORK send (faults.py)."""
        faults, number = self.faults, self.work_sends
        if faults.fire(FaultKind.DIE, number):
            die(f"fault: SIGKILL of the master after WORK send #{number}")
        if self.since_recovery is not None:
            self.since_recovery += 1
            if faults.fire_at(FaultKind.DIE, "after-recovery", self.since_recovery):
                die("fault: SIGKILL of the master after WORK send "
                    f"#{self.since_recovery} since its first recovery")
        if faults.paused_until_released(number):
            log.warning("fault: master held after WORK send #%d until released", number)
            hold_until_released(self.records.campaign.out, faults.rank)
        elif faults.fire(FaultKind.PAUSE, number):
            log.warning("fault: SIGSTOP of the master after WORK send #%d", number)
            # stop_self's deadline is the process's own clock's, as its helper reads it.
            stop_self(SYSTEM_CLOCK.monotonic() + faults.pause_seconds(number))
        if faults.fire(FaultKind.SEND_AMBIGUOUS, number):
            raise OSError(f"injected: WORK send #{number} to rank {rank} "
                          "delivered, then reported failure")
