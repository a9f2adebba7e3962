"""Resume start-up: from `explore --resume` to the first WORK, on large synthetic campaigns.

For each N of --inputs, a campaign of N executions is built once, as a fault-tolerant
campaign leaves it: N + PENDING (100) corpus inputs, corpus/<sha256> and queue/ entries as
hard links to them (each input a child of an earlier one, `src:` naming it), and a done
journal in which each of the first N inputs went through a dispatch record, a commit record
(its manifest: the children it published) and a done record (the same children under
"published"), in that order, written with the journal's own encode_line; the last PENDING
inputs wait. No record is compacted away: the journal of a campaign that died just before
its compaction was due, the most a resume after a crash can have to read.

Each case resumes its own copy (`cp -a`, hard links kept) with the no-op executor, the page
cache dropped first when we may (root), since a resumed campaign usually starts cold, and
reads `startup_seconds` (command -> first dispatch) from stats.json:
- after a clean close: `explore --resume` is run once first with a budget already spent
  when its master's loop begins (PREPARE_BUDGET: it stops in its first round, so the
  pending inputs still wait, where a budget of 1 s would let a small campaign analyse them
  all), whose clean close leaves state/resume.snapshot; then the measured --resume starts
  from it;
- after a crash, after the run's last snapshot: as above, then a process resumes the
  campaign as a master does (it takes that snapshot, restores it, takes its own), analyses
  TAIL_EXECUTIONS inputs the way a master commits them (each publishes a child: corpus/,
  queue/, its publish log, a done record; group commits every 100) and is SIGKILLed: what a
  master leaves when it dies just before its next snapshot was due (snapshots come every
  30 s at least, checkpoint.py; TAIL_EXECUTIONS is ~50 s of the no-op's 502 tasks/s);
- after a crash, no snapshot: the journal and the directories are all there is (the slow
  path: a master that died before its first snapshot, or a resume on another boot than the
  one that wrote the records after it).
Goal: a 1,000,000-execution campaign starts dispatching within 5 s after a clean close and
after a crash that follows a snapshot (the slow path shown beside them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _campaign import keep_stdout, print_table, run_campaign

from symcc_mpi.campaign import snapshot
from symcc_mpi.campaign.afl_names import afl_queue_name
from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.durable.lines import encode_line

TARGET_SECONDS = 5.0
GOAL_INPUTS = 1_000_000
PENDING = 100  # inputs with no done record: the resumed campaign has work to dispatch
PREPARE_BUDGET = 0.001  # seconds: spent by the time the preparing run's master loop starts
# The budget counts from the master's start, before it reads the journal: a measured run's
# must outlast that (145 s after a crash at a million), and it ends sooner anyway, once the
# pending inputs are analysed ("frontier exhausted").
MEASURED_BUDGET = 900.0
TAIL_EXECUTIONS = 25_000
CLEAN, AFTER_SNAPSHOT, NO_SNAPSHOT = ("after a clean close",
                                      "after a crash, after its last snapshot",
                                      "after a crash, no snapshot")
CASES = (CLEAN, AFTER_SNAPSHOT, NO_SNAPSHOT)


def synthetic_input(i: int) -> tuple[bytes, str]:
    data = f"synthetic input {i}\n".encode() + os.urandom(16)
    return data, hashlib.sha256(data).hexdigest()


def build_campaign(out: Path, executions: int) -> None:
    """What a fault-tolerant campaign of `executions` executions leaves on disk, written
    directly, with PENDING inputs left to analyse.

    Input i > 0 is a child of input (i - 1) // 2, so each analysed input published about one
    child, its children already in corpus/ when its commit is written."""
    campaign = CampaignDir(out)
    campaign.create({"synthetic": True})
    digests = []
    for i in range(executions + PENDING):
        data, digest = synthetic_input(i)
        (campaign.corpus / digest).write_bytes(data)
        name = (afl_queue_name(i, orig="seed") if i == 0
                else afl_queue_name(i, ((i - 1) // 2,)))
        os.link(campaign.corpus / digest, campaign.queue / name)
        digests.append((digest, len(data)))
    with open(campaign.done_journal, "wb") as journal:
        for i in range(executions):
            journal.write(b"".join(encode_line(record)
                                   for record in analysed(i, digests)))


def analysed(i: int, digests: list[tuple[str, int]]) -> list[dict]:
    """The dispatch, commit and done records of input i (roles/sending.py `WorkSender.send`,
    roles/results.py `ResultJudge`; corpus.py `record_work`, `record_done`)."""
    digest, token, rank = digests[i][0], os.urandom(16).hex(), 1 + i % 2
    children = digests[2 * i + 1:2 * i + 3]
    work = {"digest": digest, "token": token, "generation": 0, "rank": rank}
    return [
        {"kind": "dispatch", **work},
        {"kind": "commit", **work, "outcome": "ok", "exit_status": 0,
         "publish": [[child, size, "ok"] for child, size in children]},
        {"digest": digest, "token": token, "outcome": "ok", "time": round(time.time(), 3),
         **({"published": [child for child, _ in children]} if children else {})},
    ]


def drop_page_cache() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def resume(out: Path, wall_timeout: float) -> dict:
    return run_campaign(out, "--resume", "--executor", "noop", "--target", "/bin/true",
                        "--workers", "2", "--wall-timeout", f"{wall_timeout:g}")


def die_after_a_snapshot(out: Path, executions: int) -> None:
    """The master of a run resumed from OUT's snapshot, as it is when it dies: it took its
    own snapshot, then analysed `executions` inputs (each publishing one new child) and was
    SIGKILLed before its last group commit. Run in a process of its own, which it kills."""
    campaign = CampaignDir(out)
    campaign.lock()
    saved = snapshot.take(campaign)
    campaign.restore(saved)
    campaign.open_journal(after=saved)
    campaign.save_snapshot(in_flight=[])
    waiting = list(campaign.inputs.pending)
    for i in range(executions):
        parent = waiting[i]
        data, child = synthetic_input(GOAL_INPUTS * 2 + i)
        campaign.promote(child, data)
        campaign.add_to_queue(child, parent)
        campaign.inputs.add(child)
        waiting.append(child)
        campaign.record_done(parent, os.urandom(16).hex(), "ok", published=[child])
        if i % 100 == 99:
            campaign.sync_done()
    os.kill(os.getpid(), signal.SIGKILL)


def measure(built: Path, out: Path, case: str) -> dict:
    """One resume of a copy of `built` in `out` (removed afterwards)."""
    subprocess.run(["cp", "-a", str(built), str(out)], check=True)
    try:
        snapshot_seconds = None
        if case in (CLEAN, AFTER_SNAPSHOT):
            resume(out, PREPARE_BUDGET)
        if case == AFTER_SNAPSHOT:
            started = time.monotonic()
            died = subprocess.run([sys.executable, __file__, "--die-after-a-snapshot", str(out),
                                   str(TAIL_EXECUTIONS)], check=False)
            assert died.returncode == -signal.SIGKILL, died
            snapshot_seconds = time.monotonic() - started
        path = out / "state" / snapshot.SNAPSHOT_FILE
        snapshot_bytes = path.stat().st_size if path.exists() else 0
        cold = drop_page_cache()
        stats = resume(out, MEASURED_BUDGET)
    finally:
        shutil.rmtree(out)
    return {"snapshot_bytes": snapshot_bytes, "cold_cache": cold,
            "startup_seconds": stats["extra"]["startup_seconds"],
            "command_seconds": stats["command_seconds"], "executions": stats["executions"],
            "dying_run_seconds": snapshot_seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, nargs="+", default=[10_000, GOAL_INPUTS],
                        metavar="N", help="executions (done inputs) of each campaign "
                        f"measured, each with {PENDING} more waiting (default 10000 1000000)")
    parser.add_argument("--die-after-a-snapshot", nargs=2, metavar=("OUT", "EXECUTIONS"),
                        help=argparse.SUPPRESS)  # the dying master (die_after_a_snapshot)
    args = parser.parse_args()
    if args.die_after_a_snapshot:
        out, executions = args.die_after_a_snapshot
        die_after_a_snapshot(Path(out), int(executions))
    if min(args.inputs) < 1:
        parser.error("--inputs must be positive")
    with keep_stdout("resume_startup"):
        rows = []
        with tempfile.TemporaryDirectory(prefix="symcc-mpi-resume-") as scratch:
            for inputs in args.inputs:
                built = Path(scratch, f"campaign-{inputs}")
                started = time.monotonic()
                build_campaign(built, inputs)
                build_seconds = time.monotonic() - started
                journal_bytes = (built / "state" / "done.jsonl").stat().st_size
                for case in CASES:
                    print(f"[{inputs:,} executions] resume {case} ...", flush=True)
                    rows.append({"done": inputs, "pending": PENDING, "case": case,
                                 **measure(built, Path(scratch, "resumed"), case),
                                 "journal_bytes": journal_bytes,
                                 "build_seconds": build_seconds})
                shutil.rmtree(built)
        print_table(list(rows[0]), [list(r.values()) for r in rows])
        goal = report_goal(rows)
        print(json.dumps({"benchmark": "resume_startup", "target_seconds": TARGET_SECONDS,
                          "goal_inputs": GOAL_INPUTS, "goal_met": goal, "results": rows}))


def report_goal(rows: list[dict]) -> bool | None:
    """Print the goal line for the largest campaign measured; whether the goal is met (None:
    not judged, no campaign of GOAL_INPUTS executions was measured)."""
    largest = max(row["done"] for row in rows)
    by_case = {row["case"]: row["startup_seconds"] for row in rows if row["done"] == largest}
    judged = (by_case[CLEAN], by_case[AFTER_SNAPSHOT])
    if largest != GOAL_INPUTS:
        met, verdict = None, f"not judged (measured at {largest:,} executions only)"
    else:
        met = all(seconds is not None and seconds <= TARGET_SECONDS for seconds in judged)
        verdict = "met" if met else "MISSED"
    print(f"goal: a {GOAL_INPUTS:,}-execution campaign starts dispatching within "
          f"{TARGET_SECONDS:g} s {CLEAN} ({_seconds(judged[0])}) and {AFTER_SNAPSHOT} "
          f"({_seconds(judged[1])}): {verdict}; {NO_SNAPSHOT} {_seconds(by_case[NO_SNAPSHOT])}")
    return met


def _seconds(value: float | None) -> str:
    return "no dispatch" if value is None else f"{value:.2f} s"


if __name__ == "__main__":
    main()
