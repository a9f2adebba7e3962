"""A master across ULFM generations (ulfm/): a new communicator after a repair, a recovery on
record and in the figures, and (several masters) a dead worker retired from its group."""

from __future__ import annotations

import logging
from collections.abc import Callable

from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.stats import MasterStats, WorkerStats
from symcc_mpi.dispatch.coordinator import DispatchCoordinator
from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.roles.ranks import Ranks
from symcc_mpi.roles.records import WorkRecords
from symcc_mpi.roles.sending import WorkSender
from symcc_mpi.roles.stopping import Phase, Stopping
from symcc_mpi.roles.timing import TaskTimes
from symcc_mpi.ulfm.runtime import describe_endpoint, describe_process
from symcc_mpi.wire.transport import Channel, RankFailure

log = logging.getLogger("symcc_mpi.master")


class Recovery:
    def __init__(self, ranks: Ranks, dispatch: DispatchCoordinator, campaign: CampaignDir,
                 records: WorkRecords, stats: MasterStats, stopping: Stopping,
                 sender: WorkSender, times: TaskTimes, *, count_doorbells: Callable[[], object],
                 report_now: Callable[[], object]):
        self.ranks = ranks
        self.dispatch = dispatch
        self.campaign = campaign
        self.records = records
        self.stats = stats
        self.stopping = stopping
        self.sender = sender
        self.times = times
        self.count_doorbells = count_doorbells
        self.report_now = report_now

    def begin_generation(self, channel: Channel, generation: int, members: tuple[str, ...],
                         repair, *, detected: float) -> None:
        """Go on with the repaired communicator `channel` (`repair`: ulfm.runtime.Repair):
        every dispatch of the old one is taken back (the failed ranks' first), their staging
        discarded, the ranks renumbered by their endpoints."""
        ranks = self.ranks
        old_rank = {endpoint: rank for rank, endpoint in enumerate(ranks.members)}
        failed = {old_rank[e] for e in repair.failed if e in old_rank}
        renumbered = {rank: old_rank.get(endpoint) for rank, endpoint in enumerate(members)}
        retired = {new for new, old in renumbered.items() if old in self.dispatch.retired}
        gone = [describe_endpoint(endpoint, ranks.members, self.dispatch.generation)
                for endpoint in repair.failed]
        requeued = self.dispatch.begin_generation(generation, failed, retired - {0})
        self.campaign.clear_staging()  # nobody writes it any more
        per_worker = self.stats.per_worker
        self.stats.per_worker = {new: per_worker.get(old, WorkerStats())
                                 for new, old in renumbered.items() if new != 0}
        ranks.renew(channel, members)
        self.dispatch.workers = len(ranks.workers)
        self.times.sends.clear()
        self.count_doorbells()
        self.note(generation, gone, requeued, repair.seconds, detected=detected,
                  shrinks=repair.shrinks)
        if not ranks.workers:
            self.stopping.begin("no usable worker: every worker rank died")

    def note(self, generation: int, failed: list[str], requeued: list[str], seconds: float,
             *, detected: float | None, shrinks: int = 1, master: str = "kept") -> None:
        """Record a recovery in the journal and the figures, and say it in one line."""
        self.records.recovered(generation, failed, requeued, master, seconds)
        self.count(f"generation {generation}", failed, len(requeued), seconds,
                   detected=detected, shrinks=shrinks, master=master, generation=generation)

    def count(self, where: str, failed: list[str], requeued: int, seconds: float, *,
              detected: float | None, shrinks: int = 1, master: str = "kept",
              generation: int | None = None) -> None:
        """A failure survived, in the figures and in one line. `generation`: the one it led
        to (ulfm/); None with several masters, whose groups are not repaired."""
        self.stats.failures.append({
            "generation": generation, "failed": failed, "requeued": requeued,
            "master": master, "shrinks": shrinks, "recovery_seconds": round(seconds, 3),
            "detected": detected, "first_dispatch": None})
        if self.sender.since_recovery is None:
            self.sender.since_recovery = 0
        self.report_now()
        log.warning("%s: %s gone, %d inputs in flight requeued, master %s, recovered in "
                    "%.2f s", where, ", ".join(failed) or "no rank", requeued, master, seconds)

    def retire_dead(self, failure: RankFailure) -> None:
        """Ranks of this master's group died (several masters under ULFM). The group's
        communicator is not repaired: its survivors still talk point to point, and a worker
        talks to its master alone. So what the dead held goes back to the frontier, nothing
        more is sent to them, and the campaign goes on with the other workers; a master left
        with none withdraws from the work, or if it cannot, stops the campaign (`--resume`
        continues it)."""
        ranks = self.ranks
        detected = SYSTEM_CLOCK.time()
        dead = sorted(ranks.channel.failed_ranks() - ranks.failed)
        if not dead:
            raise failure  # not a dead peer (a revoked communicator): nothing to go on with
        ranks.failed.update(dead)
        gone = [describe_process(ranks.members[rank], ranks.world_rank(rank))
                if rank < len(ranks.members) else f"rank {ranks.world_rank(rank)}"
                for rank in dead]
        requeued = []
        for rank, name in zip(dead, gone, strict=True):
            for token in self.dispatch.retire(rank, f"it died: {name}"):
                requeued.append(token)
                self.campaign.discard_staging(token)
            for token in ranks.recent_work.pop(rank, ()):
                self.campaign.discard_staging(token)
            ranks.acked.add(rank)  # no STOP_ACK will come
        alive = [rank for rank in ranks.workers if rank not in ranks.failed]
        if self.stopping.phase is Phase.STOPPING:
            self.stopping.send_stops()  # those the failure interrupted; a second STOP is ignored
        if self.stopping.phase is not Phase.RUNNING:
            return
        if not alive:
            self.stopping.if_no_worker_left(f"a worker died ({', '.join(gone)}) and no other "
                                            "is left: continue with --resume", failure=True)
            if self.stopping.phase is not Phase.RUNNING:
                return
        self.count(f"{len(alive)} worker{'' if len(alive) == 1 else 's'} left", gone,
                   len(requeued), 0.0, detected=detected, shrinks=0,
                   master="kept" if alive else "withdrawn")
