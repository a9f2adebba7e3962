"""What a person sees: the master's periodic reports, the launcher's live view, `status`."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.live import Live

from symcc_mpi.campaign.layout import MARKER, CampaignError
from symcc_mpi.campaign.report import CampaignSnapshot, ReportWriter, snapshot_from_stats
from symcc_mpi.config import CampaignConfig, launch_environment
from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.job.live import example_digest, render_live, summary_table

STATS_FILE = "stats.json"


def master_snapshot(master) -> CampaignSnapshot:
    """The master's figures; with several masters, root's are the whole campaign's."""
    snapshot = _own_snapshot(master)
    federation = master.federation
    if federation is None:
        return snapshot
    snapshot.extra["federation"] = federation.statistics().to_json()
    snapshot.extra.update(master_index=federation.index,
                          world_ranks=list(master.ranks.world_ranks))
    if not federation.root:
        return snapshot
    from symcc_mpi.federation.figures import combine, plain

    # Root's own figures and what it alone holds, on record for a successor of its.
    federation.keep_root_figures(plain(asdict(snapshot)), master.stopping.budget_start)
    return combine(snapshot, federation.figures, federation.departed,
                   federation.roster.successions)


def _own_snapshot(master) -> CampaignSnapshot:
    stats, frontier, config = master.stats, master.frontier, master.config
    coverage = master.triage
    return CampaignSnapshot(
        start_time=stats.start_time,
        now=SYSTEM_CLOCK.time(),
        executions=stats.executions,
        generated=stats.generated,
        unique=stats.unique,
        interesting=stats.interesting,
        corpus_count=len(frontier.known),
        # afl-whatsup shows cur_item/corpus_count as how far through the queue it is.
        cur_item=min(len(frontier.done), len(frontier.known)),
        pending=len(frontier),
        max_depth=stats.max_depth,
        crashes=stats.crashes,
        hangs=stats.hangs,
        crashing_runs=stats.crashing_runs,
        hanging_runs=stats.hanging_runs,
        last_find=stats.last_find or None,
        last_crash=stats.last_crash or None,
        last_hang=stats.last_hang or None,
        executor_time=stats.executor_time,
        solver_time=stats.solver_time,
        edges_found=coverage.edges_covered if coverage is not None else 0,
        map_size=coverage.map_size if coverage is not None else 0,
        timeout_ms=int(config.timeout * 1000),
        workers=len(master.workers),
        per_worker={rank: {k: v for k, v in asdict(w).items() if v != ""}
                    for rank, w in stats.per_worker.items()},
        command_line=" ".join(config.target),
        extra={
            "stop_reason": stats.stop_reason,
            "phase": master.phase.value,
            "in_flight": master.dispatch.in_flight,
            "analysed_total": len(frontier.done),
            "resumed_done": stats.resumed_done,
            "executor_errors": stats.executor_errors,
            "executor_failures": _failures_by_reason(stats.executor_failures, master.campaign),
            "malformed_messages": stats.malformed_messages,
            "invalid_results": dict(stats.invalid_results),
            "staging_rejected": stats.staging_rejected,
            "packs_over_mpi": master.uploads.figures(),
            "first_crash_seconds": stats.first_crash_seconds,
            "startup_seconds": stats.startup_seconds,
            "dispatch": asdict(master.dispatch.statistics()),
            "splitting": master.split.stats.figures(),
            "solver": {
                "pruning": config.pruning if config.prunes else "off",
                "queries": stats.solver_queries,
                "skipped": stats.queries_skipped,
                "skipped_known": stats.executions - stats.runs_without_counts > 0,
            },
            "pruning": asdict(master.pruning.statistics()) if master.pruning else None,
            "master_task_time": master.times.summary(),
            "master_loop_seconds": SYSTEM_CLOCK.monotonic() - master.times.loop_started,
            "master_loop_cpu_seconds": SYSTEM_CLOCK.process_time() - master.times.loop_cpu_start,
            "worker_phases": _phases(stats),
            "tiers": _tiers(master),
            "master_wakeups": master.wakeups,
            "doorbell_workers": len(master.ranks.ringing),
            "run_id": master.run_id,
            "exit_status": master.exit_status,
            "fault_tolerance": master.fault_tolerant,
            "generation": master.generation,
            "failures": stats.failures,
            "redone_commits": stats.redone_commits,
            "hybrid": master.importer.figures(fresh=master.phase.value == "done")
            if master.importer is not None else None,
        },
    )


def _failures_by_reason(groups: dict[str, dict], campaign) -> list[dict]:
    """The executor's failures, most frequent reason first, each with an input it failed on
    (and that input's file in OUT while it is in the corpus)."""
    figures = []
    for reason, group in sorted(groups.items(), key=lambda item: -item[1]["count"]):
        digest = group["example"]
        path = campaign.corpus / digest
        figures.append({"reason": reason, "count": group["count"], "example_digest": digest,
                        "example_path": str(path.relative_to(campaign.out))
                        if path.exists() else None})
    return figures


def _carried_failures(figures) -> dict[str, dict]:
    return {group["reason"]: {"count": group["count"], "example": example_digest(group)}
            for group in figures or ()}



def _tiers(master) -> dict | None:
    """The tiers past the interesting frontier (tiers/): the one in use, what each found."""
    lower = master.lower
    if lower is None:
        return None
    figures = asdict(lower.schedule.statistics())
    figures["reruns_pending"] = master.frontier.reruns_pending
    figures["pool"] = asdict(lower.pool.statistics()) if lower.pool is not None else None
    return figures


def _phases(stats) -> dict:
    """Where the workers' time went, per committed task (protocol.TaskPhases)."""
    tasks = stats.executions
    return {"tasks": tasks, "seconds": {k: round(v, 6) for k, v in stats.phases.items()},
            "ms_per_task": {k: round(1000 * v / tasks, 3) if tasks else 0.0
                            for k, v in stats.phases.items()}}


# The figures a master that takes over carries on from the one that died (its last report,
# at most REPORT_INTERVAL old; executions are counted again from the done journal).
CARRIED = ("start_time", "generated", "unique", "interesting", "crashes", "hangs",
           "crashing_runs", "hanging_runs", "executor_time", "solver_time")
CARRIED_EXTRA = ("first_crash_seconds", "startup_seconds", "executor_errors",
                 "malformed_messages", "staging_rejected", "failures")


def carry_stats(master, out: Path) -> None:
    """Continue this run's figures from stats.json, if the last report is of this run."""
    try:
        document = json.loads((out / STATS_FILE).read_text())
    except (OSError, ValueError):
        return
    extra = document.get("extra", {})
    if extra.get("run_id") != master.run_id:
        return
    stats = master.stats
    for name in CARRIED:
        if isinstance(document.get(name), (int, float)):
            setattr(stats, name, document[name])
    for name in CARRIED_EXTRA:
        if extra.get(name) is not None:
            setattr(stats, name, extra[name])
    stats.executor_failures = _carried_failures(extra.get("executor_failures"))
    for name in ("last_find", "last_crash", "last_hang"):
        setattr(stats, name, document.get(name) or 0.0)
    stats.max_depth = max(stats.max_depth, document.get("max_depth") or 1)
    # The commits just redone are in the journal at the next group commit, not yet.
    stats.executions = master.campaign.done_since(stats.start_time) + stats.redone_commits


class CampaignReporter:
    """Called by the master once a second and at the end: stats.json, fuzzer_stats, plot_data."""

    def __init__(self, config: CampaignConfig):
        self.writer = ReportWriter(config.out, stats_name=STATS_FILE)
        self.launched = launch_environment().by_us
        self.next_line = 0.0

    def __call__(self, master, final: bool) -> None:
        snapshot = master_snapshot(master)
        if final:
            self.writer.close(snapshot)
        else:
            self.writer.write(snapshot)
        if not self.launched and (final or SYSTEM_CLOCK.monotonic() >= self.next_line):
            # Under a user's own mpiexec nobody renders the live view: log a line instead.
            print(progress_line(snapshot), file=sys.stderr, flush=True)
            self.next_line = SYSTEM_CLOCK.monotonic() + 10


def read_snapshot(out: Path) -> CampaignSnapshot | None:
    try:
        return snapshot_from_stats(json.loads((out / STATS_FILE).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def progress_line(s: CampaignSnapshot) -> str:
    line = (f"[{int(s.elapsed)} s] execs {s.executions} ({s.current_execs_per_sec:.1f}/s)  "
            f"frontier {s.pending}  corpus {s.corpus_count}  crashes {s.crashes}  "
            f"hangs {s.hangs}")
    hybrid = s.extra.get("hybrid")
    if hybrid:
        line += f"  imported {sum((hybrid.get('imported') or {}).values())}"
    tiers = s.extra.get("tiers") or {}
    if tiers.get("enabled") and tiers.get("current", 1) != 1 or tiers.get("epoch"):
        line += f"  tier {tiers['current']} (epoch {tiers['epoch']})"
    pool = tiers.get("pool") or {}
    if pool.get("pending"):
        line += f"  set aside {pool['pending']}"
    return line


def crash_listing(out: Path, limit: int = 5) -> list[str]:
    crashes = sorted(p for p in (out / "crashes").iterdir() if p.name.startswith("id:"))
    return [f"{path}: {path.read_bytes()[:64]!r}" for path in crashes[:limit]]


class LiveView:
    """The launcher's display: a live panel on a terminal, progress lines otherwise."""

    def __init__(self, out: Path, *, live: bool):
        self.out = out
        self.console = Console()
        self.live = Live(console=self.console, refresh_per_second=2, transient=True) \
            if live else None
        self.next_line = 0.0

    def __enter__(self):
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def log(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def note(self, line: str) -> None:
        self.console.print(f"[yellow]{line}[/yellow]", soft_wrap=True)

    def refresh(self) -> None:
        snapshot = read_snapshot(self.out)
        if snapshot is None:
            return
        if self.live is not None:
            self.live.update(render_live(snapshot))
        elif SYSTEM_CLOCK.monotonic() >= self.next_line:
            # soft_wrap: a pipe is 80 columns to rich, and a wrapped line breaks grep and tail
            self.console.print(progress_line(snapshot), markup=False, highlight=False,
                               soft_wrap=True)
            self.next_line = SYSTEM_CLOCK.monotonic() + 5

    def summary(self) -> None:
        print_summary(self.out, self.console)


def print_summary(out: Path, console: Console) -> None:
    snapshot = read_snapshot(out)
    if snapshot is None:
        return
    console.print(summary_table(snapshot))
    waiting = set_aside_waiting(snapshot)
    if waiting:
        console.print(f"{waiting:,} inputs triage did not keep are set aside in {out / 'aside'}:"
                      " explore them with --resume --wall-timeout SECONDS", markup=False,
                      highlight=False, soft_wrap=True)
    listing = crash_listing(out)
    if listing:
        console.print("[bold red]crashing inputs:[/bold red]")
        for line in listing:
            console.print(line, markup=False, highlight=False, soft_wrap=True)


def set_aside_waiting(snapshot: CampaignSnapshot) -> int:
    """Inputs waiting in the aside pool of a campaign that stopped without exploring it."""
    tiers = snapshot.extra.get("tiers") or {}
    if tiers.get("enabled"):
        return 0
    return (tiers.get("pool") or {}).get("pending", 0)


def print_status(out: Path) -> None:
    if not (out / MARKER).is_file():
        raise CampaignError(f"{out} holds no symcc-mpi campaign")
    if read_snapshot(out) is None:
        raise CampaignError(f"{out / STATS_FILE} is missing or unreadable")
    print_summary(out, Console())
