"""Ranks that die in real campaigns under ULFM (issue 10, F443 §7): each campaign goes on with
the survivors and ends complete, every oracle of `verify` holding, with a receipt for each
recovery and nothing re-executed but what was in flight at a failure. Faults are injected by
configuration (`RANK:die@N`, RANK in MPI_COMM_WORLD): a rank SIGKILLs itself at a chosen step,
so each scenario happens whatever the speed of the machine."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest
from harness import ROOT, assert_oracles, crash_files, explore, stats, verify

from symcc_mpi.campaign.corpus import CampaignDir

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(900)]


def campaign(build, out, workers: int, faults: str, *extra, **env):
    environment = dict(os.environ, SYMCC_MPI_FAULTS=faults, **env)
    return explore(out, "--target", f"{build / 'magic'} @@", "--seeds",
                   build.parent / "seeds" / "magic", "--workers", workers, "--timeout", 20,
                   *extra, env=environment)


def facts(out) -> dict[str, str]:
    checked = verify(out)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    return dict(line.strip().split(": ", 1) for line in checked.stdout.splitlines()
                if ": " in line)


def survived(build, out, workers: int, faults: str, *extra, failures: int,
             new_masters: int = 0, work_after: bool = True):
    """Run a campaign with `faults` (and the options `extra`); check it completed with every
    oracle, and return its stats' failures."""
    process = campaign(build, out, workers, faults, *extra)
    assert_oracles(out, process)  # exit status 0 though ranks died; verify OK
    figures = stats(out)
    extra = figures["extra"]
    assert extra["stop_reason"] == "frontier exhausted", extra["stop_reason"]
    assert crash_files(out), "the planted bug was not found"
    recorded = extra["failures"]
    assert len(recorded) == failures, recorded
    assert sum(f["master"] == "new" for f in recorded) == new_masters, recorded
    found = facts(out)
    assert found["out at the end"] == "0"
    assert int(found["recoveries (receipts)"]) == failures
    assert int(found["dispatched again (declared)"]) <= int(found["in flight at failures"]) \
        + extra["dispatch"]["protocol_requeued"]
    for failure in recorded if work_after else ():
        assert failure["first_dispatch"] is not None, failure  # the campaign went on
    summary = process.stdout
    assert summary.count("failure → generation") == failures, summary
    return recorded


def test_a_dead_worker_is_recovered_from_and_the_campaign_goes_on(build, tmp_path):
    # F443 §7, first scenario: 1 master + 2 workers, rank 1 dies.
    (failure,) = survived(build, tmp_path / "out", 2, "1:die@3", failures=1)
    assert failure["master"] == "kept" and failure["generation"] == 1
    assert failure["failed"][0].startswith("rank 1 (pid ")
    assert failure["failed"][0].endswith(" of generation 0"), failure
    assert failure["requeued"] >= 1  # its own input at least


def test_a_dead_master_is_replaced_by_a_worker_that_continues_the_campaign(build, tmp_path):
    # F443 §7, second scenario: 1 master + 3 workers, rank 0 dies.
    out = tmp_path / "out"
    (failure,) = survived(build, out, 3, "0:die@8", failures=1, new_masters=1)
    assert failure["failed"][0].startswith("rank 0 (pid ")
    # Same campaign: one run in the generation log, the wall-clock start carried on.
    assert facts(out)["generations"] == "2 over 1 runs"


def test_two_workers_dying_one_after_the_other(build, tmp_path):
    first, second = survived(build, tmp_path / "out", 3, "1:die@3,2:die@6", failures=2)
    assert (first["generation"], second["generation"]) == (1, 2)


def test_the_master_then_a_worker(build, tmp_path):
    # World rank 1 takes over from rank 0; world rank 3 dies later under the new master.
    first, second = survived(build, tmp_path / "out", 3, "0:die@6,3:die@10", failures=2,
                             new_masters=1)
    assert first["master"] == "new" and second["master"] == "kept"


def test_a_worker_then_the_master(build, tmp_path):
    # The master that survived rank 1's death dies later; world rank 2 takes over. Its death
    # is counted from that recovery: counted from the start, it came first once on a loaded
    # machine (rank 1 was slow to reach its third execution), and rank 1 died as the master.
    first, second = survived(build, tmp_path / "out", 3, "1:die@3,0:die@4=after-recovery",
                             failures=2, new_masters=1)
    assert first["master"] == "kept" and second["master"] == "new"
    assert second["failed"][0].startswith("rank 0 (pid ")


def test_a_rank_dying_during_the_recovery_itself(build, tmp_path):
    # Rank 2 dies inside the recovery from rank 1's death, after the durable prepare: the
    # survivors shrink again under the same plan, or the shrink already left it out.
    (failure,) = survived(build, tmp_path / "out", 3, "1:die@3,2:die@1=recovery", failures=1)
    assert len(failure["failed"]) == 2, failure
    log = (tmp_path / "out" / "state" / "generations.jsonl").read_text()
    assert log.count('"kind":"prepare"') == 1 and log.count('"kind":"commit"') == 1


@pytest.mark.parametrize("point", ["after-manifest", "after-publish"])
def test_a_master_dying_inside_a_commit_has_it_finished_by_the_next(build, tmp_path, point):
    out = tmp_path / "out"
    survived(build, out, 2, f"0:die@3={point}", failures=1, new_masters=1)
    # The commit it died in is redone from its manifest, not its input analysed again; so are
    # the commits before it whose done records were still waiting for the group commit.
    assert stats(out)["extra"]["redone_commits"] >= 1
    journal = CampaignDir(out).inspect_journal()[0]
    committed_by_the_dead = {r["digest"] for r in journal
                             if r.get("kind") == "commit" and r["generation"] == 0}
    dispatched = Counter(r["digest"] for r in journal if r.get("kind") == "dispatch")
    assert committed_by_the_dead
    assert all(dispatched[digest] == 1 for digest in committed_by_the_dead)


def test_with_results_over_mpi_a_dead_worker_and_a_master_dying_in_a_commit(build, tmp_path):
    # Packs that came over MPI are in OUT/.staging before their commit begins: a master that
    # dies inside one leaves its successor what a worker's staged pack would have.
    out = tmp_path / "worker"
    survived(build, out, 2, "1:die@3", "--results-via", "mpi", failures=1)
    assert stats(out)["extra"]["packs_over_mpi"]["packs"] > 0
    out = tmp_path / "master"
    survived(build, out, 2, "0:die@3=after-manifest", "--results-via", "mpi", failures=1,
             new_masters=1)
    assert stats(out)["extra"]["redone_commits"] >= 1


def test_a_master_dying_as_it_closes_the_campaign_is_replaced_by_a_worker_that_closes_it(
        build, tmp_path):
    # The workers acknowledged STOP but stay until RELEASE: the master died before the last
    # group commit, so one of them takes over, finishes its commits and ends the campaign.
    out = tmp_path / "out"
    (failure,) = survived(build, out, 2, "0:die@1=closing", failures=1, new_masters=1,
                          work_after=False)  # nothing was left to dispatch
    assert failure["requeued"] == 0


def test_when_every_worker_is_dead_the_campaign_stops_and_resume_continues(build, tmp_path):
    out = tmp_path / "out"
    process = campaign(build, out, 2, "1:die@2,2:die@2")
    output = process.stdout + process.stderr
    assert process.returncode != 0, output
    assert "no usable worker: every worker rank died" in output
    assert "continue with --resume" in output
    assert "Traceback" not in output
    checked = verify(out)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    resumed = campaign(build, out, 2, "", "--resume")
    assert_oracles(out, resumed)
    assert stats(out)["extra"]["stop_reason"] == "frontier exhausted"
    assert crash_files(out)
    assert facts(out)["out at the end"] == "0"


def under_mpiexec(out, *mpiexec_options, fault_tolerance=None, build):
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    command = [mpiexec, "-n", "3", "--oversubscribe", "--allow-run-as-root",
               *mpiexec_options, sys.executable, "-m", "symcc_mpi", "explore",
               "--target", f"{build / 'magic'} @@", "--seeds",
               str(build.parent / "seeds" / "magic"), "--out", str(out), "--no-live"]
    if fault_tolerance:
        command += ["--fault-tolerance", fault_tolerance]
    environment = {k: v for k, v in os.environ.items() if k != "SYMCC_MPI_FAULTS"}
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=environment)


def test_fault_tolerance_on_without_ulfm_refuses_to_start_in_one_line(build, tmp_path):
    process = under_mpiexec(tmp_path / "out", fault_tolerance="on", build=build)
    output = process.stdout + process.stderr
    assert process.returncode != 0, output
    lines = [line for line in output.splitlines() if line.startswith("symcc-mpi: error:")]
    assert lines == ["symcc-mpi: error: --fault-tolerance on, but rank 0: mpiexec was not "
                     "started with --with-ft ulfm"], output
    assert "Traceback" not in output


def test_under_the_users_mpiexec_the_log_says_which_mode_and_why(build, tmp_path):
    plain = under_mpiexec(tmp_path / "plain", build=build)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "fault tolerance off (auto): rank 0: mpiexec was not started with --with-ft ulfm" \
        in plain.stdout + plain.stderr
    ulfm = under_mpiexec(tmp_path / "ulfm", "--with-ft", "ulfm", "--mca", "pml", "ob1",
                         "--mca", "btl", "tcp,self", build=build)
    assert ulfm.returncode == 0, ulfm.stdout + ulfm.stderr
    assert "fault tolerance on (auto)" in ulfm.stdout + ulfm.stderr
