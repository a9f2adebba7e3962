"""The dispatch coordinator's view of tiers 2 and 3: what goes out once the interesting
frontier is empty (splitting.WorkSource asks here), and where its bytes are read from."""

from __future__ import annotations

from symcc_mpi.scheduling.frontier import Frontier
from symcc_mpi.scheduling.tiers.pool import AsidePool
from symcc_mpi.scheduling.tiers.schedule import Tier, TierSchedule


class LowerTiers:
    def __init__(self, frontier: Frontier, schedule: TierSchedule, pool: AsidePool | None):
        self.frontier = frontier
        self.schedule = schedule
        self.pool = pool
        self.peeked: tuple[str, Tier] | None = None  # what `peek` offered, until `take`

    def _sizes(self) -> dict:
        return {"pool": len(self.pool) if self.pool is not None else 0,
                "reruns": self.frontier.reruns_pending, "corpus": len(self.frontier.known)}

    def has_work(self) -> bool:
        """Work waits in a lower tier, or will once an epoch begins."""
        return self.schedule.has_work(**self._sizes())

    def epoch_due(self) -> bool:
        """An epoch may begin: the interesting frontier is empty, the lower tiers have
        nothing that may go out (the master also waits for the work in flight)."""
        return not len(self.frontier) and self.schedule.epoch_due(**self._sizes())

    def peek(self) -> str | None:
        """The input that goes out next from a lower tier, if any may now."""
        tier = self.schedule.source(**self._sizes())
        digest = None
        if tier is Tier.ASIDE:
            digest = self.pool.best()
        elif tier is Tier.RERUN:
            digest = self.frontier.next_rerun()
        self.peeked = (digest, tier) if digest is not None else None
        return digest

    def offers(self, digest: str) -> bool:
        return self.peeked is not None and self.peeked[0] == digest

    def take(self, digest: str) -> None:
        """Take the input `peek` offered out of its tier (it goes out now)."""
        offered, tier = self.peeked
        assert offered == digest, (offered, digest)
        self.peeked = None
        if tier is Tier.ASIDE:
            self.pool.take(digest)
        else:
            taken = self.frontier.take_rerun()
            assert taken == digest, (taken, digest)

    def holds(self, digest: str) -> bool:
        """Whether the input's bytes are the aside pool's (not in corpus/)."""
        return self.pool is not None and digest in self.pool

    def read(self, digest: str) -> bytes:
        return self.pool.read(digest)

    def finished(self, digest: str) -> None:
        if self.pool is not None:
            self.pool.finished(digest)
