"""Shared by the benchmarks: run one real campaign through the CLI and read its figures."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
CLI = [sys.executable, "-m", "symcc_mpi"]


def run_campaign(out: Path, *args: str, env: dict | None = None) -> dict:
    started = time.monotonic()
    process = subprocess.run([*CLI, "explore", "--out", str(out), "--no-live", *args],
                             capture_output=True, text=True, cwd=ROOT, env=env)
    if process.returncode != 0:
        sys.exit(f"campaign failed ({process.returncode}):\n{process.stdout}\n{process.stderr}")
    stats = json.loads((out / "stats.json").read_text())
    stats["command_seconds"] = time.monotonic() - started
    return stats


def run_campaign_sampled(out: Path, *args: str, env: dict | None = None,
                         interval: float = 0.2) -> tuple[dict, float, list[dict]]:
    """run_campaign, also reading OUT/stats.json every `interval` seconds while it runs.

    Returns (final stats, the wall-clock time.time() of the launch, every distinct
    stats.json snapshot seen, oldest first). The master rewrites stats.json atomically about
    once a second, and each snapshot carries its own `last_update` timestamp.
    """
    stats_path = out / "stats.json"
    samples: list[dict] = []
    with tempfile.TemporaryFile() as log:
        launched = time.time()
        started = time.monotonic()
        process = subprocess.Popen([*CLI, "explore", "--out", str(out), "--no-live", *args],
                                   stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        while process.poll() is None:
            time.sleep(interval)
            try:
                snapshot = json.loads(stats_path.read_text())
            except (OSError, ValueError):
                continue
            if not samples or snapshot.get("last_update") != samples[-1].get("last_update"):
                samples.append(snapshot)
        if process.returncode != 0:
            log.seek(0)
            sys.exit(f"campaign failed ({process.returncode}):\n"
                     f"{log.read().decode(errors='replace')[-4000:]}")
    stats = json.loads(stats_path.read_text())
    stats["command_seconds"] = time.monotonic() - started
    samples.append(stats)
    return stats, launched, samples


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
            sys.exit(f"{benchmark}: {symcc} is missing: build it with `make examples` "
                     "(which builds SymCC from /work/shared/symcc once)")
        if not afl.is_file() or not seeds.is_dir():
            sys.exit(f"{benchmark}: {afl} or {seeds} is missing: `make examples` "
                     "(with afl++ installed) builds it")
        found[target] = (symcc, afl, seeds)
    return found
