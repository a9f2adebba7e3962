"""4-byte words over a pair of pipes, the way forkservers speak (AFL's, and SymCC's in
executors/symcc_preload.c): a request written, answers read within a deadline."""

from __future__ import annotations

import os
import select
import struct

from symcc_mpi.durable.clock import SYSTEM_CLOCK

_WORD = struct.Struct("<I")


class PipeClosed(Exception):
    """The other end died or stopped answering mid-word."""


def write_word(fd: int, word: int) -> None:
    try:
        os.write(fd, _WORD.pack(word))
    except OSError:
        raise PipeClosed from None


def read_word(fd: int, seconds: float) -> int | None:
    """The next word on `fd`; None if none began within `seconds`."""
    deadline = SYSTEM_CLOCK.monotonic() + seconds
    chunks = b""
    while len(chunks) < 4:
        left = deadline - SYSTEM_CLOCK.monotonic()
        ready, _, _ = select.select([fd], [], [], max(left, 0.0))
        if not ready:
            if not chunks:
                return None
            raise PipeClosed
        chunk = os.read(fd, 4 - len(chunks))
        if not chunk:
            raise PipeClosed
        chunks += chunk
    return _WORD.unpack(chunks)[0]
