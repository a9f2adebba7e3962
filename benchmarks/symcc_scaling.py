"""SymCC scaling: `explore` on two cores against the SymCC loops a user runs on one.

Issue 24 asks what a campaign gains over the plain SymCC loop, and what this revision gains
over the previous one. On the bundled parser examples built with real SymCC, from their
small and their large seed sets, with the same wall budget each, one after another (never
two at once), five configurations:
- `bare`: the loop a user writes: a FIFO queue of the seeds (by name), then every input a
  run generates that is new by content (SHA-256); each run is `symcc_build input` with
  SYMCC_INPUT_FILE, a fresh empty SYMCC_OUTPUT_DIR and a 10 s limit; no linearization, no
  coverage map, so SymCC solves every branch of every run;
- `bare+pruning`: the same loop with symcc_fuzzing_helper's SymCC settings,
  SYMCC_ENABLE_LINEARIZATION=1 and one SYMCC_AFL_COVERAGE_MAP for the whole loop: SymCC then
  skips the branches that map has seen (issue 24's "bare loop", goal 1's yardstick);
- `helper`: what symcc_fuzzing_helper does on one core: bare+pruning, but each new child is
  probed on the AFL build and queued only if it brings a new edge or hit-count class to the
  loop's coverage map;
- `previous`: `explore --executor symcc --workers 2 --afl-target ... --timeout 10
  --wall-timeout BUDGET` at the previous revision (--previous-revision, a git worktree run
  through PYTHONPATH);
- `this`: the same at this checkout.
A loop writes each input it queues, with its discovery time on the loop's clock, to a
queue directory; a campaign's finds are its queue/ entries, dated by their mtime (when the
master wrote them) less the launch time, so a campaign's start-up counts against it. Every
run lives in a scratch directory of its own under scratch.default_root() (/dev/shm unless
TMPDIR is set), removed afterwards.

Coverage is measured afterwards, outside the budget, with one yardstick for everyone: every
queued input found within the budget is run again on the AFL build (ForkserverProbe, which
classifies hit counts as afl-fuzz does), in the order found, and the distinct map indices
(AFL edges) of the normal runs are accumulated into a step series (10 ms grain).

Figures per target, seed set and configuration: executions and executions/s, against
bare+pruning's and bare's; the workers' milliseconds per task by phase and the master's CPU
milliseconds per execution (campaigns); the edges at the budget; the time to helper's final
edges (and its ratio to helper's own time) and to bare+pruning's; for `this`, finds and
edges per tier (stats.json) and the tier each find came from (the done record of the parent
that published it) with the edges those finds added in the measure; the done journal's bytes
per execution; why each run stopped. A plot per target and seed set, one step line per
configuration. Goals, per target and seed set:
- G1: `this` runs >= 1.8x bare+pruning's executions/s, its master <= 1 ms CPU per execution;
- G2: `this` ends with at least the edges of bare+pruning, bare and previous, and reaches
  helper's final edges in <= 0.6x the time helper took;
- G3: `this` writes <= 1024 journal bytes per execution.
Absolute times on these shared 2-core machines move by 2x: compare within one run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from _campaign import (
    EXAMPLES,
    ROOT,
    build_targets,
    compile_sources,
    edges_at,
    gnuplot_terminal,
    keep_stdout,
    print_table,
    results_file,
    revision,
    run_campaign,
    time_to,
)

from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.coverage.edges import Status
from symcc_mpi.coverage.forkserver import ForkserverProbe
from symcc_mpi.coverage.triage import CoverageMap
from symcc_mpi.executors.symcc import preload_library
from symcc_mpi.processes.scratch import default_root

BARE, PRUNING, HELPER, PREVIOUS, THIS = "bare", "bare+pruning", "helper", "previous", "this"
CONFIGURATIONS = (BARE, PRUNING, HELPER, PREVIOUS, THIS)
CAMPAIGNS = (PREVIOUS, THIS)
DEFAULT_TARGETS = ("json", "ini", "toml")
SEED_SETS = {"small": "", "large": "-large"}  # examples/seeds/TARGET + this
DEFAULT_BUDGET = 120.0  # seconds per configuration: ~10 min per target and seed set
RUN_TIMEOUT = 10.0  # seconds per SymCC run, as the campaigns' --timeout
PREVIOUS_REVISION = "e8a5656"  # the last landed revision: SymCC runs exec'd, no forkserver
PREVIOUS_TREE = Path("/tmp/symcc-mpi-prev")
SPEEDUP_TARGET = 1.8
MASTER_MS_TARGET = 1.0
TIME_RATIO_TARGET = 0.6
JOURNAL_BYTES_TARGET = 1024
PHASES = ("target", "solver", "staging", "probe", "other", "messages", "wait")


# --------------------------------------------------------------------------- loops


def run_symcc(program: Path, input_path: Path, output_dir: Path, pruning_map: Path | None,
              timeout: float) -> bool:
    """One SymCC run, with pruning if `pruning_map`; whether it ended within `timeout`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYMCC_")}
    env.update(SYMCC_INPUT_FILE=str(input_path), SYMCC_OUTPUT_DIR=str(output_dir))
    if pruning_map is not None:
        env.update(SYMCC_ENABLE_LINEARIZATION="1", SYMCC_AFL_COVERAGE_MAP=str(pruning_map))
    process = subprocess.Popen([str(program), str(input_path)], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                               start_new_session=True)
    try:
        process.wait(timeout=timeout)
        finished = True
    except subprocess.TimeoutExpired:
        finished = False
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the run if it is late, else what it left
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()
    return finished


class LoopQueue:
    """A loop's FIFO queue: each input written to `directory` as `id:NNNNNN,time:MS` (its
    discovery on the loop's clock), and kept in memory as (seconds, path)."""

    def __init__(self, directory: Path, started: float):
        directory.mkdir()
        self.directory = directory
        self.started = started
        self.entries: list[tuple[float, Path]] = []
        self.seen: set[bytes] = set()

    def is_new(self, data: bytes) -> bool:
        """Whether no input with these bytes was seen before (then remember them)."""
        digest = hashlib.sha256(data).digest()
        if digest in self.seen:
            return False
        self.seen.add(digest)
        return True

    def add(self, data: bytes) -> None:
        seconds = time.monotonic() - self.started
        path = self.directory / f"id:{len(self.entries):06d},time:{round(1000 * seconds)}"
        path.write_bytes(data)
        self.entries.append((seconds, path))


class NoveltyFilter:
    """The helper's choice: an input is kept if its run on the AFL build is normal and brings
    a new edge or hit-count class to the loop's coverage map (which merges it either way)."""

    def __init__(self, probe: ForkserverProbe):
        self.probe = probe
        self.coverage = CoverageMap()

    def __call__(self, data: bytes) -> bool:
        cov = self.probe.probe_bytes(data)
        return self.coverage.merge(cov) and cov.status is Status.OK


def loop(config: str, symcc: Path, afl: Path, seeds: Path, budget: float,
         scratch: Path) -> dict:
    """The one-core loop `config` (bare, bare+pruning or helper) for `budget` seconds."""
    # The probe's forkserver starts at its first input: only the helper's ever does.
    with ForkserverProbe([str(afl), "@@"], timeout=RUN_TIMEOUT, scratch_dir=scratch) as probe:
        keep = NoveltyFilter(probe) if config == HELPER else (lambda data: True)
        pruning_map = None if config == BARE else scratch / "qsym.map"  # QSYM creates it
        output = scratch / "output"
        started = time.monotonic()
        deadline = started + budget
        queue = LoopQueue(scratch / "queue", started)
        for path in sorted(p for p in seeds.iterdir() if p.is_file()):
            data = path.read_bytes()
            if queue.is_new(data):
                keep(data)  # the helper's map starts from the seeds' coverage
                queue.add(data)
        executions = 0
        stop = "wall-clock budget spent"
        while (remaining := deadline - time.monotonic()) > 0:
            if executions == len(queue.entries):
                stop = "queue exhausted"
                break
            output.mkdir()
            finished = run_symcc(symcc, queue.entries[executions][1], output, pruning_map,
                                 min(RUN_TIMEOUT, remaining))
            if finished or remaining >= RUN_TIMEOUT:  # else cut by the budget: not counted
                executions += 1
                for child in sorted(output.iterdir()):
                    if child.is_file() and not child.name.startswith("."):
                        data = child.read_bytes()
                        if queue.is_new(data) and keep(data):
                            queue.add(data)
            shutil.rmtree(output)
    return {"executions": executions, "seconds": min(time.monotonic() - started, budget),
            "stop": stop, "entries": queue.entries}


# --------------------------------------------------------------------------- campaigns


def add_previous_arguments(parser: argparse.ArgumentParser) -> None:
    """--previous-revision and --previous-tree, which previous_env takes."""
    parser.add_argument("--previous-revision", default=PREVIOUS_REVISION, metavar="REV",
                        help=f"the revision `previous` runs (default {PREVIOUS_REVISION})")
    parser.add_argument("--previous-tree", type=Path, default=PREVIOUS_TREE, metavar="DIR",
                        help="git worktree of the previous revision (added if missing; "
                             f"default {PREVIOUS_TREE})")


def previous_env(tree: Path, previous: str) -> dict:
    """The environment that runs `previous`'s symcc_mpi from the worktree `tree`
    (added if missing, checked, its modules compiled so that no campaign pays that)."""
    if not (tree / "src" / "symcc_mpi").is_dir():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree),
                        previous], check=True, capture_output=True)
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    if not head.startswith(previous):
        sys.exit(f"symcc_scaling: {tree} is at {head[:12]}, not {previous}")
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    where = subprocess.run([sys.executable, "-c", "import symcc_mpi; print(symcc_mpi.__file__)"],
                           env=env, cwd=ROOT, capture_output=True, text=True).stdout.strip()
    if not Path(where).resolve().is_relative_to(tree.resolve()):
        sys.exit(f"symcc_scaling: with PYTHONPATH={tree / 'src'}, symcc_mpi is {where!r}")
    compile_sources(tree)
    return env


def campaign(symcc: Path, afl: Path, seeds: Path, budget: float, scratch: Path,
             env: dict | None) -> dict:
    """One `explore` of two workers (at the previous revision with `env`)."""
    out = scratch / "out"
    stats = run_campaign(out, "--executor", "symcc", "--target", f"{symcc} @@",
                         "--afl-target", f"{afl} @@", "--seeds", str(seeds), "--workers", "2",
                         "--wall-timeout", f"{budget:g}", "--timeout", f"{RUN_TIMEOUT:g}",
                         env=env)
    launched = stats["launch_time"]
    extra = stats.get("extra", {})
    executions = stats["executions"]

    def per_execution(value: float) -> float | None:
        return value / executions if executions else None

    run = {
        "executions": executions,
        "seconds": stats["elapsed"],
        "stop": extra.get("stop_reason", ""),
        "entries": [(p.stat().st_mtime - launched, p) for p in (out / "queue").iterdir()
                    if p.name.startswith("id:")],
        "startup_seconds": stats["start_time"] - launched,
        "master_ms_per_exec": per_execution(1000 * extra["master_loop_cpu_seconds"]),
        # The master's work grows with what the runs generate (each child is checked and
        # triaged): where runs generate many children (toml), its CPU per child is steady
        # across runs whose mix of inputs differs.
        "master_us_per_child": 1e6 * extra["master_loop_cpu_seconds"] / stats["generated"]
        if stats["generated"] else None,
        "journal_bytes_per_exec": per_execution((out / "state" / "done.jsonl").stat().st_size),
        "worker_ms_per_task": extra.get("worker_phases", {}).get("ms_per_task"),
        "per_tier": None,
    }
    if "tiers" in extra:
        run["per_tier"] = extra["tiers"]["per_tier"]
        run["tier_of"] = parent_tiers(out, [path for _, path in run["entries"]])
    return run


def parent_tiers(out: Path, entries: list[Path]) -> dict[Path, str]:
    """Each queue entry's tier: that of the done record whose "published" lists it (no
    "tier": 1); `seed` for the entries no record published."""
    tier_of_child: dict[str, str] = {}
    for record in CampaignDir(out).read_done():
        for child in record.get("published", ()):
            tier_of_child.setdefault(child, str(record.get("tier", 1)))
    return {path: tier_of_child.get(hashlib.sha256(path.read_bytes()).hexdigest(), "seed")
            for path in entries}


# --------------------------------------------------------------------------- measure


def coverage_series(run: dict, afl: Path, budget: float,
                    scratch: Path) -> tuple[list[tuple[float, int]], Counter]:
    """Distinct AFL edges of the normal runs of the inputs found within the budget, probed
    in the order found: a step series (10 ms grain), and the edges each tier's finds added
    (campaigns with tiers)."""
    edges: set[int] = set()
    series = [(0.0, 0)]
    added_by_tier: Counter = Counter()
    tier_of = run.get("tier_of", {})
    with ForkserverProbe([str(afl), "@@"], timeout=RUN_TIMEOUT, scratch_dir=scratch) as probe:
        for found, path in sorted(entry for entry in run["entries"] if entry[0] <= budget):
            cov = probe.probe_bytes(path.read_bytes())
            before = len(edges)
            if cov.status is Status.OK:
                edges.update(index for index, _ in cov.pairs())
            if len(edges) == before:
                continue
            if path in tier_of:
                added_by_tier[tier_of[path]] += len(edges) - before
            instant = round(max(found, 0.0), 2)
            if series[-1][0] == instant:
                series.pop()
            series.append((instant, len(edges)))
    return series, added_by_tier


def measure(config: str, case: dict, budget: float, env: dict | None) -> dict:
    """Run `config` on `case` in a scratch directory of its own, then measure its coverage."""
    with tempfile.TemporaryDirectory(prefix=f"symcc-scaling-{config}-",
                                     dir=default_root()) as name:
        scratch = Path(name)
        if config in CAMPAIGNS:
            run = campaign(case["symcc"], case["afl"], case["seeds"], budget, scratch,
                           env if config == PREVIOUS else None)
        else:
            run = loop(config, case["symcc"], case["afl"], case["seeds"], budget, scratch)
        run["series"], run["added_by_tier"] = coverage_series(run, case["afl"], budget,
                                                              scratch)
        if "tier_of" in run:
            run["finds_by_tier"] = Counter(run.pop("tier_of").values())
        run["queued"] = sum(1 for found, _ in run.pop("entries") if found <= budget)
    return run


# --------------------------------------------------------------------------- figures


def figures(config: str, run: dict, runs: dict[str, dict], budget: float) -> dict:
    """The figures of one configuration, against bare, bare+pruning and helper."""
    def rate(name: str) -> float:
        return runs[name]["executions"] / runs[name]["seconds"] if runs[name]["seconds"] else 0.0

    def ratio(value: float | None, base: float | None) -> float | None:
        return value / base if value is not None and base else None

    helper_edges = edges_at(runs[HELPER]["series"], budget)
    helper_time = time_to(runs[HELPER]["series"], helper_edges, budget)
    reach_helper = time_to(run["series"], helper_edges, budget)
    row = {
        "config": config,
        "executions": run["executions"],
        "execs_per_sec": rate(config),
        "speed_vs_bare_pruning": ratio(rate(config), rate(PRUNING)),
        "speed_vs_bare": ratio(rate(config), rate(BARE)),
        "master_ms_per_exec": run.get("master_ms_per_exec"),
        "master_us_per_child": run.get("master_us_per_child"),
        "edges": edges_at(run["series"], budget),
        "seconds_to_helper_edges": reach_helper,
        "ratio_to_helper_time": ratio(reach_helper, helper_time),
        "seconds_to_bare_pruning_edges": time_to(
            run["series"], edges_at(runs[PRUNING]["series"], budget), budget),
        "journal_bytes_per_exec": run.get("journal_bytes_per_exec"),
        "startup_seconds": run.get("startup_seconds"),
        "queued": run["queued"],
        "stop": run["stop"],
        "worker_ms_per_task": run.get("worker_ms_per_task"),
    }
    if run.get("per_tier") is not None:
        row["tiers"] = {"per_tier": run["per_tier"],
                        "finds_by_parent_tier": dict(run["finds_by_tier"]),
                        "edges_added_by_parent_tier": dict(run["added_by_tier"])}
    return row


def _opt(value, fmt: str = "{:.2f}", none: str = "-") -> str:
    return none if value is None else fmt.format(value)


COLUMNS = ["config", "execs", "execs/s", "x_bare+pruning", "x_bare", "master_ms/exec",
           "master_us/child", "edges", "t_helper_edges_s", "x_helper_time",
           "t_bare+pruning_edges_s", "journal_B/exec", "startup_s", "queued", "stopped"]


def _row(f: dict) -> list:
    return [f["config"], f["executions"], f"{f['execs_per_sec']:.2f}",
            _opt(f["speed_vs_bare_pruning"], "{:.2f}x"), _opt(f["speed_vs_bare"], "{:.2f}x"),
            _opt(f["master_ms_per_exec"]), _opt(f["master_us_per_child"], "{:.0f}"), f["edges"],
            _opt(f["seconds_to_helper_edges"], "{:.1f}", "never"),
            _opt(f["ratio_to_helper_time"], "{:.2f}x", "never"),
            _opt(f["seconds_to_bare_pruning_edges"], "{:.1f}", "never"),
            _opt(f["journal_bytes_per_exec"], "{:.0f}"), _opt(f["startup_seconds"], "{:.1f}"),
            f["queued"], f["stop"]]


def print_details(table: list[dict]) -> None:
    """The campaigns' worker phases, and `this`'s tiers."""
    print("worker ms per task, by phase:")
    print_table(["config", *PHASES],
                [[f["config"], *(_opt((f["worker_ms_per_task"] or {}).get(p)) for p in PHASES)]
                 for f in table if f["config"] in CAMPAIGNS])
    tiers = next(f for f in table if f["config"] == THIS).get("tiers")
    if tiers is None:
        return
    print("this, per tier: stats.json's executions, finds, edges; finds by their parent's tier "
          "(done records) and the edges they added in the measure:")
    per_tier, finds, added = (tiers["per_tier"], tiers["finds_by_parent_tier"],
                              tiers["edges_added_by_parent_tier"])
    print_table(["tier", "executions", "finds", "edges", "finds_by_parent", "edges_added"],
                [[tier, *(per_tier.get(tier, {}).get(k, "-")
                          for k in ("executions", "finds", "edges")),
                  finds.get(tier, 0), added.get(tier, 0)] for tier in ("seed", "1", "2", "3")])


def goals(table: list[dict]) -> dict[str, bool]:
    """Print G1-G3 for one target and seed set; whether each is met."""
    f = {row["config"]: row for row in table}
    this = f[THIS]
    speed, master = this["speed_vs_bare_pruning"], this["master_ms_per_exec"]
    ratio, journal = this["ratio_to_helper_time"], this["journal_bytes_per_exec"]
    others = {name: f[name]["edges"] for name in (PRUNING, BARE, PREVIOUS)}
    met = {
        "G1": speed is not None and speed >= SPEEDUP_TARGET
        and master is not None and master <= MASTER_MS_TARGET,
        "G2": all(this["edges"] >= edges for edges in others.values())
        and ratio is not None and ratio <= TIME_RATIO_TARGET,
        "G3": journal is not None and journal <= JOURNAL_BYTES_TARGET,
    }
    word = {True: "met", False: "MISSED"}
    helper = f[HELPER]
    print(f"G1 {word[met['G1']]}: this {this['execs_per_sec']:.2f} execs/s = "
          f"{_opt(speed, '{:.2f}x')} bare+pruning's (>= {SPEEDUP_TARGET}x); master "
          f"{_opt(master)} ms CPU per execution (<= {MASTER_MS_TARGET:g}; "
          f"{_opt(this['master_us_per_child'], '{:.0f}')} us per generated child)")
    print(f"G2 {word[met['G2']]}: this ends with {this['edges']} edges ("
          + ", ".join(f"{name} {edges}" for name, edges in others.items())
          + f": >= each); reaches helper's {helper['edges']} in "
          f"{_opt(this['seconds_to_helper_edges'], '{:.1f} s', 'never')} = "
          f"{_opt(ratio, '{:.2f}x', 'never')} helper's "
          f"{_opt(helper['seconds_to_helper_edges'], '{:.1f} s')} (<= {TIME_RATIO_TARGET}x)")
    print(f"G3 {word[met['G3']]}: this writes {_opt(journal, '{:.0f}')} journal bytes per "
          f"execution (<= {JOURNAL_BYTES_TARGET}; previous "
          f"{_opt(f[PREVIOUS]['journal_bytes_per_exec'], '{:.0f}')})")
    return met


def _compact(series: list[tuple[float, int]]) -> list[list]:
    return [[t, e] for t, e in series]


# --------------------------------------------------------------------------- plot


def plot(name: str, runs: dict[str, dict], budget: float) -> tuple[Path, str]:
    """Edges over time, one step line per configuration, into benchmarks/results/; returns
    the image's path and a text rendering."""
    blocks, curves = [], []
    # From a little below the seeds' coverage: the climb is where the configurations differ.
    floor = int(0.9 * min((run["series"][1][1] for run in runs.values()
                           if len(run["series"]) > 1), default=0))
    for i, (config, run) in enumerate(runs.items()):
        points = [*run["series"], (budget, edges_at(run["series"], budget))]
        blocks.append(f"$d{i} << EOD\n" + "".join(f"{t:.2f} {e}\n" for t, e in points) + "EOD")
        width = 3 if config in (HELPER, THIS) else 1.5
        curves.append(f"$d{i} with steps lw {width} title '{config}'")
    body = "\n".join(blocks) + (
        f"\nset title 'symcc\\_scaling: {name}, {budget:g} s each (edges vs seconds since "
        "launch)'\nset xlabel 'seconds'\nset ylabel 'AFL edges (ForkserverProbe)'\n"
        f"set key bottom right\nset xrange [0:{budget:g}]\nset yrange [{floor:d}:*]\n"
        "set grid\nplot " + ", \\\n     ".join(curves) + "\n")
    terminal, ext = gnuplot_terminal()
    stem = f"-{name.replace('/', '-')}"
    image = results_file("symcc_scaling", f"{stem}.{ext}")
    script = results_file("symcc_scaling", f"{stem}.gp")
    script.write_text(f"set terminal {terminal} size 1000,600\nset output '{image}'\n{body}")
    subprocess.run(["gnuplot", str(script)], check=True, stdin=subprocess.DEVNULL)
    text = subprocess.run(["gnuplot"], input=f"set terminal dumb size 110,32\n{body}",
                          capture_output=True, text=True, check=True).stdout
    results_file("symcc_scaling", f"{stem}-plot.txt").write_text(text)
    return image, text


# --------------------------------------------------------------------------- main


def warm_up(symcc: Path, afl: Path, seeds: Path) -> None:
    """One untimed run of each build, and the campaigns' query-counter library built, so
    that the first configuration measured pays no first-run cost the others do not."""
    preload_library()
    seed = min(p for p in seeds.iterdir() if p.is_file())
    with tempfile.TemporaryDirectory(dir=default_root()) as name:
        (Path(name) / "output").mkdir()
        run_symcc(symcc, seed, Path(name) / "output", None, RUN_TIMEOUT)
        with ForkserverProbe([str(afl), "@@"], timeout=RUN_TIMEOUT,
                             scratch_dir=Path(name)) as probe:
            probe.probe([seed])


def cases(targets: dict, seed_sets: list[str], examples: Path) -> tuple[list[dict], list[str]]:
    """Each (target, seed set) to run, and a line for each skipped for want of its seeds."""
    found, skipped = [], []
    for target, (symcc, afl, _) in targets.items():
        for seed_set in seed_sets:
            seeds = examples / "seeds" / f"{target}{SEED_SETS[seed_set]}"
            if seeds.is_dir() and any(p.is_file() for p in seeds.iterdir()):
                found.append({"name": f"{target}/{seed_set}", "symcc": symcc, "afl": afl,
                              "seeds": seeds})
            else:
                skipped.append(f"{target}/{seed_set}: skipped, {seeds} is missing or empty")
    return found, skipped


def run_case(case: dict, budget: float, env: dict) -> dict:
    """Every configuration on one target and seed set, its figures printed; its results."""
    warm_up(case["symcc"], case["afl"], case["seeds"])
    runs = {}
    for config in CONFIGURATIONS:
        print(f"[{case['name']}] {config} ...", flush=True)
        runs[config] = measure(config, case, budget, env)
    table = [figures(config, run, runs, budget) for config, run in runs.items()]
    print(f"\n{case['name']} ({case['seeds']}): {budget:g} s each; edges measured afterwards "
          "with ForkserverProbe; times since launch")
    print_table(COLUMNS, [_row(f) for f in table])
    print_details(table)
    image, text = plot(case["name"], runs, budget)
    print(text.rstrip("\n"))
    print(f"plot: {image}")
    met = goals(table)
    print()
    return {"goals": met, "plot": str(image), "configs": table,
            "series": {config: _compact(run["series"]) for config, run in runs.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET, metavar="SECONDS",
                        help=f"wall budget of every configuration (default {DEFAULT_BUDGET:g})")
    parser.add_argument("--target", action="append", metavar="NAME",
                        help="example target (repeatable; default: "
                             + ", ".join(DEFAULT_TARGETS) + ")")
    parser.add_argument("--seeds", choices=("small", "large", "both"), default="both",
                        help="seed sets: examples/seeds/NAME, NAME-large or both (default)")
    parser.add_argument("--examples", type=Path, default=EXAMPLES, metavar="DIR",
                        help="take build/NAME.symcc, build/NAME.afl and seeds/NAME*/ from DIR "
                             "(default examples/, after `make -s -C examples`)")
    add_previous_arguments(parser)
    args = parser.parse_args()
    if not args.budget > 0:
        parser.error("--budget must be positive")
    with keep_stdout("symcc_scaling") as copy:
        env = previous_env(args.previous_tree, args.previous_revision)
        compile_sources()
        targets = build_targets("symcc_scaling", args.target or list(DEFAULT_TARGETS),
                                args.examples)
        todo, skipped = cases(targets, ["small", "large"] if args.seeds == "both"
                              else [args.seeds], args.examples)
        load = os.getloadavg()
        print(f"symcc_scaling: {len(todo)} target/seed set(s) x {len(CONFIGURATIONS)} "
              f"configurations, {args.budget:g} s each; this = {revision()}, previous = "
              f"{args.previous_revision}; {os.cpu_count()} CPUs, load average at start "
              f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        for line in skipped:
            print(line)
        results = {case["name"]: run_case(case, args.budget, env) for case in todo}
        end_load = os.getloadavg()
        print(f"load average at the end {end_load[0]:.2f} {end_load[1]:.2f} {end_load[2]:.2f}")
        for name, result in results.items():
            print(f"{name}: " + ", ".join(f"{goal} {'met' if ok else 'MISSED'}"
                                          for goal, ok in result["goals"].items()))
        print(f"output kept in {copy}")
        print(json.dumps({
            "benchmark": "symcc_scaling", "revision": revision(),
            "previous_revision": args.previous_revision, "budget_seconds": args.budget,
            "cpus": os.cpu_count(), "load_average_at_start": list(load),
            "load_average_at_end": list(end_load), "skipped": skipped,
            "targets": {"speedup_vs_bare_pruning": SPEEDUP_TARGET,
                        "master_ms_per_exec": MASTER_MS_TARGET,
                        "ratio_to_helper_time": TIME_RATIO_TARGET,
                        "journal_bytes_per_exec": JOURNAL_BYTES_TARGET},
            "goal_met": all(all(r["goals"].values()) for r in results.values())
            if results else None,
            "cases": results}))


if __name__ == "__main__":
    main()
