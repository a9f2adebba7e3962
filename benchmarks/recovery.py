"""Recovery under ULFM: how long a campaign stops dispatching when a rank is SIGKILLed, and
what fault tolerance costs the master per task when nothing fails.

1. Kills from outside. `symcc-mpi explore` campaigns (`--fault-tolerance on`, 1 master +
   WORKERS workers on this machine, oversubscribed) run an executor whose executions leave
   the cores to the ranks: `--executor symcc` on `/bin/sleep EXECUTION`, an execution of a
   fixed length that generates nothing, over SEEDS seeds (so the frontier never runs dry
   and the next generation has work to send at once). Once a campaign runs, the benchmark
   finds its ranks' pids (OMPI_COMM_WORLD_RANK in /proc/PID/environ), SIGKILLs one, noting
   time.time() just before, and waits for stats.json's `extra.failures` to get the record
   of that recovery (it must name the killed pid) with its `first_dispatch` set, then for
   the campaign to dispatch a few more inputs, then kills the next. Each campaign follows a
   plan of kills (worker, worker, master / worker, master, worker: a master is killed after
   a worker death and before one), so CAMPAIGNS campaigns make >= 10 worker kills and >= 5
   master kills. After a master kill the master is the lowest surviving world rank (a
   shrink keeps the ranks' order); the record's `master: new` confirms it. Then the
   campaign is asked to stop (OUT/.stop-request); its exit status (or a hang at exit,
   then ended by Ctrl-C as a user would) and `symcc-mpi verify` are in the table.
   Per kind of kill: median and worst of kill -> first WORK of the new generation (the
   figure the goal is about), and where that time goes: kill -> a survivor saw the failure
   (`detected`), the repair itself (`recovery_seconds`: revoke, prepare, shrink, agree,
   commit), and, for a master, the take-over (opening the campaign from OUT) inside the
   rest. Goal: median kill -> first dispatch <= 2 s.

   Detector: Open MPI's defaults (no heartbeat, `mpi_ft_detector` off). A SIGKILLed rank is
   reported by its node's PRRTE daemon, which sees the child exit at once; survivors learn
   of it at their next MPI call (the master asks Get_failed every 0.1 s, a worker probes
   its master every 0.05 s while executing). Measured here, kill -> detected is a small
   part of the total (see the figures), so a heartbeat detector would only add traffic
   and false suspicions on a busy machine: it is what catches a hung or partitioned node,
   which a process kill is not. `--detector PERIOD,TIMEOUT` reruns the kills with
   `mpi_ft_detector` on (through OMPI_MCA_* in the environment) to compare.

2. Master time per task, fault tolerance on vs off: the noop executor over TASKS seeds with
   2 and 4 workers, median of `extra.master_task_time` and master CPU per task. `on` also
   changes the transport (`--mca pml ob1 --mca btl tcp,self` instead of shared memory,
   ulfm/capability.py), so a third configuration runs `off` under the benchmark's own
   mpiexec with that transport: the launcher's `--mca btl ^ofi` is on mpiexec's command
   line, which takes precedence over OMPI_MCA_btl in the environment, so the environment
   alone cannot change it. on - off is the whole cost; (off over tcp) - off is the
   transport's part, on - (off over tcp) the recovery machinery's (the dispatch record
   written before each WORK, the Get_failed polls). Goal: on - off <= +0.2 ms per task.
   Configurations alternate within each repetition, so a load change on the shared machine
   hits them alike; each figure is the median over --repeats (default 2) runs.

3. `--previous-tree DIR` (a git worktree of another revision): every kill campaign and every
   overhead run is made at both revisions, this one and DIR's (its `src` through PYTHONPATH
   in the campaign's environment), one after the other, so that both see the same machine;
   every table has a `revision` column, and a last table puts the figures side by side as
   this / previous.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _campaign import CLI, ROOT, compile_sources, print_table, run_campaign

from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.job.launch import find_mpiexec

WORKERS = 5
SEEDS = 1000
EXECUTION = 0.2  # seconds, of each execution in the kill campaigns
PLANS = (("worker", "worker", "master"), ("worker", "master", "worker"))
CAMPAIGNS = 5
GOAL_SECONDS = 2.0
TASKS = 3000
OVERHEAD_WORKERS = (2, 4)
REPEATS = 2
GOAL_MS = 0.2
RUNNING_AFTER = 20  # executions before the first kill: the campaign is in its stride
SETTLE_EXECUTIONS = 10  # executions of the new generation before the next kill
WAIT_SECONDS = 120.0  # for any one thing a campaign should do; past it, a hang is reported
POLL = 0.05
EXIT_WAIT = 30.0  # from the stop request to the launcher's exit (executions last EXECUTION)


class CampaignHung(Exception):
    """A campaign did not do what it should within WAIT_SECONDS."""


# --------------------------------------------------------------------------- kills


def _rank_pids(out: Path, ranks: int) -> dict[int, int]:
    """World rank -> pid of the campaign writing to `out` (every rank must be up)."""
    pids: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(out).encode() not in cmdline:
            continue
        for variable in environ:
            if variable.startswith(b"OMPI_COMM_WORLD_RANK="):
                pids[int(variable.split(b"=", 1)[1])] = int(entry)
    if sorted(pids) != list(range(ranks)):
        raise CampaignHung(f"{out}: found ranks {sorted(pids)} of {ranks}")
    return pids


def _stats(out: Path) -> dict | None:
    try:
        return json.loads((out / "stats.json").read_text())
    except (OSError, ValueError):  # not written yet
        return None


def _wait_stats(out: Path, launcher: subprocess.Popen, what: str, ready) -> dict:
    """The first stats.json for which `ready(stats)` holds, while the campaign runs."""
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        if launcher.poll() is not None:
            raise CampaignHung(f"{out}: the campaign ended (exit status {launcher.returncode}) "
                               f"before {what}")
        stats = _stats(out)
        if stats is not None and ready(stats):
            return stats
        time.sleep(POLL)
    raise CampaignHung(f"{out}: {what} did not happen within {WAIT_SECONDS:g} s")


def _names_pid(record: dict, pid: int) -> bool:
    """Whether a failure record names the process `pid` (worker: "rank R (pid P on H, ...",
    master: its endpoint "HOST/P/START (generation G)")."""
    return any(f"pid {pid} " in failed or f"/{pid}/" in failed for failed in record["failed"])


def kill_campaign(scratch: Path, number: int, plan: tuple[str, ...], seeds: Path,
                  chooser: random.Random, env: dict,
                  revision: str = "this") -> tuple[list[dict], dict]:
    """Run one campaign through `plan`'s kills: (one figure per kill, the campaign's end)."""
    out = scratch / f"kills{number}-{revision}"
    log = (scratch / f"kills{number}-{revision}.log").open("w")
    command = [*CLI, "explore", "--out", str(out), "--no-live", "--fault-tolerance", "on",
               "--executor", "symcc", "--pruning", "off", "--target", f"/bin/sleep {EXECUTION}",
               "--seeds", str(seeds), "--workers", str(WORKERS), "--wall-timeout", "3600"]
    # /bin/sleep stands in for a SymCC build of fixed run time: not one, by design.
    launcher = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**env, "SYMCC_MPI_SKIP_BIN_CHECK": "1"})
    kills: list[dict] = []
    try:
        stats = _wait_stats(out, launcher, f"{RUNNING_AFTER} executions",
                            lambda s: s["executions"] >= RUNNING_AFTER)
        pids = _rank_pids(out, WORKERS + 1)
        alive = set(pids)
        for kind in plan:
            master = min(alive)
            victim = master if kind == "master" else chooser.choice(sorted(alive - {master}))
            before = len(stats["extra"].get("failures", []))
            killed_at = time.time()
            os.kill(pids[victim], signal.SIGKILL)
            alive.discard(victim)
            stats = _wait_stats(
                out, launcher, f"the recovery from the kill of world rank {victim}",
                lambda s, n=before: len(s["extra"].get("failures", [])) > n
                and s["extra"]["failures"][n]["first_dispatch"] is not None)
            record = stats["extra"]["failures"][before]
            if not _names_pid(record, pids[victim]) or record["master"] != (
                    "new" if kind == "master" else "kept"):
                raise CampaignHung(f"{out}: the recovery after killing world rank {victim} "
                                   f"(pid {pids[victim]}) records {record}")
            kills.append({
                "revision": revision, "campaign": number, "kind": kind, "world_rank": victim,
                "to_first_dispatch": record["first_dispatch"] - killed_at,
                "to_detected": record["detected"] - killed_at,
                "recovery": record["recovery_seconds"],
                "requeued": record["requeued"],
            })
            settled = stats["executions"] + SETTLE_EXECUTIONS
            stats = _wait_stats(out, launcher,
                                f"{SETTLE_EXECUTIONS} executions after the recovery",
                                lambda s, n=settled: s["executions"] >= n)
        CampaignDir(out).request_stop(stats["extra"]["run_id"])
        try:
            exit_status = launcher.wait(timeout=EXIT_WAIT)
        except subprocess.TimeoutExpired:
            # Seen: every survivor stuck in MPI_Finalize after the master finished. Said in
            # the table, and the campaign still verified: what was committed must hold.
            _end(launcher)
            exit_status = f"hung at exit, ended by Ctrl-C: {launcher.returncode}"
    except (CampaignHung, subprocess.TimeoutExpired):
        _end(launcher)
        raise
    finally:
        log.close()
    verify = subprocess.run([*CLI, "verify", str(out)], capture_output=True, text=True,
                            cwd=ROOT, env=env)
    if verify.returncode != 0:
        print(f"{out}: verify failed:\n{verify.stdout}{verify.stderr}", file=sys.stderr)
    end = {"revision": revision, "campaign": number, "plan": "/".join(plan),
           "exit_status": exit_status,
           "verify_ok": verify.returncode == 0, "executions": _stats(out)["executions"]}
    return kills, end


def _end(launcher: subprocess.Popen) -> None:
    """Stop a campaign that went wrong the way a user would: Ctrl-C lets the executions in
    flight finish, a second one terminates the job, a third kills it (README); the launcher
    leaves no rank behind."""
    for _ in range(3):
        launcher.send_signal(signal.SIGINT)
        try:
            launcher.wait(timeout=15)
            return
        except subprocess.TimeoutExpired:
            continue
    launcher.kill()
    launcher.wait()


def summaries(kills: list[dict]) -> list[dict]:
    """Per revision and kind of kill: count, median and worst of each time."""
    figures = []
    for revision, kind in ((r, k) for r in REVISIONS for k in ("worker", "master")):
        chosen = [k for k in kills if k["kind"] == kind and k["revision"] == revision]
        if not chosen:
            continue
        figure: dict = {"revision": revision, "kind": kind, "kills": len(chosen)}
        for name in ("to_first_dispatch", "to_detected", "recovery"):
            values = [k[name] for k in chosen]
            figure[f"{name}_median_s"] = statistics.median(values)
            figure[f"{name}_worst_s"] = max(values)
        figures.append(figure)
    return figures


def detector_setting(text: str) -> str:
    period, _, timeout = text.partition(",")
    try:
        if float(period) > 0 and float(timeout) > 3 * float(period):
            return text
    except ValueError:
        pass
    # Open MPI's rule (ompi_info --param mpi all --level 9): timeout > 3 x period.
    raise argparse.ArgumentTypeError(f"{text!r}: expected PERIOD,TIMEOUT in seconds, "
                                     "PERIOD > 0 and TIMEOUT > 3 x PERIOD")


REVISIONS = ("this", "previous")


def revision_env(env: dict, tree: Path | None) -> dict:
    """`env` for a campaign of this checkout (tree None) or of the source tree `tree`."""
    return env if tree is None else {**env, "PYTHONPATH": str(tree / "src")}


def detector_env(setting: str | None) -> dict:
    env = dict(os.environ)
    if setting is not None:
        period, timeout = setting.split(",")
        env.update(OMPI_MCA_mpi_ft_detector="true", OMPI_MCA_mpi_ft_detector_period=period,
                   OMPI_MCA_mpi_ft_detector_timeout=timeout)
    return env


# --------------------------------------------------------------------------- overhead


def _own_mpiexec(out: Path, seeds: Path, workers: int, env: dict) -> dict:
    """`--fault-tolerance off` under this benchmark's mpiexec, over ULFM's transport."""
    command = [find_mpiexec(), "-n", str(workers + 1), "--oversubscribe", "--bind-to", "none",
               "--mca", "pml", "ob1", "--mca", "btl", "tcp,self"]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    command += [*CLI, "explore", "--out", str(out), "--no-live", "--fault-tolerance", "off",
                "--target", "/bin/true", "--seeds", str(seeds), "--executor", "noop"]
    started = time.monotonic()
    process = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    if process.returncode != 0:
        sys.exit(f"campaign failed ({process.returncode}):\n{process.stdout}\n{process.stderr}")
    stats = json.loads((out / "stats.json").read_text())
    stats["command_seconds"] = time.monotonic() - started
    return stats


OVERHEAD_CONFIGS = ("off", "off over tcp", "on")


def overhead_run(scratch: Path, seeds: Path, config: str, workers: int, repeat: int,
                 revision: str, env: dict) -> dict:
    out = scratch / f"overhead-{config.replace(' ', '-')}-{workers}w-{repeat}-{revision}"
    if config == "off over tcp":
        stats = _own_mpiexec(out, seeds, workers, env)
    else:
        stats = run_campaign(out, "--target", "/bin/true", "--seeds", str(seeds),
                             "--executor", "noop", "--workers", str(workers),
                             "--fault-tolerance", config, env=env)
    if stats["executions"] != TASKS:
        sys.exit(f"{out}: {stats['executions']} executions, not {TASKS}")
    extra = stats["extra"]
    return {"median_ms": extra["master_task_time"]["median_ms"],
            "cpu_ms": extra["master_loop_cpu_seconds"] * 1e3 / TASKS}


def overhead(scratch: Path, trees: dict[str, Path | None],
             repeats: int = REPEATS) -> list[dict]:
    seeds = scratch / "noop-seeds"
    seeds.mkdir()
    for i in range(TASKS):
        (seeds / f"s{i:05d}").write_bytes(os.urandom(32))
    runs: dict[tuple[str, str, int], list[dict]] = {}
    for repeat in range(repeats):
        for workers in OVERHEAD_WORKERS:
            for config in OVERHEAD_CONFIGS:
                for revision, tree in trees.items():
                    runs.setdefault((revision, config, workers), []).append(overhead_run(
                        scratch, seeds, config, workers, repeat, revision,
                        revision_env(dict(os.environ), tree)))
    figures = []
    for revision, workers in ((r, w) for r in trees for w in OVERHEAD_WORKERS):
        row: dict = {"revision": revision, "workers": workers}
        for config in OVERHEAD_CONFIGS:
            key = config.replace(" ", "_")
            chosen = runs[revision, config, workers]
            row[f"{key}_ms"] = statistics.median(r["median_ms"] for r in chosen)
            row[f"{key}_cpu_ms"] = statistics.median(r["cpu_ms"] for r in chosen)
        row["on_minus_off_ms"] = row["on_ms"] - row["off_ms"]
        row["transport_part_ms"] = row["off_over_tcp_ms"] - row["off_ms"]
        row["recovery_part_ms"] = row["on_ms"] - row["off_over_tcp_ms"]
        row["runs_ms"] = {c: [round(r["median_ms"], 4) for r in runs[revision, c, workers]]
                          for c in OVERHEAD_CONFIGS}
        figures.append(row)
    return figures


# --------------------------------------------------------------------------- main


def print_kills(kills: list[dict], campaigns: list[dict], detector: str | None) -> bool:
    """The kill tables; whether the goal was met."""
    print(f"kills: {WORKERS} workers + 1 master, --executor symcc on /bin/sleep {EXECUTION:g} "
          f"({SEEDS} seeds), detector: "
          f"{'mpi_ft_detector ' + detector if detector else 'Open MPI default'}")
    print_table(list(kills[0]), [list(k.values()) for k in kills])
    print()
    print_table(list(campaigns[0]), [list(c.values()) for c in campaigns])
    print()
    summary = summaries(kills)
    print_table(list(summary[0]), [list(s.values()) for s in summary])
    medians = {s["kind"]: s["to_first_dispatch_median_s"] for s in summary
               if s["revision"] == "this"}  # the goal is this revision's
    met = all(m <= GOAL_SECONDS for m in medians.values())
    print(f"goal: median kill -> first dispatch <= {GOAL_SECONDS:g} s: "
          + ", ".join(f"{k} {m:.2f} s" for k, m in medians.items())
          + (" ok" if met else " MISSED"))
    print()
    return met


def print_overhead(figures: list[dict]) -> bool:
    """The on/off table; whether the goal was met."""
    columns = [c for c in figures[0] if c != "runs_ms"]
    print_table(columns, [[f[c] for c in columns] for f in figures])
    worst = max(f["on_minus_off_ms"] for f in figures if f["revision"] == "this")
    met = worst <= GOAL_MS
    print(f"goal: master time per task, on - off <= +{GOAL_MS:g} ms: worst {worst:+.3f} ms"
          + (" ok" if met else " MISSED"))
    return met


def compare(summary: list[dict], overhead_figures: list[dict]) -> list[dict]:
    """The figures of both revisions side by side, with this / previous."""
    rows = []

    def row(figure: str, this: float, previous: float) -> None:
        rows.append({"figure": figure, "this": round(this, 4), "previous": round(previous, 4),
                     "ratio": round(this / previous, 3) if previous else None})

    by = {(s["revision"], s["kind"]): s for s in summary}
    for kind in ("worker", "master"):
        if ("this", kind) in by and ("previous", kind) in by:
            for name in ("to_first_dispatch_median_s", "to_first_dispatch_worst_s",
                         "recovery_median_s"):
                row(f"{kind} kill: {name}", by["this", kind][name], by["previous", kind][name])
    per = {(f["revision"], f["workers"]): f for f in overhead_figures}
    for workers in OVERHEAD_WORKERS:
        if ("this", workers) in per and ("previous", workers) in per:
            for name in ("off_ms", "on_ms", "on_minus_off_ms", "off_cpu_ms", "on_cpu_ms"):
                row(f"{workers} workers: {name}", per["this", workers][name],
                    per["previous", workers][name])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--campaigns", type=int, default=CAMPAIGNS,
                        help=f"kill campaigns (default {CAMPAIGNS}: >= 10 worker and >= 5 "
                             "master kills)")
    parser.add_argument("--detector", metavar="PERIOD,TIMEOUT", type=detector_setting,
                        help="turn Open MPI's heartbeat detector on (mpi_ft_detector) with "
                             "this period and timeout, in seconds")
    parser.add_argument("--repeats", type=int, default=REPEATS,
                        help=f"overhead runs per configuration (default {REPEATS})")
    parser.add_argument("--skip-overhead", action="store_true",
                        help="only the kills (part 1); --campaigns 0: only the overhead")
    parser.add_argument("--previous-tree", type=Path, metavar="DIR",
                        help="also run every campaign at the revision checked out in DIR, "
                             "side by side (part 3)")
    args = parser.parse_args()
    trees: dict[str, Path | None] = {"this": None}
    compile_sources()
    if args.previous_tree is not None:
        if not (args.previous_tree / "src" / "symcc_mpi").is_dir():
            sys.exit(f"recovery: {args.previous_tree} holds no symcc-mpi source tree")
        trees["previous"] = args.previous_tree.resolve()
        compile_sources(trees["previous"])
        where = subprocess.run([*CLI[:1], "-c", "import symcc_mpi; print(symcc_mpi.__file__)"],
                               capture_output=True, text=True,
                               env=revision_env(dict(os.environ), trees["previous"])).stdout
        if not where.startswith(str(trees["previous"])):
            sys.exit(f"recovery: with PYTHONPATH={trees['previous'] / 'src'}, symcc_mpi is "
                     f"{where.strip()!r}")
    load = os.getloadavg()
    chooser = random.Random(10)
    with tempfile.TemporaryDirectory(prefix="symcc-mpi-recovery-") as name:
        scratch = Path(name)
        seeds = scratch / "seeds"
        seeds.mkdir()
        for i in range(SEEDS):
            (seeds / f"s{i:05d}").write_bytes(os.urandom(32))
        kills, campaigns = [], []
        env = detector_env(args.detector)
        for number, (revision, tree) in ((n, r) for n in range(args.campaigns)
                                         for r in trees.items()):
            try:
                done, end = kill_campaign(scratch, number, PLANS[number % len(PLANS)], seeds,
                                          chooser, revision_env(env, tree), revision)
            except (CampaignHung, subprocess.TimeoutExpired) as error:
                log = scratch / f"kills{number}-{revision}.log"
                sys.exit(f"campaign {number} ({revision}): {error}\n--- its log (tail) ---\n"
                         f"{log.read_text(errors='replace')[-4000:]}")
            kills += done
            campaigns.append(end)
        overhead_figures = [] if args.skip_overhead else overhead(scratch, trees, args.repeats)
    recovery_goal = print_kills(kills, campaigns, args.detector) if kills else None
    overhead_goal = print_overhead(overhead_figures) if overhead_figures else None
    side_by_side = compare(summaries(kills), overhead_figures) if len(trees) > 1 else []
    if side_by_side:
        print()
        print(f"this revision against {args.previous_tree} (ratio: this / previous)")
        print_table(list(side_by_side[0]), [list(row.values()) for row in side_by_side])
    end_load = os.getloadavg()
    print(f"load average at start {load[0]:.2f}, at the end {end_load[0]:.2f} "
          f"({os.cpu_count()} cpus)")
    print(json.dumps({
        "benchmark": "recovery", "workers": WORKERS, "seeds": SEEDS,
        "execution_seconds": EXECUTION, "detector": args.detector or "default",
        "goal_seconds": GOAL_SECONDS, "recovery_goal_met": recovery_goal,
        "kills": kills, "campaigns": campaigns, "summary": summaries(kills),
        "overhead_goal_ms": GOAL_MS, "overhead_goal_met": overhead_goal,
        "overhead": overhead_figures, "side_by_side": side_by_side,
        "previous_tree": str(args.previous_tree) if args.previous_tree else None,
        "tasks": TASKS, "cpus": os.cpu_count(),
        "load_average_at_start": list(load), "load_average_at_end": list(end_load)}))


if __name__ == "__main__":
    main()
