"""Packs that come over MPI: a worker that does not see OUT (its node has no shared
filesystem) sends the pack of each dispatch's children in pieces (protocol.PackChunk) before
its RESULT, and the master writes them into OUT/.staging/<token>, where the commit reads a
pack whoever wrote it (wire/staging.py: the index checked, each child read is checked against
its SHA-256 before anything of it is published).

The master holds one piece at a time, PACK_CHUNK bytes from an honest worker (a larger one
is refused once received: MPI gives no way to refuse a message unread, and a receive into a
smaller buffer, which MPI truncates, crashes Open MPI 5 under mpi4py 4); a worker holds
UPLOAD_WINDOW pieces and the one it reads next. A piece for a dispatch the rank does not hold,
out of order, or past MAX_PACK refuses the pack: the RESULT that follows is invalid
(ResultField.PACK) like any other whose fields do not hold, and so is a RESULT whose pack did
not arrive whole. The master removes the packs it wrote once it has handled their RESULT, as
a worker that sees OUT removes its own.
"""

from __future__ import annotations

import errno
import logging
import os

from symcc_mpi.wire.protocol import MAX_PACK, PACK_CHUNK, PackChunk

log = logging.getLogger(__name__)


class PackUploads:
    """The master's side: `receive` each piece, `problem` at the RESULT, `written` after it."""

    def __init__(self, staging: str):
        self.staging = staging  # OUT/.staging
        self.receiving: dict[int, tuple[str, int]] = {}  # rank -> (token, bytes so far)
        self.refused: dict[str, str] = {}  # token -> why, until its RESULT
        self.whole: set[str] = set()  # tokens whose pack arrived whole, until their RESULT
        self.packs = 0
        self.bytes = 0
        self.stale = 0  # pieces of a dispatch the rank no longer holds, dropped
        self.refusals = 0

    def receive(self, rank: int, piece: PackChunk, holds: str | None) -> None:
        """A piece from `rank`, whose dispatch in flight has token `holds` (None: none)."""
        token = piece.token
        if token != holds:
            self.stale += 1
            return
        if token in self.refused:
            return
        known, size = self.receiving.get(rank, (token, 0))
        if known != token:  # a pack left unfinished by an earlier dispatch: never committed
            size = 0
        if piece.offset != size:
            return self.refuse(rank, token, f"a piece at byte {piece.offset}, {size} expected")
        if len(piece.data) > PACK_CHUNK or size + len(piece.data) > MAX_PACK:
            return self.refuse(rank, token, f"a piece of {len(piece.data)} bytes at byte "
                                f"{size}: over {PACK_CHUNK} bytes a piece or {MAX_PACK} a pack")
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC \
            | (os.O_APPEND if size else os.O_TRUNC)
        try:
            fd = os.open(os.path.join(self.staging, token), flags, 0o644)
        except OSError as error:
            if error.errno != errno.ELOOP:
                raise  # a full or read-only OUT stops the campaign (roles/stopping.py)
            return self.refuse(rank, token, "its name in OUT/.staging is a symbolic link")
        try:
            view = memoryview(piece.data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        self.bytes += len(piece.data)
        if piece.last:
            self.receiving.pop(rank, None)
            self.whole.add(token)
            self.packs += 1
        else:
            self.receiving[rank] = (token, size + len(piece.data))

    def problem(self, rank: int, token: str) -> str | None:
        """At `rank`'s RESULT for `token`: why its pack is refused, if it came over MPI and
        is refused or not whole."""
        if (why := self.refused.pop(token, None)) is not None:
            return why
        known, size = self.receiving.get(rank, ("", 0))
        if known == token:
            del self.receiving[rank]
            return f"the pack stopped at byte {size}"
        return None

    def written(self, token: str) -> bool:
        """Whether the master wrote `token`'s pack (it removes it after the RESULT). Called
        after every RESULT, current or stale: nothing of its token is kept past it."""
        self.refused.pop(token, None)
        if token in self.whole:
            self.whole.discard(token)
            return True
        return False

    def refuse(self, rank: int, token: str, why: str) -> None:
        """`rank`'s pack of `token` is refused (a piece that did not decode, too)."""
        log.warning("rank %d: pack of %s refused: %s", rank, token[:12], why)
        self.refusals += 1
        self.receiving.pop(rank, None)
        self.refused[token] = why
        try:
            os.unlink(os.path.join(self.staging, token))
        except FileNotFoundError:
            pass

    def figures(self) -> dict:
        return {"packs": self.packs, "bytes": self.bytes, "refused": self.refusals,
                "stale_pieces": self.stale}
