"""Campaigns under a real one-node Slurm (issue 15): the job script `symcc-mpi slurm-script`
writes, submitted with sbatch; mpirun inside an salloc allocation; srun --mpi=pmix; and a job
ended the way preemption ends it, continued by the next job."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import ROOT, crash_files, done_digests, stats, verify
from slurm_cluster import SlurmCluster, Unavailable
from test_campaigns import checksum_seeds

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

JOB_SECONDS = 600  # a job's whole life on a busy machine; it ends on its own well before


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except Unavailable as reason:
        cluster.stop()
        pytest.skip(str(reason))
    yield cluster
    cluster.stop()


def magic(build: Path, out: Path) -> list[str]:
    return ["--target", f"{build / 'magic'} @@", "--seeds", str(build.parent / "seeds" / "magic"),
            "--out", str(out), "--timeout", "20"]


def job_script(tmp_path: Path, explore: list[str], *options: str) -> Path:
    script = tmp_path / "campaign.sbatch"
    written = subprocess.run(
        [sys.executable, "-m", "symcc_mpi", "slurm-script", "--workers", "2", "--output",
         str(tmp_path / "job-%j.out"), "-o", str(script), *options, "--", *explore],
        capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert written.returncode == 0, written.stderr
    return script


def assert_campaign_ok(out: Path, output: str) -> None:
    checked = verify(out)
    assert checked.returncode == 0 and checked.stdout.endswith("OK\n"), \
        checked.stdout + checked.stderr + output[-3000:]
    assert crash_files(out), f"the planted bug was not found:\n{output[-3000:]}"
    done = done_digests(out)
    assert len(done) == len(set(done)), "an input was analysed twice"


def test_sbatch_runs_the_campaign_of_the_written_job_script(slurm, build, tmp_path):
    out = tmp_path / "out"
    job = slurm.sbatch(job_script(tmp_path, magic(build, out)), cwd=ROOT)
    record = slurm.wait(job, JOB_SECONDS)
    output = (tmp_path / f"job-{job}.out").read_text()
    assert (record["JobState"], record["ExitCode"]) == ("COMPLETED", "0:0"), output[-3000:]
    assert "stopped because" in output and "frontier exhausted" in output  # the summary
    assert "the campaign exited with status 0" in output
    assert_campaign_ok(out, output)
    assert len(stats(out)["per_worker"]) == 2  # --ntasks=3: the master and two workers


def test_mpirun_inside_an_salloc_allocation(slurm, build, tmp_path):
    out = tmp_path / "out"
    mpirun = Path(sys.executable).parent / "mpirun"
    # --bind-to none: the test's node offers 4 slots on a machine that may have 2 cores.
    ran = slurm.run("salloc", "--ntasks=3", str(mpirun), "--allow-run-as-root", "--bind-to",
                    "none", sys.executable, "-m", "symcc_mpi", "explore", *magic(build, out),
                    cwd=ROOT, check=False, timeout=JOB_SECONDS)
    output = ran.stdout + ran.stderr
    assert ran.returncode == 0, output[-3000:]
    assert "Granted job allocation" in ran.stderr
    assert_campaign_ok(out, output)
    assert len(stats(out)["per_worker"]) == 2  # mpirun filled the allocation's three slots


def test_srun_with_pmix_starts_the_ranks(slurm, build, tmp_path):
    if reason := slurm.pmix_missing():
        pytest.skip(reason)
    out = tmp_path / "out"
    ran = slurm.run("srun", "--ntasks=3", "--mpi=pmix", sys.executable, "-m", "symcc_mpi",
                    "explore", *magic(build, out), cwd=ROOT, check=False, timeout=JOB_SECONDS)
    output = ran.stdout + ran.stderr
    assert ran.returncode == 0, output[-3000:]
    assert_campaign_ok(out, output)
    assert len(stats(out)["per_worker"]) == 2


def test_a_preempted_job_is_continued_by_the_next_losing_and_repeating_nothing(
        slurm, build, tmp_path):
    out = tmp_path / "out"
    explore = ["--target", f"{build / 'checksum'} @@", "--seeds",
               str(checksum_seeds(build, tmp_path)), "--out", str(out), "--timeout", "20"]
    script = job_script(tmp_path, explore)
    first = slurm.sbatch(script, cwd=ROOT)
    deadline = time.monotonic() + JOB_SECONDS
    while time.monotonic() < deadline and not (
            (out / "state" / "done.jsonl").exists() and len(done_digests(out)) >= 3):
        time.sleep(0.2)
    # What preemption does (GraceTime = KillWait here): SIGCONT and SIGTERM to every process
    # of the job, SIGKILL after the grace.
    slurm.run("scancel", first)
    record = slurm.wait(first, JOB_SECONDS)
    output = (tmp_path / f"job-{first}.out").read_text()
    assert record["JobState"] == "CANCELLED", output[-3000:]
    assert "stopped because" in output and "interrupted" in output, output[-3000:]
    assert "the campaign exited with status" in output, output[-3000:]  # within the grace
    figures = stats(out)
    assert figures["extra"]["stop_reason"] == "interrupted"
    assert figures["pending"] > 0, "the campaign ended before it could be preempted"
    assert not any((out / ".staging").iterdir()), "a staging directory was left in OUT"
    assert not [p for p in crash_files(out) if "sig:15" in p.name], "SIGTERM taken for a crash"
    analysed_before = set(done_digests(out))
    corpus_before = {p.name for p in (out / "corpus").iterdir()}

    second = slurm.sbatch(script, cwd=ROOT)
    record = slurm.wait(second, JOB_SECONDS)
    output = (tmp_path / f"job-{second}.out").read_text()
    assert (record["JobState"], record["ExitCode"]) == ("COMPLETED", "0:0"), output[-3000:]
    assert "continuing the campaign" in output
    assert_campaign_ok(out, output)
    done = done_digests(out)
    assert set(done) >= analysed_before, "the second job lost what the first committed"
    assert corpus_before <= {p.name for p in (out / "corpus").iterdir()}
    assert stats(out)["extra"]["stop_reason"] == "frontier exhausted"
    assert stats(out)["executions"] == len(done) - len(analysed_before)
