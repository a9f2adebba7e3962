"""Fault injection by configuration, for the real-mpiexec tests.

`SYMCC_MPI_FAULTS="1:foreign-result@2,2:malformed-result@1"` makes rank 1 send a RESULT with
a token it was never given before its real RESULT of its 2nd dispatch, and rank 2 send
garbage instead of the RESULT of its 1st dispatch (its next READY then echoes the token).
"""

from __future__ import annotations

import os

KINDS = ("foreign-result", "malformed-result")


class Faults:
    def __init__(self, rank: int, spec: str | None = None):
        spec = os.environ.get("SYMCC_MPI_FAULTS", "") if spec is None else spec
        self.planned: set[tuple[str, int]] = set()
        for item in filter(None, (part.strip() for part in spec.split(","))):
            target, _, rest = item.partition(":")
            kind, _, number = rest.partition("@")
            if kind not in KINDS or not target.isdigit() or not number.isdigit():
                raise ValueError(f"SYMCC_MPI_FAULTS: cannot parse {item!r}")
            if int(target) == rank:
                self.planned.add((kind, int(number)))

    def fire(self, kind: str, dispatch_number: int) -> bool:
        return (kind, dispatch_number) in self.planned
