"""Many schedules over several processes, the table of what they injected and checked, the
search of a mutation's first failing schedule, and shrinking a failing schedule."""

from __future__ import annotations

import gc
import hashlib
import multiprocessing
import queue
import time
from collections import Counter
from dataclasses import dataclass, field, replace

from .mutations import apply
from .simulation import Schedule, run_schedule

SCHEDULE_SECONDS = 120  # real seconds a schedule may take before its process is given up


@dataclass
class Run:
    """What one schedule came to, small enough to cross a process boundary."""

    seed: int
    described: str
    violation: str | None
    step: int | None
    faults: Counter
    checks: Counter
    turns: int
    checked_turns: int
    jobs: int
    executions: int
    trace: str
    forgotten: Counter = field(default_factory=Counter)
    schedule: Schedule | None = None


@dataclass
class Summary:
    runs: list[Run] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failures(self) -> list[Run]:
        return [run for run in self.runs if run.violation is not None]

    def table(self) -> str:
        runs = self.runs
        faults, checks = Counter(), Counter()
        mixes = Counter()
        for run in runs:
            faults.update(run.faults)
            checks.update(run.checks)
            mixes[len(run.faults)] += 1
        lines = [f"{len(runs)} schedules in {self.seconds:.1f} s "
                 f"({len(self.failures)} failed), "
                 f"{sum(r.turns for r in runs)} turns, invariants checked after "
                 f"{sum(r.checked_turns for r in runs)} of them, "
                 f"{sum(r.jobs for r in runs)} jobs, {sum(r.executions for r in runs)} "
                 "executions", "",
                 f"{'fault injected':<32}{'times':>8}{'schedules':>11}"]
        for kind, times in sorted(faults.items()):
            having = sum(1 for r in runs if kind in r.faults)
            lines.append(f"{kind:<32}{times:>8}{having:>11}")
        lines += ["", "fault kinds mixed in one schedule: " + ", ".join(
            f"{n} kinds: {mixes[n]}" for n in sorted(mixes)), "",
            *_configurations([run.schedule for run in runs if run.schedule is not None]), "",
            f"{'invariant':<72}{'checked':>10}"]
        forgotten = Counter()
        for run in runs:
            forgotten.update(run.forgotten)
        for rule, times in sorted(checks.items()):
            lines.append(f"{rule:<72}{times:>10}")
        if forgotten:
            lines += ["", "power failures took " + ", ".join(
                f"{n} {what}" for what, n in sorted(forgotten.items())) +
                " that no fsync had made durable"]
        for run in self.failures[:10]:
            lines += ["", f"FAILED {run.described}", f"  {run.violation}"]
        return "\n".join(lines)


def _configurations(schedules: list[Schedule]) -> list[str]:
    """How many schedules had each size and feature."""
    def spread(name: str, value, bounds: tuple[int, ...]) -> str:
        counts = Counter(next(b for b in bounds if value(s) <= b) for s in schedules)
        below = dict(zip(bounds, (1, *(b + 1 for b in bounds)), strict=False))
        return f"{name}: " + ", ".join(
            f"{below[b]}" + (f"-{b}" if below[b] != b else "") + f": {counts[b]}"
            for b in bounds if counts[b])

    return ["configurations: " + "; ".join((
        spread("masters", lambda s: s.masters, (1, 2, 3, 4)),
        spread("workers", lambda s: s.workers, (1, 4, 8, 16)),
        spread("seeds", lambda s: s.seeds, (3, 8, 20, 100)),
        spread("machines", lambda s: s.machines, (1, 2, 3)))),
        f"features: split {sum(s.split for s in schedules)}, triage "
        f"{sum(s.triage for s in schedules)}, both {sum(s.split and s.triage for s in schedules)}"
        f", neither {sum(not (s.split or s.triage) for s in schedules)}; hybrid "
        f"{sum(s.hybrid for s in schedules)}; pruning shared "
        f"{sum(s.pruning == 'shared' for s in schedules)}, local "
        f"{sum(s.pruning == 'local' for s in schedules)}"]


def run_one(seed: int, mutation: str | None = None,
            schedule: Schedule | None = None) -> Run:
    schedule = schedule or Schedule.generate(seed)
    if mutation is None:
        outcome = run_schedule(schedule)
    else:
        with apply(mutation):
            outcome = run_schedule(schedule)
    violation = outcome.violation
    return Run(seed, schedule.describe(), None if violation is None else str(violation),
               None if violation is None else violation.step, outcome.faults, outcome.checks,
               outcome.turns, outcome.checked_turns, outcome.jobs, outcome.executions,
               outcome.trace, outcome.forgotten, schedule)


def _serve(child: int, seeds: list[int], mutation: str | None, results) -> None:
    gc.freeze()  # what the fork server imported is no schedule's garbage
    parent = multiprocessing.parent_process()
    for seed in seeds:
        if parent is not None and not parent.is_alive():
            return  # the search was given up (its process killed): so is this part of it
        results.put((child, seed))  # so that a schedule that hangs is named
        results.put((child, run_one(seed, mutation)))


def _fresh_processes():
    """Children forked from a fresh interpreter that imported the simulation (a fork
    server), not from this process: a test process's heap and open descriptors made every
    schedule's collections and descriptor listings dearer (after the unit tests, 100
    schedules took a third more CPU)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


def run_many(seeds: range, *, processes: int = 2, mutation: str | None = None,
             stop_at_first: bool = False, progress=None) -> Summary:
    """Every schedule of `seeds`, dealt round-robin to `processes` children (forked from a
    fork server that imported the simulation). A child silent for SCHEDULE_SECONDS is given
    up."""
    summary = Summary()
    started = time.monotonic()
    context = _fresh_processes()
    results = context.Queue()
    children = [context.Process(target=_serve, args=(i, list(seeds)[i::processes], mutation,
                                                     results), daemon=True)
                for i in range(processes)]
    running: dict[int, int] = {}  # child: the seed it is on
    for child in children:
        child.start()
    try:
        while len(summary.runs) < len(seeds):
            try:
                child, run = results.get(timeout=SCHEDULE_SECONDS)
            except queue.Empty:  # a child died, or a schedule spins in real time
                for seed in sorted(running.values()):
                    summary.runs.append(Run(seed, Schedule.generate(seed).describe(),
                                            f"no answer within {SCHEDULE_SECONDS} s (a "
                                            "schedule still running, or its process died)",
                                            None, Counter(), Counter(), 0, 0, 0, 0, ""))
                break
            if isinstance(run, int):
                running[child] = run
                continue
            del running[child]
            summary.runs.append(run)
            if progress is not None:
                progress(run)
            if stop_at_first and run.violation is not None:
                break
    finally:
        for child in children:  # SIGKILL: a simulated master's SIGTERM handler may be in
            child.kill()
            child.join()
    summary.seconds = time.monotonic() - started
    return summary


def shrink(schedule: Schedule, mutation: str | None = None, *, budget: int = 60) -> Schedule:
    """A smaller schedule that still fails: fewer faults, workers and seeds, features off,
    tried one change at a time (each try is a whole run, so `budget` bounds them)."""

    def fails(candidate: Schedule) -> bool:
        nonlocal budget
        budget -= 1
        return run_one(candidate.seed, mutation, candidate).violation is not None

    improved = True
    while improved and budget > 0:
        improved = False
        candidates = [replace(schedule, faults=schedule.faults[:i] + schedule.faults[i + 1:])
                      for i in range(len(schedule.faults))]
        if schedule.workers > schedule.masters:
            candidates.append(replace(schedule, workers=schedule.workers - schedule.masters
                                      if schedule.masters > 1 else schedule.workers - 1))
        if schedule.seeds > 1:
            candidates.append(replace(schedule, seeds=schedule.seeds - 1))
        # Triage goes only after hybrid: --afl-sync needs --afl-target.
        candidates += [replace(schedule, **{feature: False})
                       for feature in ("split", "hybrid", "triage") if getattr(schedule, feature)
                       and not (feature == "triage" and schedule.hybrid)]
        if schedule.pruning != "off":
            candidates.append(replace(schedule, pruning="off"))
        for candidate in candidates:
            if budget <= 0:
                break
            if fails(candidate):
                schedule, improved = candidate, True
                break
    return schedule


@dataclass
class Found:
    """A search for one planted bug from one start: where it was caught and how."""

    mutation: str
    start: int
    schedules: int | None  # run before the first that failed, that one included; None: not
    violation: str = ""
    shrunk: Schedule | None = None
    shrunk_turns: int = 0
    unmutated_failures: list[int] = field(default_factory=list)  # real defects met on the way


def search_start(mutation: str) -> int:
    """Where the suite's search for a planted bug starts: a seed nobody chose."""
    return int(hashlib.sha256(mutation.encode()).hexdigest()[:8], 16) % 10**6


def search(mutation: str, start: int, *, limit: int, processes: int = 2,
           shrink_budget: int = 30) -> Found:
    """The first schedule from `start` that catches `mutation` within `limit`, shrunk (unless
    `shrink_budget` is 0). A schedule that fails without the mutation too is no catch: it
    is a real defect, noted, and the search goes on past it."""
    unmutated_failures = []
    begin = start
    while begin < start + limit:
        summary = run_many(range(begin, start + limit), processes=processes,
                           mutation=mutation, stop_at_first=True)
        if not summary.failures:
            break
        first = min(summary.failures, key=lambda run: run.seed)
        if run_one(first.seed).violation is not None:
            unmutated_failures.append(first.seed)
            begin = first.seed + 1
            continue
        found = Found(mutation, start, first.seed - start + 1,
                      first.violation.split(": ", 1)[1], unmutated_failures=unmutated_failures)
        if shrink_budget:
            found.shrunk = shrink(Schedule.generate(first.seed), mutation, budget=shrink_budget)
            found.shrunk_turns = run_one(found.shrunk.seed, mutation, found.shrunk).turns
        return found
    return Found(mutation, start, None, unmutated_failures=unmutated_failures)
