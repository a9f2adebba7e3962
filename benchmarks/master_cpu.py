"""Master CPU: the master's CPU per execution, this revision against another, interleaved.

Issue 24 asks that the master spend at most 1 ms of CPU per execution. symcc_scaling measures
it once per revision, and on these machines one pair of runs cannot show a difference under
about 20%: the machine's speed drifts by up to 1.8x within 15 minutes, and each run's mix of
inputs differs (the master's work grows with the children each run generates). Here the two
revisions alternate in ABBA blocks (previous, this, this, previous, ...), so that drift
weighs on both alike, and each run reports, besides the master's CPU per execution:
- its CPU per generated child (each child is checked and triaged by the master: where runs
  generate many children, as on toml, this figure moves least from run to run);
- its wake-ups per execution (each costs a round: a probe of MPI, deadlines, the stop checks);
- the campaign's executions per second and children per execution.
Each run is `explore --executor symcc --workers 2 --afl-target ... --timeout 10
--wall-timeout BUDGET` on a bundled example built with real SymCC, from its small seeds.
Absolute figures move with the machine: compare the two sides' means within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from statistics import mean

from _campaign import (
    EXAMPLES,
    build_targets,
    compile_sources,
    keep_stdout,
    print_table,
    revision,
    run_campaign,
)
from symcc_scaling import (
    MASTER_MS_TARGET,
    RUN_TIMEOUT,
    add_previous_arguments,
    cases,
    previous_env,
    warm_up,
)

from symcc_mpi.processes.scratch import default_root

DEFAULT_TARGETS = ("toml", "json")
DEFAULT_BUDGET = 40.0
DEFAULT_BLOCKS = 2  # ABBA blocks: each side runs twice per block
THIS, PREVIOUS = "this", "previous"
FIGURES = ("execs_per_sec", "master_ms_per_exec", "master_us_per_child", "wakeups_per_exec",
           "children_per_exec")


def one_run(case: dict, budget: float, env: dict | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="master-cpu-", dir=default_root()) as name:
        stats = run_campaign(Path(name) / "out", "--executor", "symcc",
                             "--target", f"{case['symcc']} @@", "--afl-target",
                             f"{case['afl']} @@", "--seeds", str(case["seeds"]),
                             "--workers", "2", "--wall-timeout", f"{budget:g}",
                             "--timeout", f"{RUN_TIMEOUT:g}", env=env)
    extra, executions, generated = stats["extra"], stats["executions"], stats["generated"]
    cpu = extra["master_loop_cpu_seconds"]
    return {"executions": executions,
            "execs_per_sec": executions / stats["elapsed"],
            "master_ms_per_exec": 1000 * cpu / executions if executions else None,
            "master_us_per_child": 1e6 * cpu / generated if generated else None,
            "wakeups_per_exec": extra["master_wakeups"] / executions if executions else None,
            "children_per_exec": generated / executions if executions else None,
            "edges": stats["edges_found"]}


def run_case(case: dict, budget: float, blocks: int, env: dict) -> dict:
    warm_up(case["symcc"], case["afl"], case["seeds"])
    order = [PREVIOUS, THIS, THIS, PREVIOUS] * blocks
    runs = []
    for number, side in enumerate(order, 1):
        run = {"side": side, **one_run(case, budget, env if side == PREVIOUS else None)}
        runs.append(run)
        print(f"  {case['name']} run {number}/{len(order)} {side}: "
              f"{run['master_ms_per_exec'] or 0:.3f} ms/exec", flush=True)
    means = {side: {figure: mean(r[figure] for r in runs if r["side"] == side
                                 and r[figure] is not None)
                    for figure in FIGURES} for side in (PREVIOUS, THIS)}
    ratios = {figure: means[THIS][figure] / means[PREVIOUS][figure]
              for figure in FIGURES if means[PREVIOUS][figure]}
    print(f"\n{case['name']} ({case['seeds']}): {budget:g} s each, in the order run")
    print_table(["side", "execs", *FIGURES, "edges"],
                [[r["side"], r["executions"], *(r[f] for f in FIGURES), r["edges"]]
                 for r in runs])
    print_table(["mean", *FIGURES],
                [[side, *(means[side][f] for f in FIGURES)] for side in (PREVIOUS, THIS)]
                + [["this/previous", *(ratios.get(f) for f in FIGURES)]])
    met = means[THIS]["master_ms_per_exec"] <= MASTER_MS_TARGET
    print(f"master <= {MASTER_MS_TARGET:g} ms CPU per execution: "
          f"{'met' if met else 'MISSED'} ({means[THIS]['master_ms_per_exec']:.3f})\n")
    return {"runs": runs, "means": means, "ratios": ratios, "goal_met": met}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET, metavar="SECONDS",
                        help=f"wall budget of every run (default {DEFAULT_BUDGET:g})")
    parser.add_argument("--blocks", type=int, default=DEFAULT_BLOCKS, metavar="N",
                        help=f"ABBA blocks per target (default {DEFAULT_BLOCKS}: 8 runs)")
    parser.add_argument("--target", action="append", metavar="NAME",
                        help="example target (repeatable; default: "
                             + ", ".join(DEFAULT_TARGETS) + ")")
    add_previous_arguments(parser)
    args = parser.parse_args()
    if not args.budget > 0 or args.blocks < 1:
        parser.error("--budget must be positive and --blocks at least 1")
    with keep_stdout("master_cpu") as copy:
        env = previous_env(args.previous_tree, args.previous_revision)
        compile_sources()
        targets = build_targets("master_cpu", args.target or list(DEFAULT_TARGETS), EXAMPLES)
        todo, skipped = cases(targets, ["small"], EXAMPLES)
        load = os.getloadavg()
        print(f"master_cpu: {len(todo)} target(s) x {2 * args.blocks} runs a side, "
              f"{args.budget:g} s each; this = {revision()}, previous = "
              f"{args.previous_revision}; load average at start {load[0]:.2f}")
        for line in skipped:
            print(line)
        results = {case["name"]: run_case(case, args.budget, args.blocks, env)
                   for case in todo}
        print(f"output kept in {copy}")
        print(json.dumps({"benchmark": "master_cpu", "revision": revision(),
                          "previous_revision": args.previous_revision,
                          "budget_seconds": args.budget, "blocks": args.blocks,
                          "load_average_at_start": list(load), "skipped": skipped,
                          "master_ms_target": MASTER_MS_TARGET,
                          "goal_met": all(r["goal_met"] for r in results.values())
                          if results else None, "cases": results}))


if __name__ == "__main__":
    sys.exit(main())
