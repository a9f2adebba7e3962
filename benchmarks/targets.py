"""Splitting: time to the same coverage and unique targets solved per CPU-second, on vs off.

One input's branches split among free workers (`explore --split`, scheduling/splitting.py)
against whole inputs only (`--no-split`), where splitting should matter most: one seed and
more workers than the frontier has inputs at first. Per example target (default json and
ini, one seed file each), per executor (real SymCC on the `.symcc` build, Triton on the
plain build), 4 workers on this machine's cores (oversubscribed), AFL triage on the `.afl`
build, the same wall budget, each pair of runs repeated with the order of on and off
alternated (a machine that warms up or gets busier favours neither). Reported per run:
- edges over time, as the campaign reported them (stats.json read every 0.2 s and plot_data:
  ~1 s grain, counted from the launch), final edges, executions, executor seconds;
- time to the same coverage: when each run of a pair reached the lower of the pair's two
  final edge counts, and the ratio on/off (below 1: splitting got there sooner);
- what splitting did (stats.json `extra.splitting`): traces, groups, group dispatches, the
  targets the traces reported (`targets_on_paths`) and the distinct branch targets handed to
  the solver (`targets_solved`, whole-input runs' included);
- unique targets solved per CPU-second: targets_solved over the CPU of the whole process
  tree (launcher, mpiexec, every rank and every target run it waited for:
  getrusage(RUSAGE_CHILDREN) around the launch, checked against /proc sampled during the
  run), and per executor-second (the workers' summed run time).
Timings are reported, never asserted: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from _campaign import (
    EXAMPLES,
    ROOT,
    edges_at,
    gnuplot_terminal,
    make_examples,
    print_table,
    reported_series,
    run_campaign_sampled,
    time_to,
)

# One seed each, the shortest file of examples/seeds/TARGET. Both lengths were measured
# (README.md, benchmarks): from the longest (json item, ini users) splitting was slower with
# both executors and changed nothing else; from these it showed the cases where it differs
# (ini/symcc ends with more edges, json/triton at parity).
DEFAULT_SEEDS = {"json": "not-an-object", "ini": "env"}
EXECUTORS = ("symcc", "triton")
DEFAULT_BUDGET = 60.0  # per run: 2 targets x 2 executors x 2 modes x 2 repeats ~ 16 min
DEFAULT_REPEAT = 2
WORKERS = 4
RUN_TIMEOUT = 10.0  # seconds per execution, the campaigns' default
SPLIT = {True: "--split", False: "--no-split"}


def mode(split: bool) -> str:
    return "on" if split else "off"


def campaign(target: str, executor: str, seed: Path, split: bool, budget: float,
             out: Path) -> dict:
    build = EXAMPLES / "build"
    program = build / (f"{target}.symcc" if executor == "symcc" else target)
    seeds = out.parent / f"{out.name}-seed"
    seeds.mkdir()
    (seeds / seed.name).write_bytes(seed.read_bytes())
    stats, launched, samples = run_campaign_sampled(
        out, "--executor", executor, "--target", f"{program} @@",
        "--afl-target", f"{build / target}.afl @@", "--seeds", str(seeds),
        "--workers", str(WORKERS), "--wall-timeout", f"{budget:g}",
        "--timeout", f"{RUN_TIMEOUT:g}", SPLIT[split], watch_tree=True)
    extra = stats["extra"]
    return {
        "series": reported_series(out, stats, launched, samples),
        "edges_after_budget": stats["edges_found"],
        "map_size": stats["map_size"],
        "executions": stats["executions"],
        "executor_seconds": stats["executor_time"],
        "solver_seconds": stats["solver_time"],
        "pending_at_end": stats["pending"],
        "cpu_seconds": stats["tree_cpu_seconds"],
        "cpu_seconds_seen": stats["tree_cpu_seconds_seen"],
        "processes_escaped": stats["tree_processes_escaped"],
        "startup_seconds": stats["start_time"] - launched,
        "stop": extra.get("stop_reason", ""),
        "splitting": extra["splitting"],
    }


def figures(run: dict, common_edges: int, other_time: float | None, budget: float) -> dict:
    """One run's row; `other_time`: when the other run of its pair reached `common_edges`."""
    reach = time_to(run["series"], common_edges, budget)
    solved = run["splitting"]["targets_solved"]
    return {
        "edges": edges_at(run["series"], budget),
        "common_edges": common_edges,
        "seconds_to_common": reach,
        "ratio_to_other": reach / other_time if reach is not None and other_time else None,
        "executions": run["executions"],
        "traces": run["splitting"]["traces"],
        "groups": run["splitting"]["groups"],
        "split_dispatches": run["splitting"]["split_dispatches"],
        "targets_on_paths": run["splitting"]["targets_on_paths"],
        "targets_solved": solved,
        "cpu_seconds": run["cpu_seconds"],
        "cpu_seconds_seen": run["cpu_seconds_seen"],
        "processes_escaped": run["processes_escaped"],
        "executor_seconds": run["executor_seconds"],
        "solver_seconds": run["solver_seconds"],
        "solved_per_cpu_second": solved / run["cpu_seconds"] if run["cpu_seconds"] else 0.0,
        "solved_per_executor_second": solved / run["executor_seconds"]
        if run["executor_seconds"] else 0.0,
        "pending_at_end": run["pending_at_end"],
        "startup_seconds": run["startup_seconds"],
        "stop": run["stop"],
    }


def pair_figures(on: dict, off: dict, budget: float) -> tuple[dict, dict]:
    common = min(edges_at(on["series"], budget), edges_at(off["series"], budget))
    on_time = time_to(on["series"], common, budget)
    off_time = time_to(off["series"], common, budget)
    return figures(on, common, off_time, budget), figures(off, common, on_time, budget)


COLUMNS = ["target", "executor", "split", "rep", "edges", "common", "t_common_s", "on/off",
           "execs", "traces", "groups", "split_disp", "on_paths", "solved", "cpu_s",
           "cpu_s_/proc", "exec_s", "solver_s", "solved/cpu_s", "solved/exec_s", "pending"]


def _row(f: dict) -> list:
    reach, ratio = f["seconds_to_common"], f["ratio_to_other"]
    return [f["target"], f["executor"], f["split"], f["repeat"], f["edges"], f["common_edges"],
            "never" if reach is None else f"{reach:.1f}",
            ("-" if ratio is None else f"{ratio:.2f}x") if f["split"] == "on" else "",
            f["executions"], f["traces"], f["groups"], f["split_dispatches"],
            f["targets_on_paths"], f["targets_solved"], f"{f['cpu_seconds']:.1f}",
            f"{f['cpu_seconds_seen']:.1f}", f"{f['executor_seconds']:.1f}",
            f"{f['solver_seconds']:.1f}",
            f"{f['solved_per_cpu_second']:.2f}", f"{f['solved_per_executor_second']:.2f}",
            f["pending_at_end"]]


def summary(rows: list[dict]) -> dict:
    """Per mode, the medians over the repeats of a (target, executor)."""
    by_mode = {m: [r for r in rows if r["split"] == m] for m in ("on", "off")}
    ratios = [r["ratio_to_other"] for r in by_mode["on"] if r["ratio_to_other"] is not None]
    return {
        "time_ratio_on_off": statistics.median(ratios) if ratios else None,
        **{f"{key}_{m}": statistics.median(r[key] for r in by_mode[m])
           for m in ("on", "off")
           for key in ("edges", "seconds_to_common", "targets_solved",
                       "solved_per_cpu_second", "solved_per_executor_second")
           if all(r[key] is not None for r in by_mode[m])},
    }


# --------------------------------------------------------------------------- plot


def plot(target: str, seed: str, executor: str, runs: list[tuple[str, int, dict]], budget: float,
         plot_dir: Path) -> tuple[Path, str]:
    """Edges over time, on (solid) vs off (dashed), one line per run; (image, text)."""
    plot_dir.mkdir(parents=True, exist_ok=True)
    blocks, curves = [], []
    # From a little below the seed's coverage: the climb is where the modes differ.
    floor = int(0.9 * min((run["series"][1][1] for _, _, run in runs
                           if len(run["series"]) > 1), default=0))
    for i, (split, repeat, run) in enumerate(runs):
        points = [(t, e) for t, e in run["series"] if t <= budget]
        points.append((budget, edges_at(run["series"], budget)))
        blocks.append(f"$d{i} << EOD\n" + "".join(f"{t:.3f} {e}\n" for t, e in points) + "EOD")
        style = "dt 1 lw 2" if split == "on" else "dt 2 lw 2"
        curves.append(f"$d{i} with steps {style} lc {repeat + 1} "
                      f"title 'split {split} #{repeat + 1}'")
    name = f"targets-{target}-{seed}-{executor}"
    body = "\n".join(blocks) + (
        f"\nset title 'targets: {target} ({seed}), {executor}, {WORKERS} workers, {budget:g} s "
        "(edges vs seconds since launch)'\nset xlabel 'seconds'\nset ylabel 'AFL edges'\n"
        f"set key bottom right\nset xrange [0:{budget:g}]\nset yrange [{floor:d}:*]\nset grid\n"
        "plot " + ", \\\n     ".join(curves) + "\n")
    terminal, ext = gnuplot_terminal()
    image = plot_dir / f"{name}.{ext}"
    script = plot_dir / f"{name}.gp"
    script.write_text(f"set terminal {terminal} size 1000,600\nset output '{image}'\n{body}")
    subprocess.run(["gnuplot", str(script)], check=True, stdin=subprocess.DEVNULL)
    text = subprocess.run(["gnuplot"], input=f"set terminal dumb size 100,24\n{body}",
                          capture_output=True, text=True, check=True).stdout
    (plot_dir / f"{name}.txt").write_text(text)
    return image, text


# --------------------------------------------------------------------------- main


def seed_choice(text: str) -> tuple[str, str]:
    target, separator, seed = text.partition(":")
    if not separator or not target or not seed:
        raise argparse.ArgumentTypeError(f"expected TARGET:SEED_FILE, not {text!r}")
    return target, seed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET, metavar="SECONDS",
                        help=f"wall budget of every run (default {DEFAULT_BUDGET:g})")
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEAT, metavar="N",
                        help=f"pairs of runs per target and executor (default {DEFAULT_REPEAT})")
    parser.add_argument("--seed", type=seed_choice, action="append", metavar="TARGET:FILE",
                        help="measure TARGET from examples/seeds/TARGET/FILE (repeatable; "
                             "default: " + ", ".join(f"{t}:{s}" for t, s in
                                                     DEFAULT_SEEDS.items()) + ")")
    parser.add_argument("--executor", choices=EXECUTORS, action="append",
                        help="repeatable; default: both")
    parser.add_argument("--plot-dir", type=Path, default=ROOT / "benchmarks" / "results",
                        help="where the plots go (default benchmarks/results/)")
    args = parser.parse_args()
    if not args.budget > 0 or args.repeat < 1:
        parser.error("--budget must be positive and --repeat at least 1")
    seeds = args.seed or list(DEFAULT_SEEDS.items())
    executors = args.executor or list(EXECUTORS)
    make_examples()
    for target, seed in seeds:
        if not (EXAMPLES / "seeds" / target / seed).is_file():
            parser.error(f"no seed examples/seeds/{target}/{seed}")
    load = os.getloadavg()
    print(f"targets: {len(seeds)} target(s) x {len(executors)} executor(s) x split on/off x "
          f"{args.repeat}, 1 seed, {WORKERS} workers, {args.budget:g} s each; "
          f"{os.cpu_count()} CPUs, load average at start {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f}", flush=True)
    rows, results, plots = [], {}, []
    for target, seed in seeds:
        seed_path = EXAMPLES / "seeds" / target / seed
        for executor in executors:
            runs: list[tuple[str, int, dict]] = []
            config_rows = []
            with tempfile.TemporaryDirectory(prefix=f"targets-{target}-{executor}-") as scratch:
                for repeat in range(args.repeat):
                    # Alternate which mode goes first: neither gets the warmer machine.
                    order = (True, False) if repeat % 2 == 0 else (False, True)
                    pair = {}
                    for split in order:
                        print(f"[{target} {executor}] split {mode(split)} #{repeat + 1} ...",
                              flush=True)
                        pair[split] = campaign(target, executor, seed_path, split,
                                               args.budget,
                                               Path(scratch, f"{mode(split)}{repeat}"))
                        runs.append((mode(split), repeat, pair[split]))
                    on, off = pair_figures(pair[True], pair[False], args.budget)
                    for split, row in ((True, on), (False, off)):
                        config_rows.append({"target": target, "seed": seed,
                                            "seed_bytes": seed_path.stat().st_size,
                                            "executor": executor, "split": mode(split),
                                            "repeat": repeat + 1, **row})
            image, text = plot(target, seed, executor, runs, args.budget, args.plot_dir)
            plots.append((image, text))
            rows += config_rows
            results[f"{target}:{seed}/{executor}"] = {
                "seed": seed, "seed_bytes": seed_path.stat().st_size, "plot": str(image),
                "summary": summary(config_rows),
                "series": {f"{split} #{repeat + 1}": [[round(t, 3), e] for t, e in run["series"]]
                           for split, repeat, run in runs}}
    print()
    print_table(COLUMNS, [_row(r) for r in rows])
    escaped = sum((Counter(r["processes_escaped"]) for r in rows), Counter())
    print("on/off: time to the pair's common edges, split on over split off (< 1: on is "
          "sooner); cpu_s: getrusage(RUSAGE_CHILDREN) of the launch, cpu_s_/proc: the same "
          "tree read from /proc every 0.2 s (a lower bound); left the tree unwaited, their CPU "
          "missing from cpu_s: " + (", ".join(f"{n} x {name}" for name, n in escaped.items())
                                    or "none"))
    for image, text in plots:
        print(text.rstrip("\n"))
        print(f"plot: {image}")
    print()
    for name, result in results.items():
        s = result["summary"]
        ratio = s["time_ratio_on_off"]
        print(f"{name} ({result['seed_bytes']} bytes): split on reaches "
              "the same coverage in "
              + ("-" if ratio is None else f"{ratio:.2f}x") + " the time of off (median); "
              f"unique targets solved per CPU-second {s['solved_per_cpu_second_on']:.2f} on vs "
              f"{s['solved_per_cpu_second_off']:.2f} off, per executor-second "
              f"{s['solved_per_executor_second_on']:.2f} vs "
              f"{s['solved_per_executor_second_off']:.2f}; final edges "
              f"{s['edges_on']:g} vs {s['edges_off']:g}")
    end_load = os.getloadavg()
    print(f"load average at the end {end_load[0]:.2f} {end_load[1]:.2f} {end_load[2]:.2f}")
    print(json.dumps({"benchmark": "targets", "budget_seconds": args.budget,
                      "repeat": args.repeat, "workers": WORKERS, "cpus": os.cpu_count(),
                      "load_average_at_start": list(load), "load_average_at_end": list(end_load),
                      "runs": rows, "configs": results}))


if __name__ == "__main__":
    main()
