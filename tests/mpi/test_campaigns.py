"""Whole campaigns under real mpiexec find each example's planted bug, exactly once each input."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from harness import (
    ROOT,
    assert_oracles,
    crash_files,
    crashes_natively,
    done_digests,
    explore,
    rank_pid,
    start_explore,
    stats,
)

# A campaign must exhaust its frontier; on a loaded machine that takes several times what it
# takes on a quiet one, so the limit is far from both. No --wall-timeout: with a budget a
# triaging campaign goes on past its frontier (tiers/), until the budget.
CAMPAIGN_LIMIT = 600
pytestmark = [pytest.mark.mpi, pytest.mark.timeout(1200)]

EXAMPLES = ["magic", "checksum", "tlv"]


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("example", EXAMPLES)
def test_triton_campaign_with_afl_triage_finds_the_planted_bug(build, tmp_path, example,
                                                               workers):
    out = tmp_path / "out"
    process = explore(out, "--target", f"{build / example} @@", "--afl-target",
                      f"{build / example}.afl @@", "--seeds", build.parent / "seeds" / example,
                      "--workers", workers, "--timeout", 20, timeout=CAMPAIGN_LIMIT)
    assert_oracles(out, process)
    crashes = crash_files(out)
    assert crashes, f"no crash found for {example}: {process.stdout[-2000:]}"
    assert all(crashes_natively(build / example, p.read_bytes(), tmp_path) for p in crashes)
    figures = stats(out)
    assert figures["extra"]["stop_reason"] == "frontier exhausted"
    assert figures["executions"] == len(done_digests(out))
    dispatch = figures["extra"]["dispatch"]
    for counter in ("stale_results", "watchdog_timeouts", "worker_recoveries",
                    "protocol_requeued", "protocol_deferred", "send_failures"):
        assert dispatch[counter] == 0, (counter, dispatch)
    assert sum(w["executions"] for w in figures["per_worker"].values()) == figures["executions"]
    assert figures["edges_found"] > 0
    assert figures["extra"]["doorbell_workers"] == workers  # one host: every worker rings
    # Triage keeps an input only for new coverage: the kept ones are a subset of the new ones.
    assert figures["interesting"] <= figures["unique"]
    fuzzer_stats = (out / "fuzzer_stats").read_text()
    assert f"execs_done        : {figures['executions']}" in fuzzer_stats
    assert (out / "plot_data").read_text().startswith("# relative_time")
    if workers == 3:
        busy = [w for w in figures["per_worker"].values() if w["executions"] > 0]
        assert len(busy) >= 2, "work was not spread over the workers"


def test_results_over_mpi_leave_nothing_to_the_workers_in_out(build, tmp_path):
    # --results-via mpi: the workers write nothing into OUT, their packs reach the master in
    # PACK pieces and are committed as staged ones are (the workers here could see OUT).
    out = tmp_path / "out"
    process = explore(out, "--target", f"{build / 'tlv'} @@", "--afl-target",
                      f"{build / 'tlv'}.afl @@", "--seeds", build.parent / "seeds" / "tlv",
                      "--workers", 2, "--timeout", 20, "--results-via", "mpi",
                      timeout=CAMPAIGN_LIMIT)
    assert_oracles(out, process)
    assert crash_files(out), process.stdout[-2000:]
    extra = stats(out)["extra"]
    assert extra["stop_reason"] == "frontier exhausted"
    uploads = extra["packs_over_mpi"]
    assert uploads["packs"] > 0 and uploads["bytes"] > 0, uploads
    assert uploads["refused"] == uploads["stale_pieces"] == 0, uploads
    assert extra["invalid_results"] == {} and extra["staging_rejected"] == 0
    assert process.stdout.count("sends its results over MPI (--results-via mpi)") == 2
    assert list((out / ".staging").iterdir()) == []


@pytest.mark.parametrize("example", ["magic", "checksum"])
def test_without_triage_every_new_input_is_explored(build, tmp_path, example):
    out = tmp_path / "out"
    process = explore(out, "--target", f"{build / example} @@", "--seeds",
                      build.parent / "seeds" / example, "--workers", 3, "--timeout", 20,
                      timeout=CAMPAIGN_LIMIT)
    assert_oracles(out, process)
    assert crash_files(out)
    figures = stats(out)
    assert figures["extra"]["stop_reason"] == "frontier exhausted"
    assert figures["interesting"] == figures["unique"]  # no oracle: new content is kept
    assert figures["executions"] == len(done_digests(out)) == figures["corpus_count"]


def test_runs_under_the_users_own_mpiexec(build, tmp_path):
    out = tmp_path / "out"
    mpiexec = [os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-n", "3",
               "--oversubscribe"]
    if os.geteuid() == 0:
        mpiexec.append("--allow-run-as-root")
    process = subprocess.run(
        [*mpiexec, sys.executable, "-m", "symcc_mpi", "explore", "--target",
         f"{build / 'magic'} @@", "--seeds", str(build.parent / "seeds" / "magic"), "--out",
         str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert_oracles(out, process)
    assert crash_files(out)
    assert len(stats(out)["per_worker"]) == 2  # the job size decides, not --workers
    assert "execs" in process.stderr  # rank 0's progress lines stand in for the live view


def checksum_seeds(build, tmp_path, extra: int = 20):
    """The example's seed and `extra` more valid frames: enough work that a campaign stopped
    (or killed) after its third input cannot have finished first, however fast it runs."""
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    (seeds / "ping").write_bytes((build.parent / "seeds" / "checksum" / "ping").read_bytes())
    for i in range(extra):
        payload = b"p%03d" % i
        frame = b"CK" + len(payload).to_bytes(2, "little") + payload + bytes([sum(payload) & 0xFF])
        (seeds / f"frame{i:02d}").write_bytes(frame)
    return seeds


def test_interrupt_then_resume_loses_and_repeats_nothing(build, tmp_path):
    out = tmp_path / "out"
    args = ["--target", f"{build / 'checksum'} @@", "--seeds", checksum_seeds(build, tmp_path),
            "--workers", 2, "--timeout", 20]
    launcher = start_explore(out, *args, analysed=3)
    launcher.send_signal(signal.SIGINT)
    output, _ = launcher.communicate(timeout=120)
    assert launcher.returncode == 0, output
    first = stats(out)
    assert first["extra"]["stop_reason"] == "stop requested"
    assert first["pending"] > 0, "the campaign ended before it could be interrupted"
    assert not any((out / ".staging").iterdir())
    analysed_before = set(done_digests(out))
    corpus_before = {p.name for p in (out / "corpus").iterdir()}

    process = explore(out, *args, "--resume")
    assert_oracles(out, process)
    done = done_digests(out)
    assert set(done) >= analysed_before
    assert len(done) == len(set(done)), "resume analysed an input again"
    assert corpus_before <= {p.name for p in (out / "corpus").iterdir()}, "resume lost inputs"
    assert stats(out)["extra"]["stop_reason"] == "frontier exhausted"
    assert stats(out)["executions"] == len(done) - len(analysed_before)


def test_symcc_backend_with_a_real_concolic_engine_behind_it(build, tmp_path):
    """The SymCC subprocess contract, honoured by the Triton shim as a SymCC binary would."""
    out = tmp_path / "out"
    shim = f"{sys.executable} {Path(__file__).resolve().parents[1] / 'triton_shim.py'}"
    for target in (f"{shim} {build / 'magic'} @@", f"{shim} {build / 'magic'}"):
        out = tmp_path / ("file" if "@@" in target else "stdin")
        # Each shim run imports tritondse afresh (~2 s): triage keeps the campaign short.
        process = explore(out, "--executor", "symcc", "--target", target, "--afl-target",
                          f"{build / 'magic.afl'} @@", "--seeds",
                          build.parent / "seeds" / "magic", "--workers", 2, "--timeout", 60)
        assert_oracles(out, process)
        assert crash_files(out), process.stdout[-2000:]
        assert stats(out)["solver_time"] > 0


# The budget must outlast the worker's start-up on a busy machine (a campaign that spent it
# before its first execution has nothing to show), and the 30 seeds, a second each at
# least, must outlast the budget.
BUDGET_SECONDS = 8


@pytest.mark.parametrize("option, reason",
                         [("--max-idle", f"no new finding for {BUDGET_SECONDS} s"),
                          ("--wall-timeout", "wall-clock budget spent")])
def test_budgets_stop_the_campaign_and_keep_the_rest_for_resume(tmp_path, option, reason):
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    for i in range(30):
        (seeds / f"s{i}").write_bytes(b"%d" % i)
    slow = tmp_path / "slow-target"
    slow.write_text("#!/bin/sh\nsleep 1\n")  # finds nothing, takes its time
    slow.chmod(0o755)
    out = tmp_path / "out"
    process = explore(out, "--executor", "symcc", "--target", slow, "--seeds", seeds,
                      "--workers", 1, option, BUDGET_SECONDS)
    assert_oracles(out, process)
    figures = stats(out)
    assert figures["extra"]["stop_reason"] == reason
    assert 0 < figures["executions"] < 30 and figures["pending"] > 0


def test_without_fault_tolerance_a_killed_rank_ends_the_job_and_resume_loses_nothing(
        build, tmp_path):
    out = tmp_path / "out"
    args = ["--target", f"{build / 'checksum'} @@", "--seeds", checksum_seeds(build, tmp_path),
            "--workers", 2, "--timeout", 20, "--fault-tolerance", "off"]
    launcher = start_explore(out, *args, analysed=3)
    os.kill(rank_pid(out, 2), signal.SIGKILL)
    output, _ = launcher.communicate(timeout=120)
    assert launcher.returncode != 0
    assert "continue with --resume" in output
    analysed_before = set(done_digests(out))

    process = explore(out, *args, "--resume")
    assert_oracles(out, process)
    done = done_digests(out)
    assert set(done) >= analysed_before and len(done) == len(set(done))
    assert stats(out)["extra"]["stop_reason"] == "frontier exhausted"


def test_with_fault_tolerance_a_killed_worker_is_recovered_from_in_the_same_job(
        build, tmp_path):
    # The same SIGKILL from outside, the default mode: the job goes on without rank 2.
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    scratch.mkdir()
    launcher = start_explore(out, "--target", f"{build / 'checksum'} @@", "--seeds",
                             checksum_seeds(build, tmp_path), "--workers", 2, "--timeout", 20,
                             "--scratch", scratch, analysed=3)
    os.kill(rank_pid(out, 2), signal.SIGKILL)
    output, _ = launcher.communicate(timeout=600)
    assert launcher.returncode == 0, output
    assert os.listdir(scratch) == [], "the killed worker's scratch outlived the job"
    assert_oracles(out, subprocess.CompletedProcess([], 0, output, ""))
    figures = stats(out)
    assert figures["extra"]["stop_reason"] == "frontier exhausted"
    (failure,) = figures["extra"]["failures"]
    assert failure["failed"][0].startswith("rank 2 (pid ")


def test_a_job_killed_whole_resumes_from_its_last_snapshot_losing_and_repeating_nothing(
        build, tmp_path):
    """Every rank SIGKILLed (a scheduler's kill, a lost node): the resume starts from the
    snapshot the master took in its run (snapshot.py), replays the journal after it, finds
    what was published after it in its publish log, and takes back the work in flight."""
    out = tmp_path / "out"
    args = ["--target", f"{build / 'checksum'} @@", "--seeds", checksum_seeds(build, tmp_path),
            "--workers", 2, "--timeout", 20, "--fault-tolerance", "on"]
    launcher = start_explore(out, *args, analysed=3)
    assert (out / "state" / "resume.snapshot").is_file()
    for rank in (1, 2, 0):  # the master last: no worker lives to take over from it
        os.kill(rank_pid(out, rank), signal.SIGKILL)
    launcher.communicate(timeout=120)
    analysed_before = set(done_digests(out))
    corpus_before = {p.name for p in (out / "corpus").iterdir()}

    process = explore(out, *args, "--resume")
    assert_oracles(out, process)
    assert "the last run's snapshot is followed by" in process.stdout + process.stderr, \
        "\n".join(line for line in process.stdout.splitlines() if "rank 0" in line)
    done = done_digests(out)
    assert set(done) >= analysed_before and len(done) == len(set(done))
    corpus = {p.name for p in (out / "corpus").iterdir()}
    assert corpus_before <= corpus, "resume lost a published input"
    assert set(done) == corpus, "an input was never analysed"
    queued = [os.stat(p).st_ino for p in (out / "queue").iterdir()]
    assert len(queued) == len(set(queued)) == len(corpus), "queue/ lost or doubled an input"


def test_a_resume_from_the_snapshot_analyses_the_seeds_new_to_it(tmp_path):
    """A clean close leaves state/resume.snapshot, whose table knows every input of that run:
    seeds added by the resume are not in it and must still join the frontier."""
    seeds, more = tmp_path / "seeds", tmp_path / "more"
    seeds.mkdir()
    more.mkdir()
    for i in range(3):
        (seeds / f"s{i}").write_bytes(b"first %d" % i)
    (more / "new").write_bytes(b"new with the resume")
    out = tmp_path / "out"
    common = ("--executor", "noop", "--target", "/bin/true", "--workers", 1)
    assert_oracles(out, explore(out, *common, "--seeds", seeds))
    assert (out / "state" / "resume.snapshot").is_file()
    resumed = explore(out, *common, "--resume", "--seeds", more)
    assert_oracles(out, resumed)
    assert "from the last run's snapshot" in resumed.stdout + resumed.stderr
    new = hashlib.sha256(b"new with the resume").hexdigest()
    assert done_digests(out).count(new) == 1 and stats(out)["pending"] == 0
