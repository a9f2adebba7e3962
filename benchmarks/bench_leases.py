"""Lease I/O per task on one filesystem (issues 11 and 27, F320 §2.2): claim, commit fence and
completion, with and without fsync, claims one at a time against grouped, on one shard (a
master's own log, as in a job) and on four.

Run: `.venv/bin/python benchmarks/bench_leases.py` (BENCH_DIR picks the filesystem, default
/tmp). Prints a table, then as its last line one JSON object with the same figures.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

from symcc_mpi.federation.leases import FencedWorkLeaseTable

BATCHES = (1, 8, 64)  # a claim batch: one input, a master's idle workers, a big refill
TASKS = 512  # per measurement; a multiple of every batch


def _digests(prefix: str, count: int) -> list[str]:
    return [hashlib.sha256(f"{prefix}-{i}".encode()).hexdigest() for i in range(count)]


def _per_task_ms(directory: Path, *, fsync: bool, batch: int, shards: int) -> float:
    """Milliseconds of lease I/O per task: claims in groups of `batch`, then for each task
    its fence and completion (one digest each, as in the master loop; the completion is
    written with the next fence)."""
    table = FencedWorkLeaseTable(directory, "bench", ttl=120, lock_timeout=5, shards=shards,
                                 fsync=fsync)
    digests = _digests(directory.name, TASKS)
    start = time.perf_counter()
    for first in range(0, TASKS, batch):
        won = table.claim_many(digests[first:first + batch])
        assert len(won) == min(batch, TASKS - first)
        for digest, lease in won.items():
            assert table.begin_commit(digest, lease.token)
            assert table.complete(digest, lease.token)
    table.flush()
    seconds = time.perf_counter() - start
    table.close()
    return seconds / TASKS * 1e3


def measure(directory: Path) -> dict[str, float]:
    figures: dict[str, float] = {}
    for fsync in (False, True):
        for shards in (1, 4):
            for batch in BATCHES:
                name = (f"ms_per_task_{'fsync' if fsync else 'nofsync'}"
                        f"_shards{shards}_batch{batch}")
                figures[name] = _per_task_ms(directory / name, fsync=fsync, batch=batch,
                                             shards=shards)
    return figures


def main() -> None:
    scratch_parent = os.environ.get("BENCH_DIR", "/tmp")
    with tempfile.TemporaryDirectory(prefix="symcc-mpi-bench-leases-",
                                     dir=scratch_parent) as scratch:
        figures = measure(Path(scratch))
    width = max(map(len, figures))
    print(f"lease I/O per task (claim + fence + completion), {TASKS} tasks, "
          f"on {scratch_parent}")
    for name, value in figures.items():
        print(f"{name:<{width}}  {value:8.3f} ms")
    print(json.dumps({"benchmark": "bench_leases", "directory": scratch_parent,
                      "tasks": TASKS, "results": figures}))


if __name__ == "__main__":
    main()
