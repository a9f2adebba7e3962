"""What transactional dispatch (F313/F317) costs the master, no-op executor.

Two measurements:

1. in process: one dispatch cycle through `DispatchCoordinator` (READY, read the input, open
   the transaction, send to nowhere, classify, fence, finish, join, sweep), without MPI:
   the machinery alone;
2. whole campaigns (3000 no-op tasks, 1/2/4 workers) at this checkout and at the last
   revision before the machinery (a git worktree of BASELINE, run through PYTHONPATH): median
   master time per task and master CPU per task, side by side.

This checkout's task time also counts reading the input and opening the transaction; the
baseline's counted the send alone, so the difference overstates the added cost, if anything.
Target: the machinery adds under 0.5 ms per dispatch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from _campaign import ROOT, print_table, run_campaign

from symcc_mpi.dispatch.coordinator import DispatchCoordinator
from symcc_mpi.dispatch.tables import CommitStart
from symcc_mpi.dispatch.watchdog import WatchdogConfig
from symcc_mpi.scheduling.frontier import Frontier

BASELINE = "446eb2a"  # "MPI tests: one helper to launch a campaign ...": before issue 4's wiring
TASKS = 3000
CYCLES = 20_000
TARGET_ADDED_MS = 0.5


def coordinator_cycle_us(workers: int = 4) -> float:
    inputs = {}
    for _ in range(CYCLES):
        data = os.urandom(32)
        inputs[hashlib.sha256(data).hexdigest()] = data
    frontier = Frontier()
    for digest in inputs:
        frontier.add(digest)
    coordinator = DispatchCoordinator(
        frontier, watchdog=WatchdogConfig(seconds=120.0, protocol_retries=1), deferrals=None,
        load=inputs.__getitem__)
    outbox: list = []
    last_token: dict[int, str | None] = dict.fromkeys(range(1, workers + 1))
    started = time.perf_counter()
    while not coordinator.exhausted:
        for rank, token in last_token.items():
            coordinator.ready(rank, token)
        coordinator.join()
        coordinator.dispatch(lambda rank, work: outbox.append((rank, work)))
        for rank, work in outbox:
            coordinator.classify(rank, work.token)
            with coordinator.boundary(rank):
                assert coordinator.begin_commit(rank, work.token) is CommitStart.COMMITTING
                coordinator.finish(rank, work.token)
            last_token[rank] = work.token
        outbox.clear()
        coordinator.sweep()
    return (time.perf_counter() - started) / CYCLES * 1e6


def campaign_figures(out: Path, seeds: Path, workers: int, env: dict | None) -> dict:
    stats = run_campaign(out, "--target", "/bin/true", "--seeds", str(seeds), "--executor",
                         "noop", "--workers", str(workers), env=env)
    assert stats["executions"] == TASKS, stats["executions"]
    extra = stats["extra"]
    return {"median_ms": extra["master_task_time"]["median_ms"],
            "cpu_ms": extra["master_loop_cpu_seconds"] * 1e3 / TASKS,
            "tasks_per_sec": TASKS / extra["master_loop_seconds"]}


def baseline_worktree(scratch: Path, revision: str) -> Path | None:
    tree = scratch / "baseline"
    added = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree),
                            revision], capture_output=True, text=True)
    if added.returncode != 0:
        print(f"baseline {revision} not available ({added.stderr.strip()}): HEAD only")
        return None
    return tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=BASELINE, help="revision to compare against")
    parser.add_argument("--rounds", type=int, default=3, help="campaigns per configuration")
    args = parser.parse_args()

    cycle_us = statistics.median(coordinator_cycle_us() for _ in range(3))
    print(f"coordinator alone: {cycle_us:.1f} µs per dispatch cycle ({CYCLES} cycles, median "
          "of 3)")
    with tempfile.TemporaryDirectory(prefix="symcc-mpi-bench-") as name:
        scratch = Path(name)
        seeds = scratch / "seeds"
        seeds.mkdir()
        for i in range(TASKS):
            (seeds / f"s{i:05d}").write_bytes(os.urandom(32))
        tree = baseline_worktree(scratch, args.baseline)
        variants = {"head": None}
        if tree is not None:
            variants["baseline"] = dict(os.environ, PYTHONPATH=str(tree / "src"))
        figures = []
        try:
            for workers in (1, 2, 4):
                row = {"workers": workers}
                for variant, env in variants.items():
                    runs = [campaign_figures(scratch / f"{variant}-{workers}-{i}", seeds,
                                             workers, env) for i in range(args.rounds)]
                    for key in runs[0]:
                        row[f"{variant}_{key}"] = statistics.median(r[key] for r in runs)
                if tree is not None:
                    row["added_ms"] = row["head_median_ms"] - row["baseline_median_ms"]
                    row["added_cpu_ms"] = row["head_cpu_ms"] - row["baseline_cpu_ms"]
                figures.append(row)
        finally:
            if tree is not None:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                str(tree)], capture_output=True)
    print_table(list(figures[0]), [list(f.values()) for f in figures])
    worst = max((f.get("added_ms", 0.0) for f in figures), default=0.0)
    print(f"target: added master time per dispatch < {TARGET_ADDED_MS} ms; worst seen "
          f"{worst:.3f} ms (median of {args.rounds} campaigns each)")
    print(json.dumps({"benchmark": "dispatch_transactions", "baseline": args.baseline,
                      "target_added_ms": TARGET_ADDED_MS, "coordinator_cycle_us": cycle_us,
                      "results": figures}))


if __name__ == "__main__":
    main()
