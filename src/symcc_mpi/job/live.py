"""What a person sees of a campaign's figures: the live panel and the end-of-run summary."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich import box
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from symcc_mpi.campaign.report import CampaignSnapshot


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
        example = group.get("example_path") or example_digest(group)[:16]
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


# What became of the master of a failure (stats.json's extra.failures "master").
MASTER_AFTER = {"kept": "master kept", "new": "new master",
                "withdrawn": "master withdrawn, its work to the others",
                "reclaimed": "its group gone, its work to the others"}


def _failures(failures: list[dict], redone: int) -> list[tuple[str, str]]:
    """One row per rank failure the campaign survived (ulfm/): who died, in which generation,
    what went back to the frontier, how long until work went out again."""
    rows = []
    for failure in failures:
        back = "-"
        if failure.get("first_dispatch") and failure.get("detected"):
            back = f"{failure['first_dispatch'] - failure['detected']:.2f} s"
        master = MASTER_AFTER.get(failure.get("master"), "master kept")
        where = f"generation {failure['generation']}" if failure["generation"] is not None \
            else f"master {failure.get('master_index', 0)}"  # several masters (recovery.py)
        rows.append((f"failure → {where}",
                     f"{'; '.join(failure['failed']) or '?'}: "
                     f"{'?' if failure['requeued'] is None else failure['requeued']} in flight "
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


def example_digest(group: dict) -> str:
    """A failure group's example input, in a stats.json of today or of layout 1."""
    return group.get("example_digest") or group["example_sha256"]
