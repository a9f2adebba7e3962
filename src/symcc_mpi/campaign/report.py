"""AFL++-compatible campaign reports (fuzzer_stats, plot_data, stats.json) and the live view."""

from __future__ import annotations

import functools
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import msgspec
from rich import box
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

__all__ = [
    "AFL_SYNC_MAX_ID",
    "CampaignSnapshot",
    "PLOT_HEADER",
    "ReportWriter",
    "afl_queue_name",
    "format_fuzzer_stats",
    "format_plot_row",
    "parse_afl_queue_id",
    "render_live",
    "summary_table",
]

# The exact header afl-fuzz 4.04c writes; afl-plot reads the columns by position.
PLOT_HEADER = (
    "# relative_time, cycles_done, cur_item, corpus_count, pending_total, pending_favs, "
    "map_size, saved_crashes, saved_hangs, max_depth, execs_per_sec, total_execs, edges_found\n"
)
# afl-fuzz finds its sync position with "id:%06u": ids past six digits break -S/-M imports.
AFL_SYNC_MAX_ID = 999_999
STATS_FORMAT = "symcc-mpi-stats/1"


@functools.cache  # importlib.metadata reads and parses METADATA on every call
def _package_version() -> str:
    try:
        return version("symcc-mpi")
    except PackageNotFoundError:  # an uninstalled source tree
        return "0"


@dataclass(frozen=True)
class CampaignSnapshot:
    """The figures of a campaign at one instant (times are Unix seconds)."""

    start_time: float
    now: float
    executions: int = 0
    generated: int = 0  # files the executors produced
    unique: int = 0  # of those, new by content
    interesting: int = 0  # of those, kept by triage (new coverage or no oracle)
    corpus_count: int = 0  # entries in queue/ (seeds, finds, imports)
    imported: int = 0  # entries taken from other fuzzers (hybrid)
    pending: int = 0  # frontier: inputs waiting to be executed
    pending_favs: int = 0
    cur_item: int = 0
    max_depth: int = 0
    cycles_done: int = 0
    crashes: int = 0  # unique crashes saved
    hangs: int = 0  # unique hangs saved
    crashing_runs: int = 0
    hanging_runs: int = 0
    execs_at_last_crash: int = 0
    last_find: float | None = None
    last_crash: float | None = None
    last_hang: float | None = None
    executor_time: float = 0.0  # seconds, summed over workers
    solver_time: float = 0.0
    triage_time: float = 0.0
    edges_found: int = 0
    map_size: int = 0  # AFL's total_edges
    timeout_ms: int = 0
    slowest_exec_ms: int = 0
    peak_rss_mb: int = 0
    stability: float = 100.0
    recent_execs_per_sec: float | None = None
    workers: int = 0
    per_worker: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    command_line: str = ""
    banner: str = "symcc-mpi"
    target_mode: str = "default"
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def elapsed(self) -> float:
        return max(0.0, self.now - self.start_time)

    @property
    def execs_per_sec(self) -> float:
        """Lifetime average, as fuzzer_stats' execs_per_sec."""
        return self.executions / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def current_execs_per_sec(self) -> float:
        rate = self.recent_execs_per_sec
        return self.execs_per_sec if rate is None else rate

    @property
    def bitmap_cvg(self) -> float:
        return 100.0 * self.edges_found / self.map_size if self.map_size else 0.0

    @property
    def corpus_found(self) -> int:
        return self.interesting


def snapshot_from_stats(document: Mapping[str, Any]) -> CampaignSnapshot:
    """Rebuild a snapshot from the stats file, for readers outside the master (live view)."""
    names = {f for f in CampaignSnapshot.__dataclass_fields__}
    values = {k: v for k, v in document.items() if k in names}
    values["now"] = document["last_update"]
    values["map_size"] = document.get("map_size", 0)
    values["per_worker"] = {int(rank): f for rank, f in document.get("per_worker", {}).items()}
    return CampaignSnapshot(**values)


# --------------------------------------------------------------------------- formats


# afl-whatsup turns each "key : value" line into key="value" and sources it with sh, so a
# quote, backslash, dollar or backquote in a value would be shell code; newlines would
# start new lines. command_line is the one line it skips.
_SHELL_UNSAFE = re.compile(r'["\\$`\r\n]')


def _shell_safe(text: str) -> str:
    return _SHELL_UNSAFE.sub("_", text)


def _epoch(t: float | None) -> int:
    return int(t) if t else 0


def format_fuzzer_stats(
    snap: CampaignSnapshot,
    *,
    fuzzer_pid: int,
    afl_version: str | None = None,
    legacy_keys: bool = False,
    recent_execs_per_sec: float | None = None,
) -> str:
    """fuzzer_stats text in afl-fuzz 4.04c's layout (its keys, order and number formats).

    `legacy_keys` adds the pre-4.0 names (paths_total, unique_crashes...) read by older
    afl-whatsup scripts; 4.04c's script reads only the new names.
    """
    version = afl_version or f"symcc-mpi-{_package_version()}"
    recent = snap.current_execs_per_sec if recent_execs_per_sec is None else recent_execs_per_sec
    rows: list[tuple[str, object]] = [
        ("start_time", int(snap.start_time)),
        ("last_update", int(snap.now)),
        ("run_time", int(snap.elapsed)),
        ("fuzzer_pid", fuzzer_pid),
        ("cycles_done", snap.cycles_done),
        ("cycles_wo_finds", 0),
        ("execs_done", snap.executions),
        ("execs_per_sec", f"{snap.execs_per_sec:0.2f}"),
        ("execs_ps_last_min", f"{recent:0.2f}"),
        ("corpus_count", snap.corpus_count),
        ("corpus_favored", 0),
        ("corpus_found", snap.corpus_found),
        ("corpus_imported", snap.imported),
        ("corpus_variable", 0),
        ("max_depth", snap.max_depth),
        ("cur_item", snap.cur_item),
        ("pending_favs", snap.pending_favs),
        ("pending_total", snap.pending),
        ("stability", f"{snap.stability:0.2f}%"),
        ("bitmap_cvg", f"{snap.bitmap_cvg:0.2f}%"),
        ("saved_crashes", snap.crashes),
        ("saved_hangs", snap.hangs),
        ("last_find", _epoch(snap.last_find)),
        ("last_crash", _epoch(snap.last_crash)),
        ("last_hang", _epoch(snap.last_hang)),
        ("execs_since_crash", max(0, snap.executions - snap.execs_at_last_crash)),
        ("exec_timeout", snap.timeout_ms),
        ("slowest_exec_ms", snap.slowest_exec_ms),
        ("peak_rss_mb", snap.peak_rss_mb),
        ("cpu_affinity", -1),
        ("edges_found", snap.edges_found),
        ("total_edges", snap.map_size),
        ("var_byte_count", 0),
        ("havoc_expansion", 0),
        ("auto_dict_entries", 0),
        ("testcache_size", 0),
        ("testcache_count", 0),
        ("testcache_evict", 0),
    ]
    if legacy_keys:
        rows += [
            ("paths_total", snap.corpus_count),
            ("paths_favored", 0),
            ("paths_found", snap.corpus_found),
            ("paths_imported", snap.imported),
            ("cur_path", snap.cur_item),
            ("variable_paths", 0),
            ("unique_crashes", snap.crashes),
            ("unique_hangs", snap.hangs),
            ("last_path", _epoch(snap.last_find)),
        ]
    rows += [
        ("afl_banner", _shell_safe(snap.banner)),
        ("afl_version", _shell_safe(version)),
        ("target_mode", _shell_safe(snap.target_mode)),
        ("command_line", snap.command_line.replace("\r", " ").replace("\n", " ")),
    ]
    return "".join(f"{key:<18}: {value}\n" for key, value in rows)


def format_plot_row(snap: CampaignSnapshot, execs_per_sec: float | None = None) -> str:
    """One plot_data row in afl-fuzz 4.04c's format (map_size is the coverage percent)."""
    rate = snap.current_execs_per_sec if execs_per_sec is None else execs_per_sec
    return (
        f"{int(snap.elapsed)}, {snap.cycles_done}, {snap.cur_item}, {snap.corpus_count}, "
        f"{snap.pending}, {snap.pending_favs}, {snap.bitmap_cvg:0.2f}%, {snap.crashes}, "
        f"{snap.hangs}, {snap.max_depth}, {rate:0.2f}, {snap.executions}, {snap.edges_found}\n"
    )


def _stats_document(
    snap: CampaignSnapshot, fuzzer_pid: int, execs_per_sec: float
) -> dict[str, Any]:
    busy = snap.executor_time
    return {
        "format": STATS_FORMAT,
        "fuzzer_pid": fuzzer_pid,
        "banner": snap.banner,
        "command_line": snap.command_line,
        "start_time": snap.start_time,
        "last_update": snap.now,
        "elapsed": snap.elapsed,
        "executions": snap.executions,
        "execs_per_sec": snap.execs_per_sec,
        "recent_execs_per_sec": execs_per_sec,
        "generated": snap.generated,
        "unique": snap.unique,
        "interesting": snap.interesting,
        "corpus_count": snap.corpus_count,
        "imported": snap.imported,
        "pending": snap.pending,
        "max_depth": snap.max_depth,
        "crashes": snap.crashes,
        "hangs": snap.hangs,
        "crashing_runs": snap.crashing_runs,
        "hanging_runs": snap.hanging_runs,
        "last_find": snap.last_find,
        "last_crash": snap.last_crash,
        "last_hang": snap.last_hang,
        "executor_time": snap.executor_time,
        "solver_time": snap.solver_time,
        "solver_share": snap.solver_time / busy if busy > 0 else 0.0,
        "triage_time": snap.triage_time,
        "generated_per_execution": snap.generated / snap.executions if snap.executions else 0.0,
        "unique_ratio": snap.unique / snap.generated if snap.generated else 0.0,
        "edges_found": snap.edges_found,
        "map_size": snap.map_size,
        "bitmap_cvg": snap.bitmap_cvg,
        "timeout_ms": snap.timeout_ms,
        "workers": snap.workers or len(snap.per_worker),
        "per_worker": {str(rank): dict(figures) for rank, figures in snap.per_worker.items()},
        "extra": dict(snap.extra),
    }


def _atomic_write(path: Path, data: bytes) -> None:
    # The temporary name starts with a dot: afl-whatsup (find -iname fuzzer_stats) and
    # AFL's queue scans skip it, and a reader only ever sees a whole old or new file.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


class ReportWriter:
    """Writes OUT/fuzzer_stats, OUT/stats.json (atomically) and appends to OUT/plot_data."""

    def __init__(
        self,
        out_dir: Path | str,
        *,
        plot_interval: float = 5.0,
        fuzzer_pid: int | None = None,
        legacy_keys: bool = False,
        afl_version: str | None = None,
        stats_name: str = "stats.json",
    ) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.fuzzer_stats_path = self.out_dir / "fuzzer_stats"
        self.plot_path = self.out_dir / "plot_data"
        self.stats_path = self.out_dir / stats_name
        self._plot_interval = plot_interval
        self._fuzzer_pid = os.getpid() if fuzzer_pid is None else fuzzer_pid
        self._legacy_keys = legacy_keys
        self._afl_version = afl_version
        self._last_plot_at: float | None = None
        self._last_row: str | None = None
        self._prev: tuple[float, int] | None = None
        self._rate: float | None = None
        self._prepare_plot_file()

    def write(self, snap: CampaignSnapshot) -> None:
        """Refresh the stats files and append a plot_data row if one is due."""
        self._update_rate(snap)
        self._write_stats(snap)
        if self._last_plot_at is None or snap.now - self._last_plot_at >= self._plot_interval:
            self._append_plot_row(snap)

    def close(self, snap: CampaignSnapshot) -> None:
        """Final write: stats files and a last plot_data row, whatever the interval."""
        self._update_rate(snap)
        self._write_stats(snap)
        self._append_plot_row(snap)

    # -- internals

    def _update_rate(self, snap: CampaignSnapshot) -> None:
        if snap.recent_execs_per_sec is not None:
            self._rate = snap.recent_execs_per_sec
        elif self._prev is not None and snap.now > self._prev[0]:
            self._rate = (snap.executions - self._prev[1]) / (snap.now - self._prev[0])
        elif self._rate is None:
            self._rate = snap.execs_per_sec
        self._prev = (snap.now, snap.executions)

    def _write_stats(self, snap: CampaignSnapshot) -> None:
        rate = self._rate if self._rate is not None else snap.execs_per_sec
        document = _stats_document(snap, self._fuzzer_pid, rate)
        _atomic_write(self.stats_path, msgspec.json.format(msgspec.json.encode(document)) + b"\n")
        # afl-whatsup divides by execs_done and corpus_count: a zero in either aborts the
        # whole summary (dash: "division by zero"), for every fuzzer of the sync dir. afl-fuzz
        # itself writes its first fuzzer_stats only after the seeds ran, so do the same.
        if snap.executions > 0 and snap.corpus_count > 0:
            text = format_fuzzer_stats(
                snap,
                fuzzer_pid=self._fuzzer_pid,
                afl_version=self._afl_version,
                legacy_keys=self._legacy_keys,
                recent_execs_per_sec=rate,
            )
            _atomic_write(self.fuzzer_stats_path, text.encode())

    def _append_plot_row(self, snap: CampaignSnapshot) -> None:
        row = format_plot_row(snap, self._rate)
        if row == self._last_row:
            return
        with open(self.plot_path, "a", encoding="ascii") as f:
            f.write(row)
        self._last_row = row
        self._last_plot_at = snap.now

    def _prepare_plot_file(self) -> None:
        """Start plot_data, or continue one left by an earlier run of this campaign."""
        path = self.plot_path
        if not path.exists() or path.stat().st_size == 0:
            _atomic_write(path, PLOT_HEADER.encode())
            return
        data = path.read_bytes()
        if not data.startswith(PLOT_HEADER.encode()):
            os.replace(path, path.with_name("plot_data.orig"))
            _atomic_write(path, PLOT_HEADER.encode())
            return
        if not data.endswith(b"\n"):  # a row cut short by a crash would upset gnuplot
            with open(path, "r+b") as f:
                f.truncate(data.rindex(b"\n") + 1)


# --------------------------------------------------------------------------- AFL names


_NAME_UNSAFE = re.compile(r"[/,\x00-\x1f]")


def afl_queue_name(
    id: int,
    src_ids: Sequence[int] = (),
    op: str | None = "symcc",
    *,
    sig: int | None = None,
    orig: str | None = None,
    time_ms: int | None = None,
    execs: int | None = None,
    new_cov: bool = False,
    sync: str | None = None,
) -> str:
    """An AFL-style queue/crash file name, e.g. "id:000012,src:000003,op:symcc".

    afl-fuzz -M (and -S when no main node exists) imports a foreign queue/ by looking,
    after sorting the names, for the entry starting "id:%06u" with the next id it expects
    and taking every entry from there on, counting one id per entry. So a queue/ must
    hold only such names, ids dense from 000000 in creation order, each file published
    whole (renamed from a dot-name), nothing else that does not start with a dot.
    """
    if id < 0 or any(s < 0 for s in src_ids):
        raise ValueError("AFL queue ids are non-negative")
    parts = [f"id:{id:06d}"]
    if sync is not None:  # imported from another instance: afl-fuzz's own sync names
        parts.append("sync:" + _NAME_UNSAFE.sub("_", sync))
    if sig is not None:
        parts.append(f"sig:{sig:02d}")
    if src_ids:
        parts.append("src:" + "+".join(f"{s:06d}" for s in src_ids))
    if time_ms is not None:
        parts.append(f"time:{time_ms}")
    if execs is not None:
        parts.append(f"execs:{execs}")
    if orig is not None:
        parts.append("orig:" + _NAME_UNSAFE.sub("_", orig))
    elif op:
        parts.append("op:" + _NAME_UNSAFE.sub("_", op))
    if new_cov:
        parts.append("+cov")
    name = ",".join(parts)
    return name.encode()[:255].decode("utf-8", "ignore")  # NAME_MAX


_QUEUE_ID = re.compile(r"id:(\d+)")


def parse_afl_queue_id(name: str) -> int | None:
    """The id of an AFL queue entry name ("id:000012,..." -> 12), None if not one."""
    m = _QUEUE_ID.match(name)
    return int(m.group(1)) if m else None


# --------------------------------------------------------------------------- rich views


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:d}:{minutes:02d}:{secs:02d}"
    return f"{days}d {clock}" if days else clock


def _ago(snap: CampaignSnapshot, when: float | None) -> str:
    return "never" if not when else f"{_duration(snap.now - when)} ago"


def render_live(snap: CampaignSnapshot) -> Panel:
    """One compact panel for a rich Live display."""
    grid = Table.grid(padding=(0, 2))
    for _ in range(4):
        grid.add_column()
    label = "bold cyan"
    crash_style = "bold red" if snap.crashes else ""
    hang_style = "bold yellow" if snap.hangs else ""
    grid.add_row(
        Text("elapsed", style=label),
        _duration(snap.elapsed),
        Text("execs", style=label),
        f"{snap.executions:,} ({snap.current_execs_per_sec:,.1f}/s)",
    )
    grid.add_row(
        Text("frontier", style=label),
        f"{snap.pending:,}",
        Text("corpus", style=label),
        f"{snap.corpus_count:,} (+{snap.interesting:,} found, {snap.imported:,} imported)",
    )
    grid.add_row(
        Text("crashes", style=label),
        Text(f"{snap.crashes:,}", style=crash_style),
        Text("hangs", style=label),
        Text(f"{snap.hangs:,}", style=hang_style),
    )
    grid.add_row(
        Text("edges", style=label),
        _edges(snap),
        Text("last find", style=label),
        _ago(snap, snap.last_find),
    )
    workers = snap.workers or len(snap.per_worker)
    subtitle = f"{workers} worker{'s' if workers != 1 else ''}"
    per_master = snap.extra.get("per_master")
    if per_master:
        subtitle += " · " + ", ".join(f"master {index}: {m['executions']:,} execs"
                                      for index, m in sorted(per_master.items(),
                                                             key=lambda item: int(item[0])))
    hybrid = snap.extra.get("hybrid")
    if hybrid:
        subtitle += (f" · imported {sum((hybrid.get('imported') or {}).values()):,} from the "
                     f"fuzzers, they took {sum((hybrid.get('imported_by') or {}).values()):,}")
    tiers = _live_tiers(snap.extra.get("tiers"))
    if tiers:
        subtitle += f" · {tiers}"
    parked = (snap.extra.get("dispatch") or {}).get("parked")
    if parked:
        subtitle += f" · {len(parked)} parked (no answer within the watchdog deadline)"
    return Panel(
        grid,
        title=f"symcc-mpi · {snap.banner}",
        subtitle=subtitle,
        box=box.ROUNDED,
        expand=False,
    )


def summary_table(snap: CampaignSnapshot) -> Table:
    """The end-of-campaign summary."""
    table = Table(title=f"symcc-mpi campaign summary · {snap.banner}", box=box.SIMPLE_HEAD)
    table.add_column("figure", style="cyan", no_wrap=True)
    table.add_column("value", justify="right")
    busy = snap.executor_time
    rows = [
        ("stopped because", str(snap.extra.get("stop_reason") or "-")),
        ("run time", _duration(snap.elapsed)),
        ("executions", f"{snap.executions:,}"),
        ("execs/s (average)", f"{snap.execs_per_sec:,.2f}"),
        ("generated inputs", f"{snap.generated:,}"),
        ("new by content", f"{snap.unique:,}"),
        ("kept (interesting)", f"{snap.interesting:,}"),
        ("corpus (queue/)", f"{snap.corpus_count:,}"),
        ("frontier left", f"{snap.pending:,}"),
        ("max depth", f"{snap.max_depth:,}"),
        ("unique crashes", f"{snap.crashes:,} of {snap.crashing_runs:,} crashing runs"),
        ("unique hangs", f"{snap.hangs:,} of {snap.hanging_runs:,} hanging runs"),
        *_executor_failures(snap.extra),
        ("edges", _edges(snap)),
        ("executor time", f"{snap.executor_time:,.1f} s"),
        ("solver time", f"{snap.solver_time:,.1f} s ({_share(snap.solver_time, busy)})"),
        ("last find", _ago(snap, snap.last_find)),
    ]
    rows += _tier_rows(snap.extra.get("tiers"))
    phases = _worker_phases(snap.extra.get("worker_phases") or {})
    if phases:
        rows.append(("worker time per task", phases))
    master_cpu = _master_cpu(snap)
    if master_cpu:
        rows.append(("master CPU per execution", master_cpu))
    queries = _solver_queries(snap.extra.get("solver") or {})
    if queries:
        rows.append(("solver queries", queries))
    splitting = _splitting(snap.extra.get("splitting") or {})
    if splitting and not snap.extra.get("per_master"):  # else one row per master
        rows.append(("split inputs", splitting))
    recovery = _dispatch_recovery(snap.extra.get("dispatch") or {})
    if recovery:
        rows.append(("dispatch recovery", recovery))
    rows += _failures(snap.extra.get("failures") or [], snap.extra.get("redone_commits") or 0)
    rows += _per_master(snap.extra.get("per_master") or {})
    rows += _hybrid(snap.extra.get("hybrid"))
    for i, (name, value) in enumerate(rows):
        table.add_row(name, value, end_section=i == len(rows) - 1 and bool(snap.per_worker))
    for rank in sorted(snap.per_worker):
        figures = snap.per_worker[rank]
        text = ", ".join(f"{k}={_figure(v)}" for k, v in figures.items())
        table.add_row(f"worker {rank}", text)
    return table


SHOWN_REASONS = 5  # failure reasons the summary lists; stats.json has them all


def _executor_failures(extra: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Runs the executor failed (not the target: witness.py), grouped by reason."""
    total = extra.get("executor_errors") or 0
    if not total:
        return []
    groups = extra.get("executor_failures") or []
    rows = [("executor failures", f"{total:,} runs failed in the executor, not in the target"
                                  f" ({len(groups):,} reason{'s' if len(groups) != 1 else ''})")]
    for group in groups[:SHOWN_REASONS]:
        example = group.get("example_path") or group["example_sha256"][:16]
        rows.append((f"  {group['count']:,} ×", f"{group['reason']} (e.g. {example})"))
    if len(groups) > SHOWN_REASONS:
        rows.append(("  …", f"{len(groups) - SHOWN_REASONS:,} more reasons in stats.json"))
    return rows


def _splitting(figures: Mapping[str, Any]) -> str:
    """How inputs were split among free workers (splitting.py), when any was."""
    if not figures.get("traces"):
        return ""
    text = (f"{figures['split_inputs']:,} of {figures['traces']:,} traced, into "
            f"{figures['groups']:,} target groups ({figures['split_dispatches']:,} dispatches); "
            f"{figures['targets_solved']:,} distinct targets solved")
    conflicts = figures.get("local_conflicts", 0) + figures.get("shared_conflicts", 0)
    if conflicts:
        text += (f"; {conflicts:,} groups held back (target in flight: "
                 f"{figures['local_conflicts']:,} here, {figures['shared_conflicts']:,} at "
                 f"other masters), {figures['backfills']:,} backfills")
    return text


def _hybrid(hybrid: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """What a hybrid campaign took from each fuzzer, and what each took from it."""
    if not hybrid:
        return []
    imported, imported_by = hybrid.get("imported") or {}, hybrid.get("imported_by") or {}
    rows = [("fuzzers", f"{', '.join(sorted(imported_by)) or 'none yet'} in "
                        f"{hybrid.get('sync_dir')}"),
            ("imported from fuzzers",
             f"{sum(imported.values()):,} new" + "".join(
                 f"; {count:,} from {name}" for name, count in sorted(imported.items()))
             + f"; {hybrid.get('duplicates', 0):,} already held by content")]
    rows += [(f"imported by {name}", f"{count:,} of ours (sync: in its queue/)")
             for name, count in sorted(imported_by.items())]
    return rows


def _per_master(per_master: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str]]:
    """One row per master of a campaign of several (federation.py), and one for its split
    inputs and target groups when it split any."""
    rows = []
    for index, m in sorted(per_master.items(), key=lambda item: int(item[0])):
        rows.append((f"master {index} (rank {m['world_rank']})",
                     f"{m['executions']:,} executions by {m['workers']} workers, "
                     f"{m['interesting']:,} kept; leases: {m['claims']:,} claimed, "
                     f"{m['steals']:,} taken over, {m['expiries']:,} lost, "
                     f"{m['stale_results']:,} stale results"))
        splitting = _splitting(m.get("splitting") or {})
        if splitting:
            claims = m.get("target_claims") or {}
            rows.append((f"master {index} split inputs", splitting + (
                f"; target groups: {claims.get('claims', 0):,} claimed, "
                f"{claims.get('conflicts', 0):,} refused, {claims.get('steals', 0):,} "
                f"taken over, {claims.get('expiries', 0):,} lost" if claims else "")))
    return rows


def _failures(failures: list[dict], redone: int) -> list[tuple[str, str]]:
    """One row per rank failure the campaign survived (ulfm/): who died, in which generation,
    what went back to the frontier, how long until work went out again."""
    rows = []
    for failure in failures:
        back = "-"
        if failure.get("first_dispatch") and failure.get("detected"):
            back = f"{failure['first_dispatch'] - failure['detected']:.2f} s"
        master = "new master" if failure.get("master") == "new" else "master kept"
        rows.append((f"failure → generation {failure['generation']}",
                     f"{'; '.join(failure['failed']) or '?'}: {failure['requeued']} in flight "
                     f"requeued, {master}, work again after {back}"))
    if redone:
        rows.append(("commits redone", f"{redone:,} (left half done by a dead master)"))
    return rows


def _dispatch_recovery(dispatch: dict) -> str:
    """What went wrong in the hand-off of work and was repaired; "" when nothing did."""
    parts = [f"{dispatch[key]:,} {label}" for key, label in (
        ("send_failures", "failed sends"), ("stale_results", "stale results"),
        ("invalid_joins", "lost/bad results"), ("watchdog_timeouts", "watchdog timeouts"),
        ("worker_recoveries", "workers back"), ("protocol_requeued", "requeued"),
        ("protocol_deferred", "deferred")) if dispatch.get(key)]
    if dispatch.get("parked"):
        parts.append("parked: rank " + ", ".join(map(str, dispatch["parked"])))
    return ", ".join(parts)


TIER_NAMES = {1: "interesting frontier", 2: "set aside", 3: "corpus again"}


def _tier_rows(tiers: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """The tiers past the interesting frontier (tiers/): what each did, the pool's state."""
    if not tiers:
        return []
    rows = []
    if tiers.get("enabled"):
        rows.append(("tiers", f"in tier {tiers['current']} ({TIER_NAMES[tiers['current']]}), "
                              f"epoch {tiers['epoch']}"))
    for tier, figures in sorted((tiers.get("per_tier") or {}).items(),
                                key=lambda item: int(item[0])):
        if figures["executions"]:
            rows.append((f"tier {tier} ({TIER_NAMES[int(tier)]})",
                         f"{figures['executions']:,} executions, {figures['finds']:,} finds, "
                         f"+{figures['edges']:,} edges"))
    pool = tiers.get("pool")
    if pool and (pool["set_aside"] or pool["pending"]):
        rows.append(("set aside", f"{pool['pending']:,} waiting ({pool['bytes'] / 2**20:,.1f} "
                                  f"MiB of packs), {pool['set_aside']:,} set aside, "
                                  f"{pool['explored']:,} explored, {pool['dropped']:,} dropped "
                                  "past the bounds"))
    return rows


def _live_tiers(tiers: Mapping[str, Any] | None) -> str:
    if not tiers or not tiers.get("enabled"):
        return ""
    pool = tiers.get("pool") or {}
    return (f"tier {tiers['current']} · epoch {tiers['epoch']} · "
            f"{pool.get('pending', 0):,} set aside · {tiers.get('reruns_pending', 0):,} to rerun")


def _worker_phases(phases: Mapping[str, Any]) -> str:
    """Where a worker's time goes per task (protocol.TaskPhases), in ms; "" before any."""
    per_task = phases.get("ms_per_task") or {}
    if not phases.get("tasks"):
        return ""
    names = {"target": "target", "solver": "solver", "staging": "staging", "probe": "probe",
             "other": "other", "messages": "messages", "wait": "waiting for work"}
    return ", ".join(f"{label} {per_task.get(name, 0.0):,.1f} ms" for name, label in names.items())


def _master_cpu(snap: CampaignSnapshot) -> str:
    cpu = snap.extra.get("master_loop_cpu_seconds")
    tasks = (snap.extra.get("worker_phases") or {}).get("tasks") or snap.executions
    if not cpu or not tasks:
        return ""
    return f"{1000 * cpu / tasks:,.2f} ms"


def _solver_queries(solver: dict) -> str:
    """Queries QSYM solved, and the symbolic branches pruning spared it; "" if none ran."""
    if not solver.get("queries") and not solver.get("skipped"):
        return ""
    text = f"{solver['queries']:,} solved"
    if solver.get("skipped_known"):
        text += f", {solver['skipped']:,} skipped"
    return f"{text} (pruning {solver.get('pruning', 'off')})"


def _edges(snap: CampaignSnapshot) -> str:
    if not snap.map_size:
        return "no coverage oracle"
    return f"{snap.edges_found:,}/{snap.map_size:,} ({snap.bitmap_cvg:.2f}%)"


def _share(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.0f}%" if whole > 0 else "-"


def _figure(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)
