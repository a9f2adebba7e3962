"""Shared by the benchmarks: run one real campaign through the CLI and read its figures."""

from __future__ import annotations

import functools
import io
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.layout import done_journals
from symcc_mpi.executors.symcc import HOW_TO_GET_SYMCC

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
RESULTS = ROOT / "benchmarks" / "results"
CLI = [sys.executable, "-m", "symcc_mpi"]


def compile_sources(tree: Path = ROOT) -> None:
    """Byte-compile `tree`'s symcc_mpi ahead, so that no campaign's ranks compile it at start
    (with PYTHONDONTWRITEBYTECODE set, each rank of each campaign would, every time): a
    comparison of two trees compiles both."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "src")], check=True)


def done_records(out: Path) -> list[dict]:
    """Every master's done records of the campaign in `out` (not its work or epoch records)."""
    campaign = CampaignDir(out)
    return [record for path in done_journals(out)
            for record in campaign.inspect_journal(path)[0] if "kind" not in record]


def run_campaign(out: Path, *args: str, env: dict | None = None) -> dict:
    """One `explore` to its end; its stats.json, with `command_seconds` (the launch to the
    exit) and `launch_time` (time.time() just before the launch)."""
    launched = time.time()
    started = time.monotonic()
    process = subprocess.run([*CLI, "explore", "--out", str(out), "--no-live", *args],
                             capture_output=True, text=True, cwd=ROOT, env=env)
    if process.returncode != 0:
        sys.exit(f"campaign failed ({process.returncode}):\n{process.stdout}\n{process.stderr}")
    stats = json.loads((out / "stats.json").read_text())
    stats["command_seconds"] = time.monotonic() - started
    stats["launch_time"] = launched
    return stats


def run_campaign_sampled(out: Path, *args: str, env: dict | None = None,
                         interval: float = 0.2,
                         watch_tree: bool = False) -> tuple[dict, float, list[dict]]:
    """run_campaign, also reading OUT/stats.json every `interval` seconds while it runs.

    Returns (final stats, the wall-clock time.time() of the launch, every distinct
    stats.json snapshot seen, oldest first). The master rewrites stats.json atomically about
    once a second, and each snapshot carries its own `last_update` timestamp.

    The final stats also carry `tree_cpu_seconds`: the user + system CPU of the launcher and
    of every process under it that was waited for (mpiexec, its ranks, their target runs),
    from getrusage(RUSAGE_CHILDREN) around the launch. With `watch_tree`, the same process
    tree is read from /proc at each sample as a cross-check (ProcessTreeWatch).
    """
    stats_path = out / "stats.json"
    samples: list[dict] = []
    with tempfile.TemporaryFile() as log:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        launched = time.time()
        started = time.monotonic()
        process = subprocess.Popen([*CLI, "explore", "--out", str(out), "--no-live", *args],
                                   stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        watch = ProcessTreeWatch(process.pid) if watch_tree else None
        while process.poll() is None:
            time.sleep(interval)
            if watch is not None:
                watch.sample()
            try:
                snapshot = json.loads(stats_path.read_text())
            except (OSError, ValueError):
                continue
            if not samples or snapshot.get("last_update") != samples[-1].get("last_update"):
                samples.append(snapshot)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if process.returncode != 0:
            log.seek(0)
            sys.exit(f"campaign failed ({process.returncode}):\n"
                     f"{log.read().decode(errors='replace')[-4000:]}")
    stats = json.loads(stats_path.read_text())
    stats["command_seconds"] = time.monotonic() - started
    stats["tree_cpu_seconds"] = (after.ru_utime - before.ru_utime
                                 + after.ru_stime - before.ru_stime)
    if watch is not None:
        stats["tree_cpu_seconds_seen"] = watch.cpu_seconds
        stats["tree_processes_escaped"] = dict(Counter(watch.escaped_members.values()))
    samples.append(stats)
    return stats, launched, samples


class ProcessTreeWatch:
    """The CPU of a process tree as /proc shows it while it runs: a lower bound to check
    getrusage(RUSAGE_CHILDREN) against.

    Each process's own user + system time and that of the children it has waited for
    (cutime, cstime) count once: a live process is in no live ancestor's cutime. A process
    once seen in the tree that is later outside it (reparented: its parent exited without
    waiting for it) is named in `escaped_members`; its CPU is in the figure here, but would be
    missing from RUSAGE_CHILDREN, so the two would disagree.
    """

    CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

    def __init__(self, root: int):
        self.root = root
        self.members: set[tuple[int, int]] = set()  # (pid, start time): pids are reused
        self.cpu_seconds = 0.0  # the highest total seen
        self.escaped_members: dict[tuple[int, int], str] = {}  # their command names

    def sample(self) -> None:
        processes = {}  # pid -> (parent pid, start time, CPU ticks of it and its waited ones,
        #                      command name)
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    text = Path(entry.path, "stat").read_text()
                except OSError:
                    continue  # gone meanwhile
                fields = text[text.rfind(")") + 2:].split()  # after the command's name
                processes[int(entry.name)] = (int(fields[1]), int(fields[19]),
                                              sum(int(f) for f in fields[11:15]),
                                              text[text.find("(") + 1:text.rfind(")")])
        children: dict[int, list[int]] = {}
        for pid, (parent, *_) in processes.items():
            children.setdefault(parent, []).append(pid)
        in_tree, stack = set(), [self.root] if self.root in processes else []
        while stack:
            pid = stack.pop()
            in_tree.add(pid)
            stack.extend(children.get(pid, ()))
        self.members |= {(pid, processes[pid][1]) for pid in in_tree}
        alive = {(pid, started): ticks for pid, (_, started, ticks, _) in processes.items()}
        self.escaped_members.update({member: processes[member[0]][3] for member in self.members
                                     if member in alive and member[0] not in in_tree})
        ticks = sum(alive[member] for member in self.members if member in alive)
        self.cpu_seconds = max(self.cpu_seconds, ticks / self.CLOCK_TICKS)


def step_series(points) -> list[tuple[float, int]]:
    """(time, edges) points as a rising step series from (0, 0)."""
    series = [(0.0, 0)]
    for t, edges in sorted(points):
        if edges > series[-1][1]:
            series.append((t, edges))
    return series


def reported_series(out: Path, stats: dict, launched: float,
                    samples: list[dict]) -> list[tuple[float, int]]:
    """Edges over time as the campaign reported them: plot_data and stats.json (~1 s grain).

    plot_data rows carry whole seconds since the master started (truncated): each is placed
    at the end of its second. stats.json snapshots carry their own `last_update`.
    """
    points = [(s["last_update"] - launched, s["edges_found"]) for s in samples
              if "last_update" in s]
    start = stats["start_time"] - launched
    for line in (out / "plot_data").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            cells = [c.strip() for c in line.split(",")]
            points.append((start + int(cells[0]) + 1.0, int(cells[-1])))
    return step_series(points)


def edges_at(series: list[tuple[float, int]], t: float) -> int:
    return max((e for s, e in series if s <= t), default=0)


def time_to(series: list[tuple[float, int]], edges: int,
            budget: float = math.inf) -> float | None:
    """When a step series first reaches `edges`, if it does within `budget`."""
    return next((s for s, e in series if e >= edges and s <= budget), None)


@functools.cache
def revision() -> str:
    """This checkout's short commit, `-dirty` if its tracked files differ from it (as at the
    first call: one revision per run)."""
    return subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty",
                           "--abbrev=7"], capture_output=True, text=True,
                          check=True).stdout.strip()


@functools.cache
def _run_stamp(benchmark: str) -> str:
    """YYYY-MM-DD-REV, then -2, -3, ... if an earlier run of that day and revision kept its
    output already."""
    stamp = base = f"{time.strftime('%Y-%m-%d')}-{revision()}"
    number = 1
    while (RESULTS / f"{benchmark}-{stamp}.txt").exists():
        number += 1
        stamp = f"{base}-{number}"
    return stamp


def results_file(benchmark: str, suffix: str = "") -> Path:
    """benchmarks/results/BENCHMARK-YYYY-MM-DD-REV`suffix`: one date and revision per run
    (those of the first call), so that a run's output, plots and scripts go together."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS / f"{benchmark}-{_run_stamp(benchmark)}{suffix}"


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


@contextmanager
def keep_stdout(benchmark: str) -> Iterator[Path]:
    """Everything printed meanwhile also goes to results_file(benchmark, ".txt")."""
    path = results_file(benchmark, ".txt")
    with open(path, "w") as copy:
        terminal, sys.stdout = sys.stdout, _Tee(sys.stdout, copy)
        try:
            yield path
        finally:
            sys.stdout = terminal


def print_table(columns: list[str], rows: list[list]) -> None:
    widths = [max(len(str(c)), *(len(_cell(r[i])) for r in rows)) for i, c in enumerate(columns)]
    print("  ".join(str(c).rjust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(_cell(v).rjust(w) for v, w in zip(row, widths, strict=True)))


def _cell(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def gnuplot_terminal() -> tuple[str, str]:
    """The best image terminal this gnuplot has, and its file extension."""
    listing = subprocess.run(["gnuplot", "-e", "set terminal"], capture_output=True, text=True,
                             stdin=subprocess.DEVNULL).stderr
    names = {line.split()[0] for line in listing.splitlines() if line.strip()}
    for terminal, ext in (("pngcairo", "png"), ("png", "png"), ("svg", "svg")):
        if terminal in names:
            return terminal, ext
    return "dumb", "txt"


def make_examples() -> None:
    """`make -s -C examples` with SYMCC as the top Makefile's `examples` target sets it (after
    its `symcc` target, which builds SymCC once per machine), without its venv set-up step."""
    make = ["make", "-s", "--no-print-directory", "-C", str(ROOT)]
    subprocess.run([*make, "symcc"], check=True)
    home = subprocess.run([*make, "--eval", "print-symcc-home: ; @echo $(SYMCC_HOME)",
                           "print-symcc-home"], capture_output=True, text=True).stdout.strip()
    symcc = Path(home, "bin", "symcc") if home else None
    subprocess.run(["make", "-s", "-C", str(EXAMPLES),
                    *([f"SYMCC={symcc}"] if symcc and symcc.is_file() else [])], check=True)


def build_targets(benchmark: str, targets: list[str],
                  examples: Path) -> dict[str, tuple[Path, Path, Path]]:
    """Each target's (SymCC build, AFL build, seed directory), after make_examples()."""
    make_examples()
    found = {}
    for target in targets:
        symcc = examples / "build" / f"{target}.symcc"
        afl = examples / "build" / f"{target}.afl"
        seeds = examples / "seeds" / target
        if not symcc.is_file():
            sys.exit(f"{benchmark}: {symcc} is missing: `make examples` builds it once SymCC is "
                     f"built (SymCC: {HOW_TO_GET_SYMCC})")
        if not afl.is_file() or not seeds.is_dir():
            sys.exit(f"{benchmark}: {afl} or {seeds} is missing: `make examples` "
                     "(with afl++ installed) builds it")
        found[target] = (symcc, afl, seeds)
    return found
