"""Hybrid fuzzing: a fleet's edges over time, AFL++ alone against AFL++ beside concolic help.

Four configurations per target, each with the same wall budget on the same cores, in a fresh
AFL output directory AFL_OUT; the first three with the same number of busy processes (3):
- `afl`: `afl-fuzz -M main` and two `-S` secondaries;
- `afl+helper`: `-M main`, one `-S`, and this process doing what SymCC's
  `symcc_fuzzing_helper` does (util/symcc_fuzzing_helper in SymCC's source): take the best
  entry of AFL_OUT/main/queue not yet processed (by its TestcaseScore: a `+cov` name first,
  then `orig:` in the name, then the smaller file, then the greater name), run the SymCC
  build on it (fresh SYMCC_OUTPUT_DIR, SYMCC_ENABLE_LINEARIZATION=1, one persistent
  SYMCC_AFL_COVERAGE_MAP, SYMCC_INPUT_FILE for `@@`, 90 s limit), probe every generated file
  (the helper runs afl-showmap -t 5000 -m none; here ForkserverProbe, 5 s) and keep it in
  AFL_OUT/helper/queue as `id:NNNNNN,src:PARENT` if it brings a new edge or hit-count class
  to the helper's own map, a crash also in AFL_OUT/helper/crashes; sleep 5 s when nothing
  is new. AFL's main instance imports that queue, as it does a secondary's;
- `afl+symcc-mpi`: `-M main` and `symcc-mpi explore --afl-sync AFL_OUT --workers 2` (the
  campaign lives in AFL_OUT/symcc-mpi, writes an AFL-named queue and imports the fuzzers');
- `afl2+symcc-mpi`: the helper loop's two fuzzers (`-M main`, one `-S`) and the same
  campaign: four processes, but the workers sleep whenever the fuzzers give them nothing new
  (how a user would run it: the fuzzers keep every core they can use).
The figures are the fleet's, not one instance's view: after each run every queue entry of
every instance directory of AFL_OUT is probed again with ForkserverProbe, in the order in which
the entries appeared (see seconds_since_launch), and the distinct edges of the entries that
ran normally are accumulated into a step series; the first crash is the oldest
`*/crashes/id:*`. Entries that appeared after the budget do not count. Reported per target
and configuration: final edges (and their ratio to AFL alone's), the time to reach AFL
alone's final edge count (the same coverage) and its ratio to AFL alone's own time, the
first crash. `gate` hides a crash behind a 32-bit key that mutation does not guess.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from _campaign import (
    CLI,
    EXAMPLES,
    ROOT,
    build_targets,
    gnuplot_terminal,
    keep_stdout,
    print_table,
    results_file,
    revision,
    time_to,
)

from symcc_mpi.coverage.edges import Status
from symcc_mpi.coverage.forkserver import ForkserverProbe
from symcc_mpi.coverage.triage import CoverageMap

DEFAULT_TARGETS = ("gate", "json")
DEFAULT_BUDGET = 120.0  # per configuration: ~16 min for the two default targets (2 cores)
AFL = "afl"
HELPER = "afl+helper"
SYMCC_MPI = "afl+symcc-mpi"
# Beside the same two fuzzers as the helper loop: the campaign's workers sleep whenever the
# fuzzers have nothing new for them, so a user gives the fuzzers every core and adds these.
SYMCC_MPI_BESIDE = "afl2+symcc-mpi"
CAMPAIGNS = (SYMCC_MPI, SYMCC_MPI_BESIDE)
CONFIGURATIONS = (AFL, HELPER, SYMCC_MPI, SYMCC_MPI_BESIDE)
# What AFL++ 4.04c needs to run unattended as root on a shared VM; with more fuzzers than
# cores, AFL_NO_AFFINITY stops the third instance from refusing to start for want of a core.
AFL_ENV = {"AFL_NO_UI": "1", "AFL_SKIP_CPUFREQ": "1",
           "AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES": "1", "AFL_NO_AFFINITY": "1"}
AFL_STOP_GRACE = 10.0  # seconds for afl-fuzz to reap its fork server after SIGTERM
SHOWMAP_TIMEOUT = 5.0  # the helper's `afl-showmap -t 5000`; also used for the replay
SYMCC_TIMEOUT = 90.0  # the helper's `timeout -k 5 90` around each SymCC run
SYMCC_KILL_GRACE = 5.0  # and its `-k 5`: SIGKILL 5 s after the SIGTERM
IDLE_SLEEP = 5.0  # the helper's pause when the fuzzer's queue has nothing new
CAMPAIGN_GRACE = 60.0  # how long symcc-mpi may take past its --wall-timeout to shut down


# --------------------------------------------------------------------------- processes


def start_group(argv: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """Start `argv` as the leader of a new process group, output to `log`."""
    with open(log, "wb") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                start_new_session=True)


def stop_group(process: subprocess.Popen, grace: float) -> None:
    """SIGTERM the group (afl-fuzz then kills its fork server, which has a session of its
    own), then SIGKILL it: the leader if it did not stop within `grace` seconds, and anything
    it left behind."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass


def start_afl(afl_out: Path, role: str, name: str, afl: Path, seeds: Path,
              logs: Path) -> subprocess.Popen:
    """One afl-fuzz instance (`role` is -M or -S) in AFL_OUT/`name`."""
    return start_group(["afl-fuzz", "-i", str(seeds), "-o", str(afl_out), role, name, "--",
                        str(afl), "@@"], logs / f"afl-{name}.log", {**os.environ, **AFL_ENV})


def has_afl_sync() -> bool:
    """Whether this checkout's `symcc-mpi explore` can join an AFL++ fleet (--afl-sync)."""
    usage = subprocess.run([*CLI, "explore", "--help"], capture_output=True, text=True,
                           cwd=ROOT).stdout
    return "--afl-sync" in usage


def start_symcc_mpi(afl_out: Path, symcc: Path, afl: Path, seeds: Path, budget: float,
                    logs: Path) -> subprocess.Popen:
    return start_group([*CLI, "explore", "--afl-sync", str(afl_out), "--name", "symcc-mpi",
                        "--executor", "symcc", "--target", f"{symcc} @@",
                        "--afl-target", f"{afl} @@", "--seeds", str(seeds), "--workers", "2",
                        "--wall-timeout", f"{budget:g}", "--no-live"],
                       logs / "symcc-mpi.log")


# --------------------------------------------------------------------------- helper loop


def testcase_score(path: Path) -> tuple:
    """symcc_fuzzing_helper's TestcaseScore: the greatest is analysed first."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return (False, False, -(1 << 127), "")  # the helper's minimum score
    name = path.name
    return (name.endswith("+cov"), "orig:" in name, -size, name)


class TestcaseDir:
    """A directory of AFL-named test cases with dense ids (the helper's TestcaseDir)."""

    def __init__(self, path: Path) -> None:
        path.mkdir()
        self.path = path
        self.next_id = 0

    def copy(self, testcase: Path, parent: Path) -> None:
        """Copy `testcase` in as `id:NNNNNN,src:<parent's id>` (a fresh mtime: shutil.copyfile
        keeps none of the source's times, and the replay dates entries by mtime)."""
        shutil.copyfile(testcase, self.path / f"id:{self.next_id:06d},src:{parent.name[3:9]}")
        self.next_id += 1


class HelperLoop:
    """What symcc_fuzzing_helper does beside `afl-fuzz -M main`, in this process."""

    def __init__(self, afl_out: Path, symcc: Path, afl: Path, scratch: Path) -> None:
        self.fuzzer_queue = afl_out / "main" / "queue"
        home = afl_out / "helper"
        home.mkdir()
        self.queue = TestcaseDir(home / "queue")
        self.hangs = TestcaseDir(home / "hangs")
        self.crashes = TestcaseDir(home / "crashes")
        self.qsym_map = home / "bitmap"  # SymCC's pruning map, kept across runs
        self.current_input = home / ".cur_input"
        self.symcc = symcc
        self.scratch = scratch
        self.probe = ForkserverProbe([str(afl), "@@"], timeout=SHOWMAP_TIMEOUT)
        self.coverage = CoverageMap()  # the helper's own map, not AFL's
        self.processed: set[Path] = set()
        self.executions = self.killed = self.generated = 0
        self.idle_seconds = 0.0

    def best_new_testcase(self) -> Path | None:
        fresh = [p for p in self.fuzzer_queue.iterdir()
                 if p.is_file() and p not in self.processed]
        return max(fresh, key=testcase_score, default=None)

    def run(self, deadline: float) -> None:
        while (remaining := deadline - time.monotonic()) > 0:
            best = self.best_new_testcase()
            if best is None:
                pause = min(IDLE_SLEEP, remaining)
                time.sleep(pause)
                self.idle_seconds += pause
            else:
                self.test_input(best, deadline)

    def test_input(self, path: Path, deadline: float) -> None:
        output = Path(tempfile.mkdtemp(prefix="output-", dir=self.scratch))
        try:
            shutil.copyfile(path, self.current_input)
            finished = self._run_symcc(output, deadline)
            if finished is None:
                return  # cut by the budget, not by the helper's limit: not an execution
            self.executions += 1
            if not finished:
                self.killed += 1
                self.hangs.copy(path, path)
            tests = sorted(p for p in output.iterdir() if p.is_file())
            self.generated += len(tests)
            for test, cov in zip(tests, self.probe.probe(tests) if tests else [], strict=True):
                if cov.status is Status.CRASH:
                    self.crashes.copy(test, path)
                    self.queue.copy(test, path)
                elif cov.status is Status.OK and self.coverage.merge(cov):
                    self.queue.copy(test, path)
            self.processed.add(path)
        finally:
            shutil.rmtree(output)

    def _run_symcc(self, output: Path, deadline: float) -> bool | None:
        """One SymCC run: True if it ended, False if the helper's limit killed it, None if
        the budget ran out first."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SYMCC_")}
        env.update(SYMCC_ENABLE_LINEARIZATION="1", SYMCC_AFL_COVERAGE_MAP=str(self.qsym_map),
                   SYMCC_OUTPUT_DIR=str(output), SYMCC_INPUT_FILE=str(self.current_input))
        limit = min(SYMCC_TIMEOUT, deadline - time.monotonic())
        process = subprocess.Popen([str(self.symcc), str(self.current_input)],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, env=env, start_new_session=True)
        try:
            process.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            stop_group(process, SYMCC_KILL_GRACE)
            return None if limit < SYMCC_TIMEOUT else False
        return True

    def figures(self) -> dict:
        return {"symcc_executions": self.executions, "symcc_killed": self.killed,
                "generated": self.generated, "kept": self.queue.next_id,
                "crashes_kept": self.crashes.next_id, "idle_seconds": self.idle_seconds}


# --------------------------------------------------------------------------- one run


def run_configuration(config: str, symcc: Path, afl: Path, seeds: Path, budget: float,
                      scratch: Path) -> dict:
    """Run one configuration for `budget` seconds; its fleet's figures."""
    afl_out, logs = scratch / "afl-out", scratch / "logs"
    afl_out.mkdir()
    logs.mkdir()
    fuzzers: dict[str, subprocess.Popen] = {}
    campaign = None
    extra: dict = {}
    started_wall = time.time()
    deadline = time.monotonic() + budget
    try:
        fuzzers["main"] = start_afl(afl_out, "-M", "main", afl, seeds, logs)
        for k in range({AFL: 2, HELPER: 1, SYMCC_MPI: 0, SYMCC_MPI_BESIDE: 1}[config]):
            name = f"secondary{k + 1}"
            fuzzers[name] = start_afl(afl_out, "-S", name, afl, seeds, logs)
        if config in CAMPAIGNS:
            campaign = start_symcc_mpi(afl_out, symcc, afl, seeds, budget, logs)
        if config == HELPER:
            helper = HelperLoop(afl_out, symcc, afl, scratch)
            with helper.probe:
                while not helper.fuzzer_queue.is_dir() and time.monotonic() < deadline:
                    time.sleep(0.1)  # afl-fuzz creates main/queue as it starts
                helper.run(deadline)
            extra = helper.figures()
        else:
            time.sleep(max(0.0, deadline - time.monotonic()))
        for name, process in fuzzers.items():
            if process.poll() is not None:
                sys.exit(f"hybrid: afl-fuzz {name} ended early ({process.returncode}):\n"
                         + _tail(logs / f"afl-{name}.log"))
    finally:
        for process in fuzzers.values():
            stop_group(process, AFL_STOP_GRACE)
        if campaign is not None:
            try:
                campaign.wait(timeout=CAMPAIGN_GRACE)
            except subprocess.TimeoutExpired:
                stop_group(campaign, AFL_STOP_GRACE)
    if campaign is not None:
        if campaign.returncode != 0:
            sys.exit(f"hybrid: symcc-mpi exited {campaign.returncode}:\n"
                     + _tail(logs / "symcc-mpi.log"))
        stats = json.loads((afl_out / "symcc-mpi" / "stats.json").read_text())
        extra = {"symcc_executions": stats["executions"], "generated": stats["generated"],
                 "kept": stats.get("interesting", 0)}
    series, entries = fleet_series(afl_out, afl, started_wall, budget)
    return {"series": series, "queue_entries": entries,
            "first_crash_seconds": first_crash(afl_out, started_wall, budget),
            "afl_execs": afl_execs(afl_out), **extra}


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"


def instance_dirs(afl_out: Path) -> Iterator[Path]:
    return (d for d in sorted(afl_out.iterdir()) if d.is_dir() and not d.name.startswith("."))


def seconds_since_launch(entry: Path, launched: float) -> float:
    """When a queue or crash entry appeared, in seconds since `launched` (wall clock).

    afl-fuzz names its own finds and its seeds `...,time:MS,...`, in ms since it started
    (~0.05 s after the launch here, so this credits them that much early); not their mtime,
    because trimming rewrites an entry when afl-fuzz first fuzzes it, measured up to 26 s
    after it was found. Other entries are dated by mtime: afl-fuzz's synced copies and the
    helper's copies are written once, and the campaign's queue entries are hard links to
    corpus files written as the master commits them (measured: within 11 ms of the done
    journal's time; not ctime, which a later link to the same inode moved by up to 10 s).
    """
    for field in entry.name.split(","):
        if field.startswith("time:") and field[5:].isdigit():
            return int(field[5:]) / 1000
    return max(0.0, entry.stat().st_mtime - launched)


def fleet_series(afl_out: Path, afl: Path, started_wall: float,
                 budget: float) -> tuple[list[tuple[float, int]], int]:
    """Distinct edges of the whole fleet over time (see the docstring); and how many queue
    entries appeared within the budget."""
    timed = []
    for instance in instance_dirs(afl_out):
        queue = instance / "queue"
        for entry in queue.glob("id:*") if queue.is_dir() else ():
            appeared = seconds_since_launch(entry, started_wall)
            if appeared <= budget:
                timed.append((appeared, entry))
    timed.sort()
    with ForkserverProbe([str(afl), "@@"], timeout=SHOWMAP_TIMEOUT) as probe:
        coverages = probe.probe([p for _, p in timed])
    coverage = CoverageMap()  # edges of normal runs only, as AFL counts them
    series = [(0.0, 0)]
    for (appeared, _), cov in zip(timed, coverages, strict=True):
        coverage.merge(cov)
        if coverage.edges_covered > series[-1][1]:
            series.append((appeared, coverage.edges_covered))
    return series, len(timed)


def first_crash(afl_out: Path, started_wall: float, budget: float) -> float | None:
    times = [seconds_since_launch(p, started_wall)
             for instance in instance_dirs(afl_out) for p in instance.glob("crashes/id:*")]
    return min((t for t in times if t <= budget), default=None)


def afl_execs(afl_out: Path) -> int:
    """Executions of every afl-fuzz instance, from their final fuzzer_stats."""
    total = 0
    for stats in afl_out.glob("*/fuzzer_stats"):
        for line in stats.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "execs_done":
                total += int(value)
    return total


# --------------------------------------------------------------------------- figures


# What the concolic side did, where the configuration has one (the helper has them all).
CONCOLIC_FIGURES = ("symcc_executions", "symcc_killed", "generated", "kept", "crashes_kept",
                    "idle_seconds")


def figures(config: str, run: dict, afl_edges: int, afl_time: float) -> dict:
    edges = run["series"][-1][1]
    reach = time_to(run["series"], afl_edges)
    return {
        "config": config,
        "edges": edges,
        "edges_ratio_to_afl": edges / afl_edges if afl_edges else None,
        "seconds_to_afl_edges": reach,
        "time_ratio_to_afl": reach / afl_time if reach is not None and afl_time > 0 else None,
        "first_crash_seconds": run["first_crash_seconds"],
        "queue_entries": run["queue_entries"],
        "afl_execs": run["afl_execs"],
        **{k: run[k] for k in CONCOLIC_FIGURES if k in run},
    }


COLUMNS = ["config", "edges", "edges/afl", "t_afl_edges_s", "time/afl", "first_crash_s",
           "queue", "afl_execs", "symcc_execs", "kept"]


def _row(f: dict) -> list:
    def opt(value, fmt: str) -> str:
        return "none" if value is None else fmt.format(value)
    return [f["config"], f["edges"], opt(f["edges_ratio_to_afl"], "{:.2f}x"),
            opt(f["seconds_to_afl_edges"], "{:.1f}"), opt(f["time_ratio_to_afl"], "{:.2f}x"),
            opt(f["first_crash_seconds"], "{:.1f}"), f["queue_entries"], f["afl_execs"],
            f.get("symcc_executions", "-"), f.get("kept", "-")]


def closing_note(target: str, table: list[dict]) -> str:
    base = table[0]
    parts = [f"AFL alone ends with {base['edges']} edges, reached at "
             f"{base['seconds_to_afl_edges']:.1f} s"]
    for f in table[1:]:
        reach = ("never reaches them" if f["seconds_to_afl_edges"] is None else
                 f"reaches them at {f['seconds_to_afl_edges']:.1f} s "
                 f"({f['time_ratio_to_afl']:.2f}x)")
        parts.append(f"{f['config']} {reach} and ends with {f['edges']} "
                     f"({f['edges_ratio_to_afl']:.2f}x)")
    crashes = ", ".join(f"{f['config']} " + ("none" if f["first_crash_seconds"] is None
                                             else f"{f['first_crash_seconds']:.1f} s")
                        for f in table)
    return f"{target}: " + "; ".join(parts) + f". First crash: {crashes}."


def _compact(series: list[tuple[float, int]]) -> list[list]:
    return [[round(t, 3), e] for t, e in series]


# --------------------------------------------------------------------------- plot


def plot(runs: dict[str, dict[str, dict]], budget: float, image_path: Path) -> tuple[Path, str]:
    """Edges over time, one panel per target and one line per configuration; returns the
    image's path and a text rendering."""
    blocks, panels = [], []
    for t, (target, by_config) in enumerate(runs.items()):
        # From a little below the seeds' coverage: the climb is where the configurations differ.
        floor = int(0.9 * min(run["series"][1][1] if len(run["series"]) > 1 else 0
                              for run in by_config.values()))
        curves = []
        for c, (config, run) in enumerate(by_config.items()):
            points = [*run["series"], (budget, run["series"][-1][1])]
            blocks.append(f"$d{t}_{c} << EOD\n"
                          + "".join(f"{s:.3f} {e}\n" for s, e in points) + "EOD")
            curves.append(f"$d{t}_{c} with steps lw 2 title '{config}'")
        panels.append(f"set title 'hybrid: {target}, {budget:g} s each (fleet edges vs "
                      f"seconds since launch)'\nset yrange [{floor}:*]\n"
                      "plot " + ", \\\n     ".join(curves) + "\n")
    common = ("set xlabel 'seconds'\nset ylabel 'AFL edges'\nset key bottom right\n"
              f"set xrange [0:{budget:g}]\nset grid\n")
    terminal, ext = gnuplot_terminal()
    image = image_path.with_suffix(f".{ext}")
    image.parent.mkdir(parents=True, exist_ok=True)
    layout = f"set multiplot layout {len(panels)},1\n" if len(panels) > 1 else ""
    script = image.with_suffix(".gp")
    script.write_text(f"set terminal {terminal} size 1000,{450 * len(panels)}\n"
                      f"set output '{image}'\n" + "\n".join(blocks) + "\n" + common + layout
                      + "".join(panels) + ("unset multiplot\n" if layout else ""))
    subprocess.run(["gnuplot", str(script)], check=True, stdin=subprocess.DEVNULL)
    text = "".join(
        subprocess.run(["gnuplot"], input="set terminal dumb size 100,25\n" + "\n".join(blocks)
                       + "\n" + common + panel, capture_output=True, text=True,
                       check=True).stdout for panel in panels)
    image.with_suffix(".txt").write_text(text)
    return image, text


# --------------------------------------------------------------------------- main


def warm_up(symcc: Path, afl: Path, seeds: Path, scratch: Path) -> None:
    """One untimed run of each binary, so that the first configuration pays no first-run
    cost (page cache, dynamic loading) that the others do not."""
    seed = min(p for p in seeds.iterdir() if p.is_file())
    output = scratch / "warm-up"
    output.mkdir()
    env = {**os.environ, "SYMCC_OUTPUT_DIR": str(output), "SYMCC_INPUT_FILE": str(seed)}
    subprocess.run([str(symcc), str(seed)], stdin=subprocess.DEVNULL, capture_output=True,
                   env=env, timeout=SYMCC_TIMEOUT)
    with ForkserverProbe([str(afl), "@@"], timeout=SHOWMAP_TIMEOUT) as probe:
        probe.probe([seed])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET, metavar="SECONDS",
                        help=f"wall budget of every configuration (default {DEFAULT_BUDGET:g})")
    parser.add_argument("--target", action="append", metavar="NAME",
                        help="example target (repeatable; default: "
                             + " and ".join(DEFAULT_TARGETS) + ")")
    parser.add_argument("--plot", type=Path, metavar="PATH",
                        help="the plot (its extension follows gnuplot's best terminal; the "
                             "script and a text rendering go beside it; default "
                             "benchmarks/results/hybrid-DATE-REV-plot.png, beside the "
                             "output kept as hybrid-DATE-REV.txt)")
    parser.add_argument("--examples", type=Path, default=EXAMPLES, metavar="DIR",
                        help="take build/NAME.symcc, build/NAME.afl and seeds/NAME/ from DIR "
                             "(default examples/, after `make -s -C examples`)")
    args = parser.parse_args()
    if not args.budget > 0:
        parser.error("--budget must be positive")
    targets = build_targets("hybrid", args.target or list(DEFAULT_TARGETS), args.examples)
    with keep_stdout("hybrid") as kept:
        run(args, targets, args.plot or results_file("hybrid", "-plot.png"))
    print(f"output kept in {kept}", file=sys.stderr)


def run(args: argparse.Namespace, targets: dict, plot_path: Path) -> None:
    configs = [c for c in CONFIGURATIONS if c not in CAMPAIGNS or has_afl_sync()]
    load = os.getloadavg()
    print(f"hybrid at {revision()}: {len(targets)} target(s) x {len(configs)} configurations, "
          f"{args.budget:g} s each, 3 busy processes each ({SYMCC_MPI_BESIDE}: 2 fuzzers "
          f"and 2 workers); {os.cpu_count()} CPUs, load "
          f"average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if SYMCC_MPI not in configs:
        print(f"hybrid: {SYMCC_MPI} skipped: `symcc-mpi explore` has no --afl-sync here")
    runs: dict[str, dict[str, dict]] = {}
    results, notes = {}, []
    for target, (symcc, afl, seeds) in targets.items():
        runs[target] = {}
        for config in configs:
            print(f"[{target}] {config} ...", flush=True)
            with tempfile.TemporaryDirectory(prefix=f"hybrid-{target}-") as scratch:
                warm_up(symcc, afl, seeds, Path(scratch))
                runs[target][config] = run_configuration(config, symcc, afl, seeds,
                                                         args.budget, Path(scratch))
        afl_series = runs[target][AFL]["series"]
        afl_edges = afl_series[-1][1]
        afl_time = time_to(afl_series, afl_edges) or 0.0
        table = [figures(c, run, afl_edges, afl_time) for c, run in runs[target].items()]
        print(f"\n{target}: times in seconds since launch; ratios against {AFL}")
        print_table(COLUMNS, [_row(f) for f in table])
        notes.append(closing_note(target, table))
        results[target] = {"afl_edges": afl_edges, "afl_seconds_to_final": afl_time,
                           "configs": table,
                           "series": {c: _compact(r["series"])
                                      for c, r in runs[target].items()}}
    image, text = plot(runs, args.budget, plot_path)
    print(text.rstrip("\n"))
    print(f"plot: {image}")
    end_load = os.getloadavg()
    print(f"load average at the end {end_load[0]:.2f} {end_load[1]:.2f} {end_load[2]:.2f}")
    for note in notes:
        print(note)
    print(json.dumps({"benchmark": "hybrid", "budget_seconds": args.budget,
                      "cpus": os.cpu_count(), "load_average_at_start": list(load),
                      "load_average_at_end": list(end_load), "configurations": configs,
                      "plot": str(image), "targets": results}))


if __name__ == "__main__":
    main()
