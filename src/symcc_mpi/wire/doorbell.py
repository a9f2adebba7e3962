"""A doorbell: workers on the master's host wake it when they send, so it need not poll.

MPI offers no wait that neither spins nor polls (DESIGN §8), and every wake-up of a napping
process costs ~50 µs of CPU on these VMs. Each worker that can reach the master's Unix
datagram socket rings it (one byte, never blocking) after it sends, once for a RESULT and
the READY that follows it; a master whose every worker rings sleeps in `select` until a ring
or a long timeout. The bell is only a hint: a lost or late ring costs latency, never a
message, because the master still probes MPI on every wake-up. Workers on other hosts
cannot ring (the socket lives in the master's network namespace), and a master with any
such worker keeps napping on its schedule.
"""

from __future__ import annotations

import os
import secrets
import select
import socket


class Doorbell:
    """The master's side: an abstract-namespace Unix datagram socket, nothing on disk."""

    def __init__(self) -> None:
        self.address = f"\0symcc-mpi-doorbell-{os.getpid()}-{secrets.token_hex(8)}"
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.bind(self.address)
        self._socket.setblocking(False)

    def wait(self, timeout: float) -> bool:
        """Sleep until a ring or `timeout`; True (all pending rings drained) if it rang."""
        readable, _, _ = select.select([self._socket], [], [], timeout)
        return bool(readable) and self.drain()

    def drain(self) -> bool:
        """Take the pending rings without waiting; True if there were any. The master drains
        just before it probes MPI: the rings of the messages that probe finds then cannot
        wake it again, for nothing, after a round that handled them."""
        rang = False
        try:
            while True:
                self._socket.recv(64)
                rang = True
        except BlockingIOError:
            pass
        return rang

    def close(self) -> None:
        self._socket.close()


class Ringer:
    """A worker's side. `reachable` says whether the bell answered the first ring."""

    def __init__(self, address: str) -> None:
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.setblocking(False)
        self.address = address
        self.reachable = bool(address) and self._send()

    def ring(self) -> None:
        if self.reachable:
            self._send()

    def _send(self) -> bool:
        try:
            self._socket.sendto(b"!", self.address)
        except BlockingIOError:  # the master has rings it has not drained: it will wake
            return True
        except OSError:  # another host or network namespace, or the master is gone
            return False
        return True

    def close(self) -> None:
        self._socket.close()
