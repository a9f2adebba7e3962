"""SymCC scaling: coverage over time of symcc-mpi campaigns against a one-core reference loop.

On the bundled parser example(s) built with real SymCC, with the same wall budget each:
- the *reference loop*, in this file: what SymCC's own `symcc_fuzzing_helper` does on one
  core, without a shell. A FIFO queue (seeds by name, then inputs in the order they were
  found); each input is run through the SymCC build with SYMCC_INPUT_FILE, a fresh
  SYMCC_OUTPUT_DIR, SYMCC_ENABLE_LINEARIZATION=1 and one SYMCC_AFL_COVERAGE_MAP file for the
  whole loop; what it generates, less the files whose bytes were already seen (the helper
  probes those too, but identical bytes cannot bring new coverage: skipping them changes no
  decision, only saves time, as the campaigns do), is probed in one batch of afl-showmap on
  the AFL build and kept (queued) only if it brings a new edge or a new hit-count class;
- `symcc-mpi explore` with 1 and 2 workers, each with `--pruning off`, `local`, `shared`.
Times count from the launch (the campaigns' start-up included). A campaign's coverage over
time is replayed from its output at millisecond grain: each queue entry `src:P` was kept when
P's result was committed (P's line in state/done.jsonl), so the queue is probed again with
afl-showmap and merged in commit order; the replay must end on the campaign's own edge count
(else the reported series below is used). What the campaign itself reports, OUT/plot_data
(whole seconds, each row placed at the end of its second, so no campaign is credited early)
and OUT/stats.json read every 0.2 s (its `last_update` timestamps, ~1 s apart), gives the
`_reported` figures of the JSON. Coverage found after the budget (runs in flight when it ran
out) does not count. Every run gets a fresh output directory and a fresh pruning map.
Goal: 2 workers with shared pruning reach the reference's final coverage in <= 0.6x the time
the reference took, end with at least its edges, and the master uses <= 5% of a core.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from _campaign import (
    EXAMPLES,
    ROOT,
    build_targets,
    edges_at,
    gnuplot_terminal,
    print_table,
    reported_series,
    run_campaign_sampled,
    step_series,
    time_to,
)

from symcc_mpi.corpus import CampaignDir
from symcc_mpi.executors.symcc import counters_library, solver_seconds
from symcc_mpi.triage import CoverageMap, CoverageProbe, Status

DEFAULT_TARGETS = ("json",)
DEFAULT_BUDGET = 90.0  # per configuration; on json the reference plateaus in ~20 s, and the
# campaigns that exhaust their frontier stop early: ~6-11 min in all for json (2 cores)
RUN_TIMEOUT = 10.0  # seconds per SymCC execution, as the campaigns' --timeout
CONFIGURATIONS = [(workers, pruning) for workers in (1, 2) for pruning in ("off", "local",
                                                                           "shared")]
GOAL_CONFIG = "2w shared"
RATIO_TARGET = 0.6
MASTER_SHARE_TARGET = 5.0
REFERENCE = "reference"


# --------------------------------------------------------------------------- reference loop


def _symcc_env(input_path: Path, output_dir: Path, coverage_map: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYMCC_")}
    env.update(SYMCC_INPUT_FILE=str(input_path), SYMCC_OUTPUT_DIR=str(output_dir),
               SYMCC_ENABLE_LINEARIZATION="1", SYMCC_AFL_COVERAGE_MAP=str(coverage_map))
    return env


def _run_symcc(program: Path, input_path: Path, output_dir: Path, coverage_map: Path,
               timeout: float) -> tuple[bool, bytes]:
    """One SymCC execution; (finished within `timeout`, its stderr)."""
    process = subprocess.Popen([str(program), str(input_path)], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env=_symcc_env(input_path, output_dir, coverage_map),
                               start_new_session=True)
    try:
        _, stderr = process.communicate(timeout=timeout)
        finished = True
    except subprocess.TimeoutExpired:
        finished = False
        _kill_group(process.pid)
        _, stderr = process.communicate()
    _kill_group(process.pid)  # anything the target left behind
    return finished, stderr


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _first_seen(path: Path, seen: set[bytes]) -> bool:
    """Whether no file with these bytes was seen before (then remember it)."""
    digest = hashlib.sha256(path.read_bytes()).digest()
    if digest in seen:
        return False
    seen.add(digest)
    return True


def reference_loop(symcc: Path, afl: Path, seeds: Path, budget: float, scratch: Path) -> dict:
    """symcc_fuzzing_helper's loop on one core, for `budget` seconds (see the docstring)."""
    queue_dir, runs_dir = scratch / "queue", scratch / "runs"
    queue_dir.mkdir()
    runs_dir.mkdir()
    coverage_map = scratch / "qsym.map"  # does not exist yet: QSYM starts from an empty map
    probe = CoverageProbe([str(afl), "@@"], timeout=RUN_TIMEOUT, scratch_dir=scratch)
    cmap = CoverageMap()
    started = time.monotonic()
    deadline = started + budget
    series = [(0.0, 0)]

    def note() -> None:
        if cmap.edges_covered > series[-1][1]:
            series.append((time.monotonic() - started, cmap.edges_covered))

    queue = sorted(p for p in seeds.iterdir() if p.is_file())
    seen: set[bytes] = set()
    queue = [p for p in queue if _first_seen(p, seen)]
    for cov in probe.probe(queue):
        cmap.merge(cov)
    note()
    executions = timeouts = generated = kept = crashes = queries = 0
    solver = 0.0
    files_per_run: list[int] = []
    position = 0
    stop = "wall-clock budget spent"
    while True:
        if position == len(queue):
            stop = "queue exhausted"
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        out = runs_dir / f"run{executions:06d}"
        out.mkdir()
        finished, stderr = _run_symcc(symcc, queue[position], out, coverage_map,
                                      min(RUN_TIMEOUT, remaining))
        if not finished and remaining < RUN_TIMEOUT:
            break  # cut by the budget, not by the per-run timeout: it does not count
        position += 1
        executions += 1
        timeouts += not finished
        solver += solver_seconds(stderr)
        queries += stderr.count(b'"total_time"')  # QSYM prints it before each solver check
        files = sorted(p for p in out.iterdir() if p.is_file() and not p.name.startswith("."))
        generated += len(files)
        files_per_run.append(len(files))
        files = [p for p in files if _first_seen(p, seen)]
        for path, cov in zip(files, probe.probe(files) if files else [], strict=True):
            if cmap.merge(cov):
                if cov.status is Status.OK:
                    kept += 1
                    queue.append(path.rename(queue_dir / f"id:{len(queue):06d}"))
                elif cov.status is Status.CRASH:
                    crashes += 1
            note()
        shutil.rmtree(out)
    active = min(time.monotonic() - started, budget)
    return {
        "series": series,
        "stop": stop,
        "seconds": active,
        "executions": executions,
        "timeouts": timeouts,
        "generated": generated,
        "unique": len(seen),
        "kept": kept,
        "unique_crashes": crashes,
        "solver_seconds": solver,
        "solver_queries": queries,
        "triage_seconds": probe.stats.seconds,
        "max_files_per_run": max(files_per_run, default=0),
    }


# --------------------------------------------------------------------------- campaigns


def replayed_series(out: Path, afl: Path, stats: dict, launched: float,
                    scratch: Path) -> list[tuple[float, int]]:
    """Edges over time at the instants the master committed them (ms grain).

    Every queue entry but the seeds is named `src:PARENT`: it was kept when PARENT's result
    was committed, at the time state/done.jsonl gives for PARENT. The queue is probed again
    with afl-showmap and merged in that order, as the master merged it.
    """
    done = {}
    for record in CampaignDir(out).read_done():
        done.setdefault(record["sha256"], record["time"])
    entries = sorted(p for p in (out / "queue").iterdir() if p.name.startswith("id:"))
    by_id = {p.name[3:9]: p for p in entries}
    start = stats["start_time"]
    timed = []
    for path in entries:
        fields = dict(f.split(":", 1) for f in path.name.split(",") if ":" in f)
        if "src" in fields:
            parent = hashlib.sha256(by_id[fields["src"]].read_bytes()).hexdigest()
            timed.append((done[parent], path))
        else:
            timed.append((start, path))
    timed.sort(key=lambda pair: pair[0])
    probe = CoverageProbe([str(afl), "@@"], timeout=RUN_TIMEOUT, scratch_dir=scratch)
    cmap = CoverageMap()
    points = []
    for (t, _), cov in zip(timed, probe.probe([p for _, p in timed]), strict=True):
        cmap.merge(cov)
        points.append((t - launched, cmap.edges_covered))
    return step_series(points)


def campaign(symcc: Path, afl: Path, seeds: Path, workers: int, pruning: str, budget: float,
             out: Path) -> dict:
    stats, launched, samples = run_campaign_sampled(
        out, "--executor", "symcc", "--target", f"{symcc} @@", "--afl-target", f"{afl} @@",
        "--seeds", str(seeds), "--wall-timeout", f"{budget:g}", "--timeout", f"{RUN_TIMEOUT:g}",
        "--workers", str(workers), "--pruning", pruning)
    reported = reported_series(out, stats, launched, samples)
    replayed = replayed_series(out, afl, stats, launched, out.parent)
    # The replay must land on the campaign's own count; if it does not, trust the reports.
    exact = replayed[-1][1] == stats["edges_found"]
    extra = stats.get("extra", {})
    loop = extra.get("master_loop_seconds") or 0.0
    return {
        "series": replayed if exact else reported,
        "reported_series": reported,
        "replay_matches": exact,
        "replayed_edges": replayed[-1][1],
        "stop": extra.get("stop_reason", ""),
        "seconds": stats["elapsed"],
        "startup_seconds": stats["start_time"] - launched,
        "command_seconds": stats["command_seconds"],
        "executions": stats["executions"],
        "generated": stats["generated"],
        "unique": stats.get("unique", 0),
        "kept": stats.get("interesting", 0),
        "unique_crashes": stats.get("crashes", 0),
        "solver_seconds": stats["solver_time"],
        "solver_queries": extra.get("solver", {}).get("queries", 0),
        "final_edges_after_budget": stats["edges_found"],
        "master_cpu_percent": 100 * extra["master_loop_cpu_seconds"] / loop if loop else None,
    }


# --------------------------------------------------------------------------- figures


def figures(name: str, run: dict, budget: float, ref_edges: int, ref_time: float) -> dict:
    reach = time_to(run["series"], ref_edges, budget)
    executions = run["executions"]
    row = {
        "config": name,
        "edges": edges_at(run["series"], budget),
        "seconds_to_ref_edges": reach,
        "ratio_to_ref_time": reach / ref_time if reach is not None and ref_time > 0 else None,
        "executions": executions,
        "execs_per_sec": executions / run["seconds"] if run["seconds"] > 0 else 0.0,
        "solver_ms_per_exec": 1000 * run["solver_seconds"] / executions if executions else 0.0,
        "queries_per_exec": run["solver_queries"] / executions if executions else 0.0,
        "files_per_exec": run["generated"] / executions if executions else 0.0,
        "new_files_per_exec": run["unique"] / executions if executions else 0.0,
        "kept": run["kept"],
        "master_cpu_percent": run.get("master_cpu_percent"),
        "stop": run["stop"],
    }
    if "reported_series" in run:  # campaigns: the ~1 s grain of plot_data and stats.json
        row["seconds_to_ref_edges_reported"] = time_to(run["reported_series"], ref_edges, budget)
        row["edges_after_budget"] = run["final_edges_after_budget"]
        row["replay_matches_campaign"] = run["replay_matches"]
        row["startup_seconds"] = run["startup_seconds"]
    return row


def _compact(series: list[tuple[float, int]]) -> list[list]:
    """The series for the JSON line: ms grain, one point per instant (its highest count)."""
    points: dict[float, int] = {}
    for t, edges in series:
        points[round(t, 3)] = edges
    return [[t, e] for t, e in points.items()]


def _row(f: dict) -> list:
    def opt(value, fmt):
        return "never" if value is None else fmt.format(value)
    master = f["master_cpu_percent"]
    return [f["config"], f["edges"], opt(f["seconds_to_ref_edges"], "{:.1f}"),
            opt(f["ratio_to_ref_time"], "{:.2f}x"), f["executions"],
            f"{f['execs_per_sec']:.2f}", f"{f['solver_ms_per_exec']:.1f}",
            f"{f['queries_per_exec']:.1f}", f"{f['files_per_exec']:.1f}",
            f"{f['new_files_per_exec']:.1f}", f["kept"],
            "-" if master is None else f"{master:.1f}", f["stop"]]


COLUMNS = ["config", "edges", "t_ref_edges_s", "ratio", "execs", "execs/s", "solver_ms/exec",
           "queries/exec", "files/exec", "new/exec", "kept", "master_%cpu", "stopped"]


# --------------------------------------------------------------------------- plot


def plot(target: str, runs: dict[str, dict], budget: float, plot_dir: Path) -> tuple[Path, str]:
    """Edges over time, one line per configuration; returns (image path, text rendering)."""
    plot_dir.mkdir(parents=True, exist_ok=True)
    blocks, curves = [], []
    # From a little below the seeds' coverage: the climb is where the configurations differ.
    floor = int(0.9 * min((run["series"][1][1] for run in runs.values()
                           if len(run["series"]) > 1), default=0))
    for i, (name, run) in enumerate(runs.items()):
        points = [(t, e) for t, e in run["series"] if t <= budget]
        points.append((budget, edges_at(run["series"], budget)))
        blocks.append(f"$d{i} << EOD\n" + "".join(f"{t:.3f} {e}\n" for t, e in points) + "EOD")
        width = 3 if name in (REFERENCE, GOAL_CONFIG) else 1.5
        curves.append(f"$d{i} with steps lw {width} title '{name}'")
    body = "\n".join(blocks) + (
        f"\nset title 'symcc\\_scaling: {target}, {budget:g} s each (edges vs seconds since "
        "launch)'\nset xlabel 'seconds'\nset ylabel 'AFL edges'\nset key bottom right\n"
        f"set xrange [0:{budget:g}]\nset yrange [{floor:d}:*]\nset grid\n"
        "plot " + ", \\\n     ".join(curves) + "\n")
    terminal, ext = gnuplot_terminal()
    image = plot_dir / f"symcc_scaling-{target}.{ext}"
    script = plot_dir / f"symcc_scaling-{target}.gp"
    script.write_text(f"set terminal {terminal} size 1000,600\nset output '{image}'\n{body}")
    subprocess.run(["gnuplot", str(script)], check=True, stdin=subprocess.DEVNULL)
    text = subprocess.run(["gnuplot"], input=f"set terminal dumb size 110,32\n{body}",
                          capture_output=True, text=True, check=True).stdout
    (plot_dir / f"symcc_scaling-{target}.txt").write_text(text)
    return image, text


# --------------------------------------------------------------------------- main


def warm_up(symcc: Path, afl: Path, seeds: Path, scratch: Path) -> None:
    """One untimed run of each binary, and the campaigns' query-counter library built, so
    that the first configuration measured pays no first-run cost the others do not."""
    counters_library()
    seed = min(p for p in seeds.iterdir() if p.is_file())
    out = scratch / "warm-up"
    out.mkdir()
    _run_symcc(symcc, seed, out, scratch / "warm-up.map", RUN_TIMEOUT)
    CoverageProbe([str(afl), "@@"], timeout=RUN_TIMEOUT, scratch_dir=scratch).probe([seed])
    shutil.rmtree(out)
    (scratch / "warm-up.map").unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET, metavar="SECONDS",
                        help=f"wall budget of every configuration (default {DEFAULT_BUDGET:g})")
    parser.add_argument("--target", action="append", metavar="NAME",
                        help="example target (repeatable; default: json)")
    parser.add_argument("--plot-dir", type=Path, default=ROOT / "benchmarks" / "results",
                        help="where the plots go (default benchmarks/results/)")
    parser.add_argument("--examples", type=Path, default=EXAMPLES, metavar="DIR",
                        help="take build/NAME.symcc, build/NAME.afl and seeds/NAME/ from DIR "
                             "(default examples/, after `make -s -C examples`)")
    args = parser.parse_args()
    if not args.budget > 0:
        parser.error("--budget must be positive")
    targets = build_targets("symcc_scaling", args.target or list(DEFAULT_TARGETS),
                            args.examples)
    load = os.getloadavg()
    print(f"symcc_scaling: {len(targets)} target(s) x {len(CONFIGURATIONS) + 1} configurations, "
          f"{args.budget:g} s each; {os.cpu_count()} CPUs, load average at start "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"goal: {GOAL_CONFIG} reaches the reference's final edges in <= {RATIO_TARGET}x its "
          f"time, ends with at least its edges, master <= {MASTER_SHARE_TARGET:g}% of a core")
    results = {}
    for target, (symcc, afl, seeds) in targets.items():
        runs: dict[str, dict] = {}
        with tempfile.TemporaryDirectory(prefix=f"symcc-scaling-{target}-") as scratch:
            warm_up(symcc, afl, seeds, Path(scratch))
            ref_dir = Path(scratch, "reference")
            ref_dir.mkdir()
            print(f"[{target}] reference loop ...", flush=True)
            runs[REFERENCE] = reference_loop(symcc, afl, seeds, args.budget, ref_dir)
            for workers, pruning in CONFIGURATIONS:
                name = f"{workers}w {pruning}"
                print(f"[{target}] {name} ...", flush=True)
                runs[name] = campaign(symcc, afl, seeds, workers, pruning, args.budget,
                                      Path(scratch, name.replace(" ", "-")))
        ref_edges = edges_at(runs[REFERENCE]["series"], args.budget)
        ref_time = time_to(runs[REFERENCE]["series"], ref_edges, args.budget) or 0.0
        table = [figures(name, run, args.budget, ref_edges, ref_time)
                 for name, run in runs.items()]
        goal = next(f for f in table if f["config"] == GOAL_CONFIG)
        verdict = {
            "ratio": goal["ratio_to_ref_time"] is not None
            and goal["ratio_to_ref_time"] <= RATIO_TARGET,
            "edges": goal["edges"] >= ref_edges,
            "master": goal["master_cpu_percent"] is not None
            and goal["master_cpu_percent"] <= MASTER_SHARE_TARGET,
        }
        image, text = plot(target, runs, args.budget, args.plot_dir)
        print(f"\n{target}: reference reached its final {ref_edges} edges at {ref_time:.1f} s "
              f"({runs[REFERENCE]['stop']} after {runs[REFERENCE]['seconds']:.1f} s); "
              "times count from launch; campaign start-up (launch to master start): "
              + ", ".join(f"{n} {r['startup_seconds']:.1f} s" for n, r in runs.items()
                          if n != REFERENCE))
        print_table(COLUMNS, [_row(f) for f in table])
        unmatched = [f["config"] for f in table if f.get("replay_matches_campaign") is False]
        print("campaign times: replayed from queue/ and state/done.jsonl (ms grain)"
              + (f"; replay did not match, ~1 s reported series used: {', '.join(unmatched)}"
                 if unmatched else ", every replay matched the campaign's edge count"))
        print(text.rstrip("\n"))
        print(f"plot: {image}")
        print(f"goal ({GOAL_CONFIG}): ratio {_row(goal)[3]} (<= {RATIO_TARGET}x) "
              f"{'ok' if verdict['ratio'] else 'MISSED'}; edges {goal['edges']} vs "
              f"{ref_edges} {'ok' if verdict['edges'] else 'MISSED'}; master "
              f"{_row(goal)[11]}% (<= {MASTER_SHARE_TARGET:g}%) "
              f"{'ok' if verdict['master'] else 'MISSED'}")
        results[target] = {
            "reference_edges": ref_edges,
            "reference_seconds_to_final": ref_time,
            "goal_met": all(verdict.values()),
            "goal": verdict,
            "plot": str(image),
            "configs": table,
            "series": {n: _compact(r["series"]) for n, r in runs.items()},
        }
    end_load = os.getloadavg()
    print(f"load average at the end {end_load[0]:.2f} {end_load[1]:.2f} {end_load[2]:.2f}")
    print(json.dumps({"benchmark": "symcc_scaling", "budget_seconds": args.budget,
                      "cpus": os.cpu_count(), "load_average_at_start": list(load),
                      "load_average_at_end": list(end_load),
                      "goal_config": GOAL_CONFIG, "ratio_target": RATIO_TARGET,
                      "master_cpu_target": MASTER_SHARE_TARGET,
                      "goal_met": all(r["goal_met"] for r in results.values()),
                      "targets": results}))


if __name__ == "__main__":
    main()
