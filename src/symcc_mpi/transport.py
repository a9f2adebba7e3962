"""Raw-bytes MPI messaging: typed envelopes out, strictly decoded envelopes in.

Waiting polls with `Iprobe` and a bounded, growing sleep: Open MPI's blocking receive spins
a core, and on a machine with as many workers as cores a spinning master or idle worker
takes CPU from the executors (DESIGN §8). Sends are non-blocking for the same reason: a
blocking `Send` of more than a few hundred bytes spins until the receiver, napping between
probes, takes it (measured with Open MPI 5.0.11's sm BTL: 2.7 ms of CPU per 500-byte send,
against 0.04 ms posted with `Isend` and completed by later probes). MPI keeps the order of
one sender's messages to one receiver either way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import msgspec
from mpi4py import MPI

from .protocol import MalformedMessage, Tag, decode, encode

MIN_NAP = 0.00005
MAX_NAP = 0.002
NAP_GROWTH = 1.25  # slow growth: naps stay short for a while after any activity


@dataclass(frozen=True)
class Incoming:
    source: int
    tag: int
    message: msgspec.Struct | None  # None when the bytes were malformed
    error: str = ""


class Channel:
    def __init__(self, comm: MPI.Comm, *, max_nap: float = MAX_NAP):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.max_nap = max_nap
        self._status = MPI.Status()
        self._sending: list[tuple[MPI.Request, bytes]] = []  # the buffer outlives the send

    def send(self, dest: int, tag: Tag, message: msgspec.Struct) -> None:
        payload = encode(message)
        request = self.comm.Isend([payload, MPI.BYTE], dest=dest, tag=int(tag))
        if not request.Test():
            self._sending.append((request, payload))

    def _progress_sends(self) -> None:
        if self._sending:
            self._sending = [(r, p) for r, p in self._sending if not r.Test()]

    def flush(self, timeout: float) -> bool:
        """Complete the sends still in flight; False if they did not within `timeout`."""
        deadline = time.monotonic() + timeout
        nap = MIN_NAP
        while self._sending:
            self._progress_sends()
            if time.monotonic() >= deadline:
                return not self._sending
            time.sleep(nap)
            nap = min(nap * NAP_GROWTH, self.max_nap)
        return True

    def poll(self) -> Incoming | None:
        """Receive one pending message from anyone, if there is one."""
        self._progress_sends()
        if not self.comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, self._status):
            return None
        source, tag = self._status.Get_source(), self._status.Get_tag()
        buffer = bytearray(self._status.Get_count(MPI.BYTE))
        self.comm.Recv([buffer, MPI.BYTE], source=source, tag=tag)
        try:
            return Incoming(source, tag, decode(tag, bytes(buffer)))
        except MalformedMessage as error:
            return Incoming(source, tag, None, str(error))

    def wait(self, deadline: float | None = None) -> Incoming | None:
        """Poll until a message arrives or the monotonic deadline passes."""
        nap = MIN_NAP
        while True:
            incoming = self.poll()
            if incoming is not None:
                return incoming
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(nap)
            nap = min(nap * NAP_GROWTH, self.max_nap)
