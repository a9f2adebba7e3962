"""Durable store throughput on this machine's disk, fsync on: QueryStore dispatch+finish pairs
per second and work-WAL commits per second, with the raw fsync cost that bounds them, the same
operations without fsync (the CPU share) and batched (several mutations per fsync).

`measure(directory)` returns the figures; run alone it prints a table, then one JSON line."""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from symcc_mpi.durable.atomic import write_durable  # noqa: E402
from symcc_mpi.durable.journal import WorkLeaseJournal  # noqa: E402
from symcc_mpi.durable.querystore import QueryStore  # noqa: E402
from symcc_mpi.durable.wal import Manifest, WorkWAL  # noqa: E402

QUERYSTORE_PAIRS = 600
BATCH = 16
WAL_COMMITS = 200
JOURNAL_EVENTS = 600
REPEATS = 3


@contextmanager
def counting_fsyncs() -> dict:
    """Count os.fsync calls made inside the block (directory fsyncs included)."""
    counter = {"n": 0}
    real = os.fsync

    def fsync(fd: int) -> None:
        counter["n"] += 1
        real(fd)

    os.fsync = fsync
    try:
        yield counter
    finally:
        os.fsync = real


def _rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def _timed(operation: Callable[[int], None], count: int) -> tuple[float, float, list[float]]:
    """Wall seconds, CPU seconds and per-call milliseconds of `count` calls."""
    samples = []
    cpu = time.process_time()
    start = time.perf_counter()
    for i in range(count):
        began = time.perf_counter()
        operation(i)
        samples.append((time.perf_counter() - began) * 1e3)
    return time.perf_counter() - start, time.process_time() - cpu, samples


def measure_fsync(directory: Path) -> dict:
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        wall, _, append = _timed(lambda i: (os.write(fd, b"x" * 100 + b"\n"), os.fsync(fd)),
                                 300)
    finally:
        os.close(fd)
    _, _, durable = _timed(lambda i: write_durable(directory / f"d{i % 8}", b"y" * 200), 300)
    return {"fsync_append_ms_median": statistics.median(append),
            "write_durable_ms_median": statistics.median(durable)}


def measure_querystore(directory: Path) -> dict:
    store = QueryStore(directory / "querystore.sqlite")
    store.initialize(["master"] + [f"worker{i}" for i in range(8)], 64)

    def pair(i: int, prefix: str = "w") -> None:
        work = f"{prefix}{i:08d}"
        fence = store.dispatch(work, "worker1")
        store.finish(fence, work, "worker1")

    # SQLite fsyncs in C, out of counting_fsyncs' sight: in WAL mode with synchronous=FULL it
    # is one fsync of the -wal file per transaction, plus the checkpoints' (every ~1000 pages).
    wall, cpu, samples = _timed(pair, QUERYSTORE_PAIRS)
    figures = {
        "querystore_pairs_per_sec": _rate(QUERYSTORE_PAIRS, wall),
        "querystore_ms_per_pair_median": statistics.median(samples),
        "querystore_ms_per_pair_p90": statistics.quantiles(samples, n=10)[-1],
        "querystore_cpu_ms_per_pair": cpu * 1e3 / QUERYSTORE_PAIRS,
    }

    def batch(i: int) -> None:
        with store.batch():
            for j in range(BATCH):
                pair(i * BATCH + j, "b")

    rounds = QUERYSTORE_PAIRS // BATCH
    wall, _, _ = _timed(batch, rounds)
    figures["querystore_batched_pairs_per_sec"] = _rate(rounds * BATCH, wall)
    figures["querystore_batch_size"] = BATCH
    # The CPU bound: the same pairs with SQLite not syncing at all (never in production).
    store._db.execute("PRAGMA synchronous=OFF")
    wall, _, _ = _timed(lambda i: pair(i, "n"), QUERYSTORE_PAIRS)
    figures["querystore_nosync_pairs_per_sec"] = _rate(QUERYSTORE_PAIRS, wall)
    store.close()
    return figures


def _staged(directory: Path, objects: int) -> Manifest:
    staging = directory / "staging" / f"result-{objects}"
    staging.mkdir(parents=True, exist_ok=True)
    digests = []
    for _ in range(objects):
        data = os.urandom(512)
        digest = hashlib.sha256(data).hexdigest()
        (staging / digest).write_bytes(data)
        digests.append(digest)
    return Manifest(staging, tuple(digests))


def _wal_run(root: Path, *, fsync: bool, objects: int) -> dict:
    """WAL_COMMITS full commits (begin, manifest, publish, done) of `objects` staged files."""
    wal = WorkWAL(root / "wal", root / "corpus", fsync=fsync)
    manifests = [_staged(root, objects) for _ in range(8)]
    steps: dict[str, list[float]] = {"begin": [], "manifest": [], "publish": [], "done": []}

    def commit(i: int) -> None:
        work, token = f"work{i:08d}", f"token{i}"
        for name, call, arguments in (
                ("begin", wal.begin, ()),
                ("manifest", wal.commit_manifest, (manifests[i % 8],)),
                ("publish", wal.publish, ()),
                ("done", wal.done, ())):
            began = time.perf_counter()
            call(work, token, *arguments)
            steps[name].append((time.perf_counter() - began) * 1e3)

    with counting_fsyncs() as fsyncs:
        wall, cpu, samples = _timed(commit, WAL_COMMITS)
    return {"wall": wall, "cpu": cpu, "samples": samples, "steps": steps,
            "fsyncs": fsyncs["n"]}


def measure_wal(directory: Path) -> dict:
    figures: dict = {}
    for fsync, objects in ((True, 1), (True, 8), (False, 1)):
        run = _wal_run(directory / f"wal-{int(fsync)}-{objects}", fsync=fsync,
                       objects=objects)
        key = f"wal{'' if fsync else '_nosync'}{'' if objects == 1 else f'_{objects}obj'}"
        figures[f"{key}_commits_per_sec"] = _rate(WAL_COMMITS, run["wall"])
        if fsync:
            figures[f"{key}_ms_per_commit_median"] = statistics.median(run["samples"])
            figures[f"{key}_fsyncs_per_commit"] = run["fsyncs"] / WAL_COMMITS
            figures[f"{key}_cpu_ms_per_commit"] = run["cpu"] * 1e3 / WAL_COMMITS
            if objects == 1:
                for name, values in run["steps"].items():
                    figures[f"wal_{name}_ms_median"] = statistics.median(values)
    return figures


def measure_journal(directory: Path) -> dict:
    journal = WorkLeaseJournal(directory / "leases.jsonl")

    def event(i: int) -> None:
        if i % 2 == 0:
            journal.lease(f"w{i // 2}", "t")
        else:
            journal.done(f"w{i // 2}", "t")

    wall, _, samples = _timed(event, JOURNAL_EVENTS)
    journal.close()
    return {"journal_events_per_sec": _rate(JOURNAL_EVENTS, wall),
            "journal_ms_per_event_median": statistics.median(samples)}


def measure(directory: Path, *, repeats: int = REPEATS) -> dict:
    """Every figure is the median of `repeats` runs, each in a fresh directory: fsync times on
    a shared virtual disk move by a factor of two from one second to the next."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    runs: list[dict] = []
    for repeat in range(repeats):
        figures: dict = {}
        for part in (measure_fsync, measure_querystore, measure_wal, measure_journal):
            scratch = directory / f"{part.__name__}-{repeat}"
            scratch.mkdir()
            figures.update(part(scratch))
        runs.append(figures)
    return {name: statistics.median(run[name] for run in runs) for name in runs[0]} | {
        "repeats": repeats}


def main() -> None:
    here = Path(__file__).resolve().parent.parent  # the repository's disk, not a tmpfs
    with tempfile.TemporaryDirectory(prefix=".bench-stores-", dir=here) as scratch:
        figures = measure(Path(scratch))
    width = max(len(name) for name in figures)
    print(f"{'figure'.ljust(width)}  value")
    for name, value in figures.items():
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        print(f"{name.ljust(width)}  {shown}")
    print(json.dumps({"benchmark": "bench_stores", "results": figures}))


if __name__ == "__main__":
    main()
