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
task (`extra.master_task_time`: the hand-off and the commit, leases included). Configurations
alternate within each repetition, so a load change on this shared machine hits them alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from _campaign import ROOT, print_table, run_campaign

from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.layout import done_journals

EXAMPLES = ROOT / "examples"


def steady_rate(out: Path) -> tuple[int, int, float]:
    """(observations, distinct inputs, tasks/s between the first and last done record)."""
    campaign = CampaignDir(out)
    times, digests = [], []
    for path in done_journals(out):
        for record in campaign.inspect_journal(path)[0]:
            if "kind" not in record:
                times.append(record["time"])
                digests.append(record["digest"])
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


def measure(workload: str, masters: int, workers: int, seeds: int, scratch: Path) -> dict:
    out = scratch / f"{workload}-{masters}"
    arguments = workload_arguments(workload, scratch / f"{workload}-seeds", seeds)
    stats = run_campaign(out, *arguments, "--workers", str(workers), "--masters",
                         str(masters), "--fault-tolerance", "off")
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
        "per_master_executions": [per_master[k]["executions"]
                                  for k in sorted(per_master, key=int)] or [stats["executions"]],
        "seconds": round(stats["command_seconds"], 1),
        "stop_reason": extra["stop_reason"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--masters", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seeds", type=int, default=300, help="noop workload's seeds")
    parser.add_argument("--workloads", nargs="+", default=["noop", "magic"])
    parser.add_argument("--repeats", type=int, default=2)
    options = parser.parse_args()

    runs: dict[tuple[str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-multimaster-") as scratch:
        for repeat in range(options.repeats):
            for workload in options.workloads:
                for masters in options.masters:
                    directory = Path(scratch) / f"r{repeat}"
                    directory.mkdir(exist_ok=True)
                    runs.setdefault((workload, masters), []).append(
                        measure(workload, masters, options.workers, options.seeds, directory))

    rows, figures = [], []
    for (workload, masters), samples in runs.items():
        median = {key: statistics.median(s[key] for s in samples) for key in (
            "executions", "unique", "redundancy", "tasks_per_second", "lease_writes_per_task",
            "lock_wait_ms_per_task", "root_task_ms", "seconds")}
        alone = statistics.median(s["tasks_per_second"] for s in runs[(workload, 1)]) \
            if (workload, 1) in runs else 0.0
        median["rate_vs_one_master"] = round(median["tasks_per_second"] / alone, 3) \
            if alone else None
        median["redundancy_worst"] = max(s["redundancy"] for s in samples)
        median["per_master_executions"] = samples[-1]["per_master_executions"]
        median["stop_reasons"] = sorted({s["stop_reason"] for s in samples})
        figures.append({"workload": workload, "masters": masters,
                        "workers": options.workers, "repeats": len(samples), **median})
        rows.append([workload, masters, options.workers, int(median["executions"]),
                     int(median["unique"]), median["redundancy_worst"],
                     median["tasks_per_second"], median["rate_vs_one_master"] or "-",
                     median["lease_writes_per_task"], median["lock_wait_ms_per_task"],
                     median["root_task_ms"], "/".join(map(str, median["per_master_executions"])),
                     median["seconds"]])
    print_table(["workload", "masters", "workers", "executions", "unique", "redundancy (worst)",
                 "tasks/s", "vs 1 master", "lease writes/task", "lock wait ms/task",
                 "root ms/task", "per master", "seconds"], rows)
    print(json.dumps({"benchmark": "multimaster", "runs": figures}))


if __name__ == "__main__":
    main()
