"""What is left to analyse: every input known once, by the SHA-256 of its bytes; no I/O.

An input enters the frontier once, however often it is generated, and leaves it when taken
for a dispatch. A dispatch that never reached a worker puts it back exactly where it was; a
dispatch that failed after the send is requeued (or deferred) by `dispatch.ProtocolRecovery`,
in front, so a failing input is retried soon rather than after the whole frontier.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class Frontier:
    pending: deque[str] = field(default_factory=deque)
    known: set[str] = field(default_factory=set)
    done: set[str] = field(default_factory=set)

    def add(self, digest: str, *, done: bool = False) -> bool:
        """Make an input known; it joins the frontier unless already known or done."""
        if digest in self.known:
            return False
        self.known.add(digest)
        if done:
            self.done.add(digest)
        else:
            self.pending.append(digest)
        return True

    def take(self) -> str:
        return self.pending.popleft()

    def put_back(self, digest: str) -> None:
        """Undo a `take` whose dispatch never left: first in line again."""
        self.pending.appendleft(digest)

    def requeue(self, digest: str) -> None:
        """A dispatch of `digest` failed after its send; analyse it again, soon."""
        if digest not in self.done:
            self.pending.appendleft(digest)

    def mark_done(self, digest: str) -> None:
        self.done.add(digest)

    def __len__(self) -> int:
        return len(self.pending)
