"""Byte-range locks: an open file description's `fcntl` lock on a whole shared file
(F_OFD_SETLK), held around one read-decide-append of a lease log (federation/lease_log.py).

NFS carries them to the server (NLM, NFSv4), the kernel drops them when their holder dies, and
unlike a process's POSIX locks two descriptions in one process exclude each other. Waiting is
bounded like a lock directory's (locks.py, F320 §2.6); acquiring and releasing cost a system
call each.
"""

from __future__ import annotations

import fcntl
import os
import struct
from collections.abc import Callable
from pathlib import Path

from symcc_mpi.durable.clock import SYSTEM_CLOCK, Clock
from symcc_mpi.durable.locks import BUSY, FIRST_NAP, LONGEST_NAP, LockTimeout


class RangeLock:
    """The open file description `fd`'s exclusive `fcntl` lock on the whole of `path`: a
    context manager, not re-entrant. The wait is bounded by `timeout` seconds of
    `clock.monotonic()` (LockTimeout); `waited` is how long the last acquisition waited."""

    _WRITE = struct.pack("hhxxxxqqixxxx", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
    _UNLOCK = struct.pack("hhxxxxqqixxxx", fcntl.F_UNLCK, os.SEEK_SET, 0, 0, 0)

    def __init__(self, fd: int, path: Path, *, timeout: float, clock: Clock = SYSTEM_CLOCK,
                 sleep: Callable[[float], object] = SYSTEM_CLOCK.sleep):
        self.fd = fd
        self.path = path
        self.timeout = timeout
        self.clock = clock
        self.sleep = sleep
        self.waited = 0.0

    def __enter__(self) -> RangeLock:
        try:
            fcntl.fcntl(self.fd, fcntl.F_OFD_SETLK, self._WRITE)
            self.waited = 0.0
            return self
        except OSError as error:
            if error.errno not in BUSY:
                raise
        start = self.clock.monotonic()
        deadline, nap = start + self.timeout, FIRST_NAP
        while True:
            now = self.clock.monotonic()
            if now >= deadline:
                raise LockTimeout(self.path, now - start, None, None)
            self.sleep(min(nap, deadline - now))
            nap = min(nap * 1.5, LONGEST_NAP)
            try:
                fcntl.fcntl(self.fd, fcntl.F_OFD_SETLK, self._WRITE)
            except OSError as error:
                if error.errno not in BUSY:
                    raise
                continue
            self.waited = self.clock.monotonic() - start
            return self

    def __exit__(self, *_exc) -> None:
        fcntl.fcntl(self.fd, fcntl.F_OFD_SETLK, self._UNLOCK)
