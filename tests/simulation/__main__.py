"""`make simulate SEEDS=N`: run N schedules, print what they injected and checked.

    python -m simulation --seeds 1000              # from tests/: schedules 0..999
    python -m simulation --seed 17 --verbose       # replay one, with the ranks' log
    python -m simulation --seed 17 --shrink        # and shrink it
    python -m simulation --schedule '{...}'        # replay a shrunk schedule (its JSON)
    python -m simulation --mutation NAME           # the first schedule catching a variant
    python -m simulation --search-table --starts 5 # every variant searched from random seeds
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys

from .mutations import MUTATIONS, apply
from .runner import run_many, run_one, search, search_start, shrink
from .simulation import Schedule, run_schedule


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
    parser.add_argument("--search-table", action="store_true",
                        help="search every variant from --starts random seeds, shrink each "
                             "first catch, and print the table")
    parser.add_argument("--starts", type=int, default=2, help="random ones, besides the "
                        "suite's own")
    parser.add_argument("--limit", type=int, default=1000,
                        help="schedules a search may run before the variant counts as missed")
    arguments = parser.parse_args()
    if arguments.search_table:
        return _search_table(arguments)
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
        schedule = Schedule.from_plain(json.loads(arguments.schedule))
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


def _search_table(arguments) -> int:
    starts = [random.SystemRandom().randrange(10**6) for _ in range(arguments.starts)]
    print(f"starts: the SHA-256 of the bug's name (the suite's), then {starts}; at most "
          f"{arguments.limit} schedules each", flush=True)
    print(f"{'planted bug':<36}{'caught':>6}{'median':>8}{'max':>6}{'replay: faults':>16}"
          f"{'turns':>8}  the check that caught it", flush=True)
    rows = []
    for name in sorted(MUTATIONS):
        found = [search(name, start, limit=arguments.limit, processes=arguments.processes)
                 for start in [search_start(name), *starts]]
        caught = [f for f in found if f.schedules is not None]
        shortest = min(caught, key=lambda f: (len(f.shrunk.faults), f.shrunk_turns),
                       default=None)
        rows.append({
            "bug": name, "rule": MUTATIONS[name].rule,
            "caught": f"{len(caught)}/{len(found)}",
            "schedules_median": statistics.median(f.schedules for f in caught) if caught
            else None,
            "schedules_max": max((f.schedules for f in caught), default=None),
            "schedules_from_the_suites_start": found[0].schedules,
            "check": shortest.violation.split(":")[0][:60] if shortest else "",
            "replay_faults": len(shortest.shrunk.faults) if shortest else None,
            "replay_turns": shortest.shrunk_turns if shortest else None,
            "replay": json.dumps(_plain(shortest.shrunk)) if shortest else None,
            "unmutated_failures": sorted(seed for f in found for seed in f.unmutated_failures)})
        row = rows[-1]
        print(f"{name:<36}{row['caught']:>6}{row['schedules_median']!s:>8}"
              f"{row['schedules_max']!s:>6}{row['replay_faults']!s:>16}"
              f"{row['replay_turns']!s:>8}  {row['check']}", flush=True)
        if row["unmutated_failures"]:
            print(f"  (fail without it too, real defects: {row['unmutated_failures']})")
    print(json.dumps({"starts": starts, "limit": arguments.limit, "bugs": rows}))
    return 0 if all(row["caught"].split("/")[0] == row["caught"].split("/")[1]
                    and not row["unmutated_failures"] for row in rows) else 1


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
