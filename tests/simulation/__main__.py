"""`make simulate SEEDS=N`: run N schedules, print what they injected and checked.

    python -m simulation --seeds 1000              # from tests/: schedules 0..999
    python -m simulation --seed 17 --verbose       # replay one, with the ranks' log
    python -m simulation --seed 17 --shrink        # and shrink it
    python -m simulation --schedule '{...}'        # replay a shrunk schedule (its JSON)
    python -m simulation --mutation NAME           # the first schedule catching a variant
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from .mutations import MUTATIONS, apply
from .runner import run_many, run_one, shrink
from .simulation import Fault, Schedule, run_schedule


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m simulation")
    parser.add_argument("--seeds", type=int, default=1000, help="how many schedules")
    parser.add_argument("--first", type=int, default=0, help="the first schedule's seed")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, help="replay this schedule alone")
    parser.add_argument("--schedule", help="replay this schedule, as --shrink prints it")
    parser.add_argument("--verbose", action="store_true", help="with the ranks' log")
    parser.add_argument("--shrink", action="store_true", help="shrink a failing --seed")
    parser.add_argument("--mutation", choices=sorted(MUTATIONS),
                        help="run a deliberately broken variant until a schedule fails")
    arguments = parser.parse_args()
    if arguments.seed is not None or arguments.schedule:
        return _replay(arguments)
    if arguments.mutation:
        mutation = MUTATIONS[arguments.mutation]
        print(f"{arguments.mutation} ({mutation.rule}): {mutation.what}")
        summary = run_many(range(arguments.first, arguments.first + arguments.seeds),
                           processes=arguments.processes, mutation=arguments.mutation,
                           stop_at_first=True)
        failed = summary.failures
        if not failed:
            print(f"NOT caught in {len(summary.runs)} schedules ({summary.seconds:.0f} s)")
            return 1
        first = min(failed, key=lambda run: run.seed)
        print(f"caught by {first.described}\n  {first.violation}\n"
              f"after {len(summary.runs)} schedules, {summary.seconds:.0f} s")
        return 0
    summary = run_many(range(arguments.first, arguments.first + arguments.seeds),
                       processes=arguments.processes, progress=_progress)
    print(file=sys.stderr)
    print(summary.table())
    print(json.dumps({"schedules": len(summary.runs), "failed": len(summary.failures),
                      "seconds": round(summary.seconds, 1),
                      "failed_seeds": [run.seed for run in summary.failures]}))
    return 1 if summary.failures else 0


def _replay(arguments) -> int:
    if arguments.schedule:
        plain = json.loads(arguments.schedule)
        schedule = Schedule(**{**plain, "faults": tuple(Fault(**f) for f in plain["faults"]),
                               "execution_seconds": tuple(plain["execution_seconds"]),
                               "delays": tuple(plain["delays"])})
    else:
        schedule = Schedule.generate(arguments.seed)
    print(schedule.describe())
    if arguments.verbose:
        with apply(arguments.mutation) if arguments.mutation else contextlib.nullcontext():
            outcome = run_schedule(schedule, verbose=True)
        print(f"violation: {outcome.violation}; trace {outcome.trace}")
        return 1 if outcome.failed else 0
    run = run_one(schedule.seed, arguments.mutation, schedule)
    print(f"{run.violation or 'every invariant held'}; trace {run.trace}")
    if run.violation and arguments.shrink:
        smaller = shrink(schedule, arguments.mutation)
        print(f"shrunk to: {smaller.describe()}\n  as JSON: {json.dumps(_plain(smaller))}")
    return 1 if run.violation else 0


def _plain(schedule: Schedule) -> dict:
    from dataclasses import asdict

    plain = asdict(schedule)
    for fault in plain["faults"]:
        fault["kind"] = fault["kind"].value
    return plain


def _progress(run) -> None:
    print("x" if run.violation else ".", end="", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
