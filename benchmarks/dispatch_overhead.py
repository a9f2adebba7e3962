"""Dispatch overhead: tasks per second and master time per task with an executor that does
nothing, for 1, 2 and 4 workers. Target: median master time per task <= 2 ms."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from _campaign import print_table, run_campaign

TASKS = 3000
TARGET_MS = 2.0


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="symcc-mpi-bench-") as scratch:
        seeds = Path(scratch, "seeds")
        seeds.mkdir()
        for i in range(TASKS):
            (seeds / f"s{i:05d}").write_bytes(os.urandom(32))
        rows, figures = [], []
        for workers in (1, 2, 4):
            stats = run_campaign(Path(scratch, f"out{workers}"), "--target", "/bin/true",
                                 "--seeds", str(seeds), "--executor", "noop",
                                 "--workers", str(workers))
            assert stats["executions"] == TASKS, stats["executions"]
            extra = stats["extra"]
            task = extra["master_task_time"]
            figure = {
                "workers": workers,
                "tasks": stats["executions"],
                "tasks_per_sec": stats["executions"] / extra["master_loop_seconds"],
                "master_ms_per_task_median": task["median_ms"],
                "master_ms_per_task_p90": task["p90_ms"],
                "master_cpu_ms_per_task": extra["master_loop_cpu_seconds"] * 1e3 / TASKS,
            }
            figures.append(figure)
            rows.append(list(figure.values()))
    print_table(list(figures[0]), rows)
    worst = max(f["master_ms_per_task_median"] for f in figures)
    print(f"target: median master time per task <= {TARGET_MS} ms; worst seen {worst:.3f} ms")
    print(json.dumps({"benchmark": "dispatch_overhead", "target_ms": TARGET_MS,
                      "results": figures}))


if __name__ == "__main__":
    main()
