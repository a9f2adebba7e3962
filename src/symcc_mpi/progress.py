"""What a person sees: the master's periodic reports, the launcher's live view, `status`."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import deque
from dataclasses import asdict
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .config import CampaignConfig
from .corpus import MARKER, CampaignError, write_atomic

STATS_FILE = "stats.json"


def master_snapshot(master) -> dict:
    stats = master.stats
    scheduler = master.scheduler
    now = time.time()
    elapsed = max(now - stats.start_time, 1e-9)
    per_worker = {str(rank): asdict(w) for rank, w in stats.per_worker.items()}
    figures = {key: value for key, value in asdict(stats).items() if key != "per_worker"}
    figures.update(
        now=now,
        elapsed=elapsed,
        execs_per_sec=stats.executions / elapsed,
        pending=len(scheduler.frontier),
        in_flight=len(scheduler.active),
        corpus_count=len(scheduler.known),
        analysed_total=len(scheduler.done),
        deferred=len(scheduler.deferred),
        phase=master.phase.value,
        scheduler=asdict(scheduler.stats),
        edges_found=master.triage.edges_covered if master.triage is not None else None,
        per_worker=per_worker,
        master_pid=os.getpid(),
        master_loop_seconds=time.monotonic() - master.loop_started,
        master_loop_cpu_seconds=time.process_time() - master.loop_cpu_start,
        master_task_time=master.task_time_summary(),
    )
    return figures


class CampaignReporter:
    """Called by the master once a second and at the end: writes stats.json and AFL files."""

    def __init__(self, config: CampaignConfig):
        self.config = config
        self.launched = os.environ.get("SYMCC_MPI_LAUNCHED") == "1"
        self.next_line = 0.0

    def __call__(self, master, final: bool) -> None:
        snapshot = master_snapshot(master)
        write_atomic(self.config.out / STATS_FILE, json.dumps(snapshot, indent=1).encode())
        if not self.launched and (final or time.monotonic() >= self.next_line):
            # Under a user's own mpiexec nobody renders the live view: log a line instead.
            print(progress_line(snapshot), file=sys.stderr, flush=True)
            self.next_line = time.monotonic() + 10


def read_snapshot(out: Path) -> dict | None:
    try:
        return json.loads((out / STATS_FILE).read_text())
    except (OSError, ValueError):
        return None


def progress_line(s: dict) -> str:
    return (f"[{_duration(s['elapsed'])}] execs {s['executions']} "
            f"({s['execs_per_sec']:.1f}/s)  frontier {s['pending']}  corpus {s['corpus_count']}"
            f"  crashes {s['crashes']}  hangs {s['hangs']}")


def render_live(s: dict):
    table = Table.grid(padding=(0, 2))
    for _ in range(4):
        table.add_column()
    table.add_row("elapsed", _duration(s["elapsed"]), "phase", s["phase"])
    table.add_row("executions", str(s["executions"]), "rate", f"{s['execs_per_sec']:.1f}/s")
    table.add_row("frontier", str(s["pending"]), "in flight", str(s["in_flight"]))
    table.add_row("corpus", str(s["corpus_count"]), "generated", str(s["generated"]))
    table.add_row("crashes", Text(str(s["crashes"]), style="bold red" if s["crashes"] else ""),
                  "hangs", str(s["hangs"]))
    if s.get("edges_found") is not None:
        table.add_row("edges", str(s["edges_found"]), "", "")
    return Panel(table, title="symcc-mpi explore", expand=False)


def summary_table(s: dict) -> Table:
    table = Table(title="campaign summary")
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = [
        ("stopped because", s.get("stop_reason") or "?"),
        ("elapsed", _duration(s["elapsed"])),
        ("executions", s["executions"]),
        ("executions/s", f"{s['execs_per_sec']:.2f}"),
        ("generated inputs", s["generated"]),
        ("unique generated", s["unique"]),
        ("kept (corpus)", s["corpus_count"]),
        ("frontier left", s["pending"]),
        ("crashes", s["crashes"]),
        ("hangs", s["hangs"]),
        ("executor time", f"{s['executor_time']:.1f} s"),
        ("solver time", f"{s['solver_time']:.1f} s"),
    ]
    if s.get("edges_found") is not None:
        rows.append(("edges", s["edges_found"]))
    for name, value in rows:
        table.add_row(name, str(value))
    for rank, worker in sorted(s["per_worker"].items(), key=lambda kv: int(kv[0])):
        table.add_row(f"worker {rank} executions", str(worker["executions"]))
    return table


def crash_listing(out: Path, limit: int = 5) -> list[str]:
    lines = []
    crashes = sorted(p for p in (out / "crashes").iterdir() if p.name.startswith("id:"))
    for path in crashes[:limit]:
        lines.append(f"{path}: {path.read_bytes()[:64]!r}")
    return lines


class LiveView:
    """The launcher's display: a live panel on a terminal, progress lines otherwise."""

    def __init__(self, out: Path, *, live: bool):
        self.out = out
        self.console = Console(stderr=False)
        self.live = Live(console=self.console, refresh_per_second=2, transient=True) \
            if live else None
        self.recent = deque(maxlen=200)
        self.next_line = 0.0

    def __enter__(self):
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def log(self, line: str) -> None:
        self.recent.append(line)
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def note(self, line: str) -> None:
        self.console.print(f"[yellow]{line}[/yellow]")

    def refresh(self) -> None:
        snapshot = read_snapshot(self.out)
        if snapshot is None:
            return
        if self.live is not None:
            self.live.update(render_live(snapshot))
        elif time.monotonic() >= self.next_line:
            self.console.print(progress_line(snapshot), markup=False, highlight=False)
            self.next_line = time.monotonic() + 5

    def summary(self) -> None:
        snapshot = read_snapshot(self.out)
        if snapshot is None:
            return
        self.console.print(summary_table(snapshot))
        listing = crash_listing(self.out)
        if listing:
            self.console.print("[bold red]crashing inputs:[/bold red]")
            for line in listing:
                self.console.print(line, markup=False, highlight=False)


def print_status(out: Path) -> None:
    if not (out / MARKER).is_file():
        raise CampaignError(f"{out} holds no symcc-mpi campaign")
    snapshot = read_snapshot(out)
    if snapshot is None:
        raise CampaignError(f"{out / STATS_FILE} is missing or unreadable")
    console = Console()
    console.print(summary_table(snapshot))
    for line in crash_listing(out):
        console.print(line, markup=False, highlight=False)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
