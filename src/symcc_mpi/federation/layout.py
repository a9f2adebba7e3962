"""The ranks of a job of several masters: one contiguous group per master, its first rank the
master's."""

from __future__ import annotations

from symcc_mpi.config import UsageError


def groups(size: int, masters: int) -> list[range]:
    """The world ranks of each master's group: contiguous blocks whose sizes differ by at most
    one, the first rank of each its master. UsageError if a master would have no worker."""
    if size < 2 * masters:
        raise UsageError(f"--masters {masters} needs at least {2 * masters} MPI ranks (a "
                         f"master and a worker each), not {size}")
    base, extra = divmod(size, masters)
    blocks, start = [], 0
    for index in range(masters):
        end = start + base + (index < extra)
        blocks.append(range(start, end))
        start = end
    return blocks
