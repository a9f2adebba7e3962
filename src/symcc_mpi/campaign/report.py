"""AFL++-compatible campaign reports: the figures (`CampaignSnapshot`) and the files made of
them, fuzzer_stats and plot_data (afl-fuzz 4.04c's formats) and stats.json.

Every file is replaced whole (durable/atomic.py, not fsynced: a report lost to a crash of
the machine is rewritten at the next tick); the temporary name starts with a dot, so
afl-whatsup (`find -iname fuzzer_stats`) and AFL's queue scans skip it. The live view and the
end-of-campaign summary read the same figures: job/live.py."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import msgspec

from symcc_mpi.durable.atomic import make_directories, write_durable
from symcc_mpi.durable.journal import LineLog

__all__ = [
    "CampaignSnapshot",
    "PLOT_HEADER",
    "ReportWriter",
    "format_fuzzer_stats",
    "format_plot_row",
    "snapshot_from_stats",
]

# The exact header afl-fuzz 4.04c writes; afl-plot reads the columns by position.
PLOT_HEADER = (
    "# relative_time, cycles_done, cur_item, corpus_count, pending_total, pending_favs, "
    "map_size, saved_crashes, saved_hangs, max_depth, execs_per_sec, total_execs, edges_found\n"
)
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
        make_directories(self.out_dir)
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
        write_durable(self.stats_path, msgspec.json.format(msgspec.json.encode(document)) + b"\n",
                      fsync=False)
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
            write_durable(self.fuzzer_stats_path, text.encode(), fsync=False)

    def _append_plot_row(self, snap: CampaignSnapshot) -> None:
        row = format_plot_row(snap, self._rate)
        if row == self._last_row:
            return
        plot = LineLog(self.plot_path, fsync=False, encode=str.encode)  # rows are ASCII
        try:
            plot.append(row)
        finally:
            plot.close()
        self._last_row = row
        self._last_plot_at = snap.now

    def _prepare_plot_file(self) -> None:
        """Start plot_data, or continue one left by an earlier run of this campaign."""
        path = self.plot_path
        if not path.exists() or path.stat().st_size == 0:
            write_durable(path, PLOT_HEADER.encode(), fsync=False)
            return
        data = path.read_bytes()
        if not data.startswith(PLOT_HEADER.encode()):
            os.replace(path, path.with_name("plot_data.orig"))
            write_durable(path, PLOT_HEADER.encode(), fsync=False)
            return
        if not data.endswith(b"\n"):  # a row cut short by a crash would upset gnuplot
            with open(path, "r+b") as f:
                f.truncate(data.rindex(b"\n") + 1)
