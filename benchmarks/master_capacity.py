"""Master capacity: how many workers one master can feed (issue 27).

One master and many workers, oversubscribed on this machine (default 64 and 128), on three
workloads:
- `noop`: the no-op executor, nothing but the master's dispatch and commit, as fast as the
  workers can ask;
- `sleep 0.25` and `sleep 0.5`: a program that sleeps that long and generates nothing
  (benchmarks/sleeper.c, built here with cc), run by the SymCC executor as any target is, one
  process per run.
Each campaign is a plain `explore` (fault tolerance as the launcher sets it), with as many
distinct seeds as its workers can run in --seconds at the ideal rate (noop: --noop-seeds),
and ends when its frontier is exhausted. Over its steady part (the done records from 5 s
after the first to two run times before the last, when the frontier still feeds every
worker) it reports:
- tasks/s, the ideal (workers / run time) and their ratio;
- the master's CPU per task (its loop's CPU over the campaign's tasks) and its share of one
  core (that CPU over the loop's wall time);
- the workers' wait for work per task, as they measure it (RESULT sent to the next WORK);
- this machine's CPU use over the steady part (/proc/stat, every core).
A run falls short of its ideal either because the master is saturated (its share nears one
core, workers wait) or because the machine is (all cores busy: on 2 cores the workers'
own processes and Python loops use them up first). Capacity: a master with a core of its own
spends a fixed share F of it on its rounds (reports, sweeps, probes) and C seconds per task,
so it serves at most (1 - F) / C tasks/s and, at T seconds per run, feeds T (1 - F) / C
workers. F and C are the least-squares line through the (tasks/s over the master's loop,
master's core share) of the sleep runs that left the machine's CPU below BUSY_MACHINE: on a
saturated machine the master waits for a core, finds more results per wake-up and spends
less per task than it would on a core of its own, which would flatter it. The last table
gives T (1 - F) / C for 0.1, 0.5 and 2 s per run. Those runs generate nothing: a real SymCC
run's children cost the master more (see master_cpu.py), and the same sum applies with its C.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from _campaign import ROOT, done_records, keep_stdout, print_table, revision, run_campaign

from symcc_mpi.config import SKIP_BIN_CHECK_ENV

SLEEPER_SOURCE = ROOT / "benchmarks" / "sleeper.c"
SETTLE_SECONDS = 5.0  # after the first done record: every worker has had its first task
RUN_TIMES = (0.1, 0.5, 2.0)  # seconds per run, for the capacity table
SAMPLE_INTERVAL = 0.5
BUSY_MACHINE = 0.9  # machine CPU share above which a run is left out of the fit


def build_sleeper(directory: Path) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("master_capacity: no C compiler (cc or gcc) for the sleep target")
    program = directory / "sleeper"
    subprocess.run([compiler, "-O2", "-o", str(program), str(SLEEPER_SOURCE)], check=True)
    return program


def write_seeds(directory: Path, count: int) -> Path:
    directory.mkdir(parents=True)
    for number in range(count):
        (directory / f"seed{number:06d}").write_bytes(b"seed %d" % number)
    return directory


class MachineCpu:
    """/proc/stat's busy and total jiffies of every core, sampled in a thread while a
    campaign runs: `busy_share(start, end)` between the samples nearest those times."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> MachineCpu:
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while True:
            with open("/proc/stat") as stat:
                fields = [int(value) for value in stat.readline().split()[1:]]
            idle = fields[3] + fields[4]  # idle, iowait
            self.samples.append((time.time(), sum(fields) - idle, sum(fields)))
            if self._stop.wait(SAMPLE_INTERVAL):
                return

    def busy_share(self, start: float, end: float) -> float | None:
        first = min(self.samples, key=lambda sample: abs(sample[0] - start))
        last = min(self.samples, key=lambda sample: abs(sample[0] - end))
        if last[2] <= first[2]:
            return None
        return (last[1] - first[1]) / (last[2] - first[2])


def measure(workload: str, workers: int, seconds: float, noop_seeds: int, sleeper: Path,
            scratch: Path) -> dict:
    run_time = None if workload == "noop" else float(workload.split()[1])
    ideal = workers / run_time if run_time else None
    seeds = noop_seeds if run_time is None else math.ceil(ideal * seconds)
    name = f"{workload.replace(' ', '-')}-{workers}"
    seed_dir = write_seeds(scratch / f"{name}-seeds", seeds)
    if run_time is None:
        arguments = ["--executor", "noop", "--target", "/bin/true"]
        env = None
    else:
        arguments = ["--executor", "symcc", "--target", f"{sleeper} @@"]
        env = dict(os.environ, SLEEPER_SECONDS=f"{run_time:g}", **{SKIP_BIN_CHECK_ENV: "1"})
    out = scratch / name
    with MachineCpu() as machine:
        stats = run_campaign(out, *arguments, "--seeds", str(seed_dir), "--workers",
                             str(workers), env=env)
    times = sorted(record["time"] for record in done_records(out))
    start = times[0] + SETTLE_SECONDS
    end = times[-1] - 2 * (run_time or 0.0)
    steady = [t for t in times if start <= t <= end]
    rate = (len(steady) - 1) / (steady[-1] - steady[0]) if len(steady) > 1 else None
    extra = stats["extra"]
    executions = stats["executions"]
    cpu = extra["master_loop_cpu_seconds"]
    busy = machine.busy_share(start, end)
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(seed_dir, ignore_errors=True)
    return {
        "workload": workload, "workers": workers, "seeds": seeds, "executions": executions,
        "steady_tasks": len(steady), "tasks_per_second": round(rate, 1) if rate else None,
        "ideal_tasks_per_second": round(ideal, 1) if ideal else None,
        "of_ideal": round(rate / ideal, 3) if ideal and rate else None,
        "master_ms_per_task": round(1e3 * cpu / executions, 3),
        "loop_tasks_per_second": round(executions / extra["master_loop_seconds"], 1),
        "master_core_share": round(cpu / extra["master_loop_seconds"], 3),
        "wait_ms_per_task": round(extra["worker_phases"]["ms_per_task"]["wait"], 1),
        "target_ms_per_task": round(extra["worker_phases"]["ms_per_task"]["target"], 1),
        "machine_cpu_busy": round(busy, 3) if busy is not None else None,
        "stop_reason": extra["stop_reason"],
    }


def fit_master_cost(runs: list[dict]) -> tuple[float, float]:
    """(F, C): the least-squares line share = F + C x rate through the runs' points."""
    points = [(r["loop_tasks_per_second"], r["master_core_share"]) for r in runs]
    if len({rate for rate, _ in points}) < 2:
        raise SystemExit("master_capacity: the fit needs sleep runs at two rates at least")
    mean_rate = sum(rate for rate, _ in points) / len(points)
    mean_share = sum(share for _, share in points) / len(points)
    slope = sum((rate - mean_rate) * (share - mean_share) for rate, share in points) / \
        sum((rate - mean_rate) ** 2 for rate, _ in points)
    if slope <= 0:
        raise SystemExit(f"master_capacity: the master's share does not grow with tasks/s "
                         f"({points}): no per-task cost to fit")
    return mean_share - slope * mean_rate, slope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--workloads", nargs="+", default=["noop", "sleep 0.25", "sleep 0.5"],
                        help="noop, or 'sleep SECONDS'")
    parser.add_argument("--seconds", type=float, default=30.0,
                        help="the sleep workloads' length at the ideal rate")
    parser.add_argument("--noop-seeds", type=int, default=30000)
    options = parser.parse_args()

    with keep_stdout("master_capacity") as kept, \
            tempfile.TemporaryDirectory(prefix="bench-master-capacity-") as name:
        scratch = Path(name)
        sleeper = build_sleeper(scratch)
        print(f"master_capacity at {revision()}: one master, workers {options.workers}, "
              f"{os.cpu_count()} CPUs, load average at start "
              f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
        runs = []
        for workload in options.workloads:
            for workers in options.workers:
                print(f"  {workload} with {workers} workers ...", flush=True)
                runs.append(measure(workload, workers, options.seconds, options.noop_seeds,
                                    sleeper, scratch))
        print()
        print_table(["workload", "workers", "tasks/s", "ideal", "of ideal", "master ms/task",
                     "master core share", "worker wait ms/task", "machine CPU busy"],
                    [[r["workload"], r["workers"], r["tasks_per_second"] or "-",
                      r["ideal_tasks_per_second"] or "-", r["of_ideal"] or "-",
                      r["master_ms_per_task"], r["master_core_share"], r["wait_ms_per_task"],
                      r["machine_cpu_busy"] if r["machine_cpu_busy"] is not None else "-"]
                     for r in runs])
        fitted = [r for r in runs if r["workload"] != "noop" and r["machine_cpu_busy"] is not None
                  and r["machine_cpu_busy"] < BUSY_MACHINE]
        fixed, per_task = fit_master_cost(fitted)
        capacity = {f"{t:g}": math.floor(t * (1 - fixed) / per_task) for t in RUN_TIMES}
        print()
        used = ", ".join(f"{r['workload']} x {r['workers']}" for r in fitted)
        print(f"the master's core share = {fixed:.3f} + {1e3 * per_task:.3f} ms x tasks/s (fitted "
              f"to {used}): one master on a core of its own serves "
              f"{(1 - fixed) / per_task:.0f} tasks/s")
        print_table(["seconds per run", "workers one master feeds"],
                    [[f"{t:g}", capacity[f"{t:g}"]] for t in RUN_TIMES])
        print(f"\noutput kept in {kept}")
        print(json.dumps({"benchmark": "master_capacity", "revision": revision(),
                          "cpus": os.cpu_count(), "runs": runs,
                          "fitted_runs": [[r["workload"], r["workers"]] for r in fitted],
                          "fixed_core_share": round(fixed, 4),
                          "master_ms_per_task_fitted": round(1e3 * per_task, 4),
                          "tasks_per_second_capacity": round((1 - fixed) / per_task),
                          "workers_fed_at_seconds_per_run": capacity}))


if __name__ == "__main__":
    main()
