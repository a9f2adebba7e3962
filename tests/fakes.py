"""Stand-ins shared by every test tier (unit, property, simulation): the master's channel
without MPI. Time has no fake of its own here: tests move the project's ManualClock
(symcc_mpi.durable.clock), the clock the code itself is written against.

Importable as `fakes` from any test: pyproject.toml puts tests/ on pytest's sys.path, and
`make simulate` runs from tests/."""

from __future__ import annotations

from collections import deque

import msgspec

from symcc_mpi.wire.protocol import StopAck, Tag
from symcc_mpi.wire.transport import Incoming


class LoopbackChannel:
    """`workers` ranks behind rank 0, in place of `wire.transport.Channel`: what is sent is
    recorded in `sent` as (rank, tag, message); `poll` hands out what the test queued in
    `incoming`, in order. A STOP is acknowledged at once, as an idle worker does, so a master
    that drains and stops ends its run; a test that only calls `Master._handle` never polls,
    and those acknowledgements stay queued, unread."""

    def __init__(self, workers: int):
        self.size = workers + 1
        self.sent: list[tuple[int, Tag, msgspec.Struct]] = []
        self.incoming: deque[Incoming] = deque()

    def send(self, rank: int, tag: Tag, message: msgspec.Struct) -> None:
        self.sent.append((rank, tag, message))
        if tag == Tag.STOP:
            self.incoming.append(Incoming(rank, Tag.STOP_ACK, StopAck(0, 0.0)))

    sending = False  # a send here is delivered at once: none stays in flight

    def poll(self) -> Incoming | None:
        return self.incoming.popleft() if self.incoming else None
