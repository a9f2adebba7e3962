"""The ranks a master works with: its communicator of this ULFM generation, and what it knows
of each worker rank on it (acknowledged STOP, dead, rings the doorbell, its last WORK)."""

from __future__ import annotations

from dataclasses import dataclass, field

from symcc_mpi.wire.transport import Channel


@dataclass
class Ranks:
    channel: Channel
    # Under ULFM (ulfm/): the endpoint of each rank of `channel`'s communicator.
    members: tuple[str, ...] = ()
    # With several masters: the rank in MPI_COMM_WORLD of each rank of `channel`'s.
    world_ranks: tuple[int, ...] = ()
    workers: list[int] = field(init=False)
    acked: set[int] = field(default_factory=set)  # STOP_ACK received, or none will come
    failed: set[int] = field(default_factory=set)  # dead (several masters under ULFM)
    ringing: set[int] = field(default_factory=set)  # ring the doorbell after each send
    # Per rank, the tokens of the last two WORKs sent: a worker removes a dispatch's staging
    # after it asks for work once more, so a dead one may leave both behind.
    recent_work: dict[int, tuple[str, ...]] = field(default_factory=dict)
    next_failure_check: float = 0.0  # when to ask MPI for dead ranks next (FAILURE_POLL)

    def __post_init__(self) -> None:
        self.workers = list(range(1, self.channel.size))

    def renew(self, channel: Channel, members: tuple[str, ...]) -> None:
        """A new generation's communicator: its ranks are numbered anew."""
        self.channel.abandon_sends()
        self.channel = channel
        self.members = members
        self.workers = list(range(1, channel.size))
        self.acked.clear()
        self.ringing.clear()
        self.next_failure_check = 0.0

    def world_rank(self, rank: int) -> int:
        return self.world_ranks[rank] if rank < len(self.world_ranks) else rank

    def all_ring(self, retired: set[int]) -> bool:
        """Whether every worker still working rings the doorbell after its sends."""
        return all(rank in self.ringing or rank in retired for rank in self.workers)
