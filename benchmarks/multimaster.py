"""Several masters (issue 11, F320): redundancy, lease I/O and throughput against one master.

Real `symcc-mpi explore` campaigns with 1, 2 and 4 masters at a fixed total of workers
(`--workers`, default 4; the ranks are workers + masters, oversubscribed on this machine),
on two workloads:

- `noop`: the no-op executor over SEEDS distinct seeds: nothing but the dispatch machinery,
  where the shared lease table costs most (a claim, a commit fence and a completion per task,
  each a lock round and a record write on OUT's filesystem);
- `magic` (or, with `--workloads`, any bundled example): the Triton executor from its seeds,
  where every result generates children the masters must discover from each other (`json`
  did not finish 6 campaigns in 30 minutes here: not in the default set).

Per campaign: executions, distinct inputs analysed, redundancy (observations / unique, the
F320 figure: 1.00 means no input analysed twice), tasks/s over the campaign's steady part
(first to last done record, every master's journal), the ratio of that rate to one master's,
the lease table's writes and lock-wait time per task, and the first master's median time per
task (`extra.master_task_time`: the hand-off and the commit, leases included), and the masters'
CPU per task (every master's loop, summed, over the campaign's executions). Configurations
alternate within each repetition, so a load change on this shared machine hits them alike.
With --previous-tree, each configuration runs at this revision and at the tree's, one after
the other, and a last table gives this / previous.

With M > 1 masters on `noop`, M independent one-master campaigns also run at once, each with
its share of the workers and of the seeds ("apart"): as many processes on the cores as the
campaign of M masters, each master with as many workers. Their CPU per task is what M masters
cost without the federation; the campaign's CPU over theirs is the federation's own.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _campaign import ROOT, done_records, keep_stdout, print_table, revision, run_campaign
from symcc_scaling import previous_env

EXAMPLES = ROOT / "examples"


def steady_rate(out: Path) -> tuple[int, int, float]:
    """(observations, distinct inputs, tasks/s between the first and last done record)."""
    records = done_records(out)
    times = [record["time"] for record in records]
    digests = [record["digest"] for record in records]
    span = max(times) - min(times) if len(times) > 1 else 0.0
    return len(digests), len(set(digests)), (len(times) - 1) / span if span > 0 else 0.0


def workload_arguments(name: str, seeds_dir: Path, seeds: int) -> list[str]:
    if name == "noop":
        seeds_dir.mkdir(exist_ok=True)
        for number in range(seeds):
            (seeds_dir / f"seed{number:05d}").write_bytes(b"seed %d" % number)
        return ["--executor", "noop", "--target", "/bin/true", "--seeds", str(seeds_dir)]
    return ["--target", f"{EXAMPLES / 'build' / name} @@", "--seeds",
            str(EXAMPLES / "seeds" / name), "--timeout", "30"]


def masters_cpu(stats: dict) -> float | None:
    """Every master's loop CPU, summed (None: a revision whose figures lack it)."""
    per_master = stats["extra"].get("per_master")
    if not per_master:
        return stats["extra"].get("master_loop_cpu_seconds")
    cpu = [m.get("loop_cpu_seconds") for m in per_master.values()]
    return None if None in cpu else sum(cpu)


def measure(workload: str, masters: int, workers: int, seeds: int, scratch: Path,
            env: dict | None = None) -> dict:
    out = scratch / f"{workload}-{masters}-{'previous' if env else 'this'}"
    arguments = workload_arguments(workload, scratch / f"{workload}-seeds", seeds)
    stats = run_campaign(out, *arguments, "--workers", str(workers), "--masters",
                         str(masters), "--fault-tolerance", "off", env=env)
    observations, unique, rate = steady_rate(out)
    extra = stats["extra"]
    per_master = extra.get("per_master") or {}
    writes = sum(m.get("writes", 0) for m in per_master.values())
    lock_wait = sum(m.get("lock_wait_seconds", 0.0) for m in per_master.values())
    return {
        "workload": workload, "masters": masters, "workers": workers,
        "executions": stats["executions"], "unique": unique,
        "redundancy": round(observations / unique, 4) if unique else 0.0,
        "tasks_per_second": round(rate, 2),
        "lease_writes_per_task": round(writes / observations, 2) if observations else 0.0,
        "lock_wait_ms_per_task": round(1e3 * lock_wait / observations, 3)
        if observations else 0.0,
        "root_task_ms": round(extra["master_task_time"].get("median_ms", 0.0), 3),
        "masters_cpu_ms_per_task": round(1e3 * cpu / observations, 3)
        if (cpu := masters_cpu(stats)) is not None and observations else None,
        "per_master_executions": [per_master[k]["executions"]
                                  for k in sorted(per_master, key=int)] or [stats["executions"]],
        "seconds": round(stats["command_seconds"], 1),
        "stop_reason": extra["stop_reason"],
    }


def measure_apart(masters: int, workers: int, seeds: int, scratch: Path) -> float:
    """CPU ms per task of `masters` one-master noop campaigns run at once, the workers and
    the seeds shared out as a campaign of `masters` masters shares them."""
    def one(index: int) -> dict:
        seeds_dir = scratch / f"apart-seeds-{masters}-{index}"
        seeds_dir.mkdir(exist_ok=True)
        for number in range(index, seeds, masters):
            (seeds_dir / f"seed{number:05d}").write_bytes(b"seed %d" % number)
        share = workers // masters + (index < workers % masters)
        return run_campaign(scratch / f"apart-{masters}-{index}", "--executor", "noop",
                            "--target", "/bin/true", "--seeds", str(seeds_dir),
                            "--workers", str(share), "--fault-tolerance", "off")
    with ThreadPoolExecutor(masters) as pool:
        campaigns = list(pool.map(one, range(masters)))
    cpu = sum(stats["extra"]["master_loop_cpu_seconds"] for stats in campaigns)
    return round(1e3 * cpu / sum(stats["executions"] for stats in campaigns), 3)


def median_of(samples: list[dict], key: str):
    values = [s[key] for s in samples if s[key] is not None]
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--masters", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seeds", type=int, default=300, help="noop workload's seeds")
    parser.add_argument("--workloads", nargs="+", default=["noop", "magic"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--previous-revision", metavar="REV",
                        help="also run every configuration at REV (with --previous-tree)")
    parser.add_argument("--previous-tree", type=Path, metavar="DIR",
                        help="git worktree of REV (added if missing)")
    options = parser.parse_args()
    sides = {"this": None}
    if options.previous_revision:
        if options.previous_tree is None:
            parser.error("--previous-revision needs --previous-tree")
        sides["previous"] = previous_env(options.previous_tree, options.previous_revision)

    with keep_stdout("multimaster") as kept:
        report(options, sides)
        print(f"output kept in {kept}", file=sys.stderr)


def report(options: argparse.Namespace, sides: dict[str, dict | None]) -> None:
    runs: dict[tuple[str, str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-multimaster-") as scratch:
        for repeat in range(options.repeats):
            for workload in options.workloads:
                for masters in options.masters:
                    for side, env in sides.items():
                        directory = Path(scratch) / f"r{repeat}"
                        directory.mkdir(exist_ok=True)
                        sample = measure(workload, masters, options.workers, options.seeds,
                                         directory, env)
                        sample["apart_cpu_ms_per_task"] = measure_apart(
                            masters, options.workers, options.seeds, directory) \
                            if side == "this" and workload == "noop" and masters > 1 else None
                        runs.setdefault((side, workload, masters), []).append(sample)

    rows, figures = [], []
    medians: dict[tuple[str, str, int], dict] = {}
    for (side, workload, masters), samples in runs.items():
        median = {key: median_of(samples, key) for key in (
            "executions", "unique", "redundancy", "tasks_per_second", "lease_writes_per_task",
            "lock_wait_ms_per_task", "root_task_ms", "masters_cpu_ms_per_task",
            "apart_cpu_ms_per_task", "seconds")}
        alone = medians.get((side, workload, 1))
        median["rate_vs_one_master"] = round(median["tasks_per_second"] /
                                             alone["tasks_per_second"], 3) if alone else None
        median["extra_cpu_ms_per_task"] = round(
            median["masters_cpu_ms_per_task"] - alone["masters_cpu_ms_per_task"], 3) \
            if alone and None not in (median["masters_cpu_ms_per_task"],
                                      alone["masters_cpu_ms_per_task"]) else None
        median["federation_cpu_ms_per_task"] = round(
            median["masters_cpu_ms_per_task"] - median["apart_cpu_ms_per_task"], 3) \
            if None not in (median["masters_cpu_ms_per_task"],
                            median["apart_cpu_ms_per_task"]) else None
        median["redundancy_worst"] = max(s["redundancy"] for s in samples)
        median["per_master_executions"] = samples[-1]["per_master_executions"]
        median["stop_reasons"] = sorted({s["stop_reason"] for s in samples})
        medians[(side, workload, masters)] = median
        figures.append({"side": side, "workload": workload, "masters": masters,
                        "workers": options.workers, "repeats": len(samples), **median})
        rows.append([side, workload, masters, options.workers, int(median["executions"]),
                     int(median["unique"]), median["redundancy_worst"],
                     median["tasks_per_second"], median["rate_vs_one_master"] or "-",
                     median["lease_writes_per_task"], median["lock_wait_ms_per_task"],
                     median["root_task_ms"], _or_dash(median["masters_cpu_ms_per_task"]),
                     _or_dash(median["extra_cpu_ms_per_task"]),
                     _or_dash(median["apart_cpu_ms_per_task"]),
                     _or_dash(median["federation_cpu_ms_per_task"]),
                     "/".join(map(str, median["per_master_executions"])), median["seconds"]])
    print(f"multimaster at {revision()}" + (f" against {options.previous_revision}"
                                            if options.previous_revision else ""))
    print_table(["side", "workload", "masters", "workers", "executions", "unique",
                 "redundancy (worst)", "tasks/s", "vs 1 master", "lease writes/task",
                 "lock wait ms/task", "root ms/task", "masters CPU ms/task",
                 "CPU ms/task over 1 master", "apart CPU ms/task", "federation's own ms/task",
                 "per master", "seconds"], rows)
    ratios = []
    if "previous" in sides:
        for (side, workload, masters), mine in medians.items():
            if side != "this":
                continue
            theirs = medians[("previous", workload, masters)]
            ratio = {key: round(mine[key] / theirs[key], 3) if mine[key] and theirs[key]
                     else None for key in ("tasks_per_second", "lease_writes_per_task",
                                           "lock_wait_ms_per_task", "masters_cpu_ms_per_task")}
            ratios.append({"workload": workload, "masters": masters, **ratio})
        print("\nthis / previous")
        print_table(["workload", "masters", "tasks/s", "lease writes/task", "lock wait ms/task",
                     "masters CPU ms/task"],
                    [[r["workload"], r["masters"], *(_or_dash(r[k]) for k in (
                        "tasks_per_second", "lease_writes_per_task", "lock_wait_ms_per_task",
                        "masters_cpu_ms_per_task"))] for r in ratios])
    print(json.dumps({"benchmark": "multimaster", "revision": revision(),
                      "previous_revision": options.previous_revision, "runs": figures,
                      "this_over_previous": ratios}))


def _or_dash(value):
    return "-" if value is None else value


if __name__ == "__main__":
    main()
