"""Durable-layer costs with fsync on, on this machine's disk: what the commit path pays.

The done journal (`durable.journal.LineLog`) appended one record per fsync and in groups (the
group commit: one write and one fsync per round), the raw append+fsync that bounds it, and
`write_durable` (temporary, fsync, rename, directory fsync: the triage checkpoint, pruning maps
and corpus files). Every figure is the median of REPEATS runs, each in a fresh directory: fsync
times on a shared virtual disk move by a factor of two from one second to the next.

Run alone it prints a table, then one JSON line."""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from symcc_mpi.durable.atomic import write_durable  # noqa: E402
from symcc_mpi.durable.journal import LineLog  # noqa: E402

OPERATIONS = 300
GROUP = 16
REPEATS = 3


def _record(i: int) -> dict:
    """A done record of the journal's real shape."""
    return {"digest": hashlib.sha256(b"%d" % i).hexdigest(), "token": "ab" * 16,
            "outcome": "ok", "time": 1_700_000_000.0 + i}


def _median_ms(operation: Callable[[int], None], count: int) -> float:
    samples = []
    for i in range(count):
        began = time.perf_counter()
        operation(i)
        samples.append((time.perf_counter() - began) * 1e3)
    return statistics.median(samples)


def _open_log(path: Path) -> LineLog:
    log = LineLog(path)
    log.load(lambda record: None)
    log.open_for_append()
    return log


def measure_once(directory: Path) -> dict:
    fd = os.open(directory / "fsync-probe", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        raw = _median_ms(lambda i: (os.write(fd, b"x" * 120 + b"\n"), os.fsync(fd)), OPERATIONS)
    finally:
        os.close(fd)
    log = _open_log(directory / "one.jsonl")
    one = _median_ms(lambda i: log.append(_record(i)), OPERATIONS)
    log.close()
    log = _open_log(directory / "group.jsonl")
    group = _median_ms(
        lambda i: log.extend([_record(i * GROUP + j) for j in range(GROUP)]), OPERATIONS // 4)
    log.close()
    durable = _median_ms(lambda i: write_durable(directory / f"d{i % 8}", b"y" * 200),
                         OPERATIONS)
    return {"fsync_append_ms": raw, "journal_append_ms": one,
            f"journal_group{GROUP}_ms": group,
            f"journal_group{GROUP}_ms_per_record": group / GROUP,
            "write_durable_ms": durable}


def measure(directory: Path, *, repeats: int = REPEATS) -> dict:
    runs = []
    for repeat in range(repeats):
        scratch = directory / f"run-{repeat}"
        scratch.mkdir(parents=True)
        runs.append(measure_once(scratch))
    return {name: statistics.median(run[name] for run in runs) for name in runs[0]} | {
        "repeats": repeats}


def main() -> None:
    here = Path(__file__).resolve().parent.parent  # the repository's disk, not a tmpfs
    with tempfile.TemporaryDirectory(prefix=".bench-durable-", dir=here) as scratch:
        figures = measure(Path(scratch))
    width = max(len(name) for name in figures)
    print(f"{'figure (median)'.ljust(width)}  value")
    for name, value in figures.items():
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        print(f"{name.ljust(width)}  {shown}")
    print(json.dumps({"benchmark": "durable_ops", "results": figures}))


if __name__ == "__main__":
    main()
