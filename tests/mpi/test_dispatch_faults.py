"""Faults in the hand-off of work (F313, F315-F317), injected by configuration into real
campaigns; each must end complete, with every oracle holding and nothing left held."""

from __future__ import annotations

import hashlib
import os

import pytest
from harness import assert_oracles, crash_files, done_digests, explore, stats, verify

from symcc_mpi.wire.protocol import SHUTDOWN_GRACE

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(600)]

# A watchdog test races the deadline against two durations, and controls both (issue 9):
# - every ordinary execution must answer before the deadline, or it is timed out as if hung:
#   a magic execution takes well under a second on a quiet machine and a few seconds with
#   both cores busy, so the deadline is far above that;
# - the stopped rank's answer must come after the deadline: the `pause` fault holds it until
#   STOPPED_FOR seconds after its WORK arrived (later than the master sent it), whatever
#   the execution took. The master acknowledges a late rank only until SHUTDOWN_GRACE after
#   its STOP, which goes out no earlier than the deadline: the hold ends halfway between.
WATCHDOG_SECONDS = 20
STOPPED_FOR = WATCHDOG_SECONDS + SHUTDOWN_GRACE / 2
# Silent past the end of the campaign, however slowly the others run (the hold is cut short
# when the job ends: the stopped rank is killed, and its helper goes with it).
SILENT_FOR = 1800

QUIET = ("watchdog_timeouts", "worker_recoveries", "protocol_requeued", "protocol_deferred",
         "stale_results", "invalid_results", "send_failures")


def campaign(build, out, workers: int, faults: str, **env):
    environment = dict(os.environ, SYMCC_MPI_FAULTS=faults, **env)
    process = explore(out, "--target", f"{build / 'magic'} @@", "--seeds",
                      build.parent / "seeds" / "magic", "--workers", workers,
                      "--timeout", 20, env=environment)
    assert_oracles(out, process)
    figures = stats(out)
    assert figures["extra"]["stop_reason"] == "frontier exhausted"
    assert crash_files(out), "the planted bug was not found"
    return figures, figures["extra"]["dispatch"], process


def only(dispatch: dict, **expected) -> None:
    """The named counters have these values; every other fault counter stayed at zero."""
    seen = {name: dispatch[name] for name in QUIET + tuple(expected)}
    assert seen == {**dict.fromkeys(QUIET, 0), **expected}, seen


def test_a_failed_work_send_is_undone_exactly_and_the_input_sent_again(build, tmp_path):
    figures, dispatch, _ = campaign(build, tmp_path / "out", 2, "0:send-fail@3")
    only(dispatch, send_failures=1)
    assert dispatch["rolled_back_before_send"] == 1
    # The failed send is no dispatch: it neither counts nor makes its input "dispatched again".
    assert dispatch["dispatched"] == dispatch["committed"] == figures["executions"]
    assert dispatch["inputs_dispatched_again"] == 0
    assert dispatch["retired"] == []


@pytest.mark.parametrize("workers", [1, 2])
def test_a_stopped_worker_is_timed_out_parked_and_taken_back_by_its_exact_ready(
        build, tmp_path, workers):
    # Rank 1 answers its 2nd input only after the watchdog gave up on it.
    figures, dispatch, process = campaign(
        build, tmp_path / "out", workers, f"1:pause@2={STOPPED_FOR:g}",
        SYMCC_DISPATCH_WATCHDOG_SEC=str(WATCHDOG_SECONDS))
    only(dispatch, watchdog_timeouts=1, worker_recoveries=1, protocol_requeued=1,
         stale_results=1)  # its late RESULT
    assert dispatch["recoveries_by_source"] == {"watchdog-timeout": 1}
    assert dispatch["parked"] == []
    assert dispatch["inputs_dispatched_again"] == 1
    assert "source=watchdog-timeout" in process.stdout
    if workers == 1:
        # Nobody else could take the input: rank 1 analysed everything, after its recovery too.
        assert figures["per_worker"]["1"]["executions"] == figures["executions"] > 2


def test_a_malformed_result_joined_with_the_next_ready_is_requeued(build, tmp_path):
    figures, dispatch, process = campaign(build, tmp_path / "out", 2, "2:malformed-result@1")
    only(dispatch, protocol_requeued=1)
    assert dispatch["invalid_joins"] == 1
    assert dispatch["recoveries_by_source"] == {"invalid-result": 1}
    assert figures["extra"]["malformed_messages"] == 1
    assert "source=invalid-result" in process.stdout


@pytest.mark.parametrize("fault", ["stale-result@3", "foreign-result@2"])
def test_a_result_under_a_token_not_active_is_dropped_with_its_staging(build, tmp_path,
                                                                       fault):
    out = tmp_path / "out"
    figures, dispatch, _ = campaign(build, out, 2, f"1:{fault}")
    only(dispatch, stale_results=1)
    for path in (out / "corpus").iterdir():
        assert not path.read_bytes().startswith(b"unowned result")
    assert len(done_digests(out)) == figures["executions"]


def test_a_failed_first_transfer_of_an_object_is_shipped_again(build, tmp_path):
    # One worker: the retry goes to the rank that never received the object. Had the cache
    # believed the failed send, the retry would carry no content and the worker would answer
    # "neither sent nor held" (an invalid result).
    figures, dispatch, _ = campaign(build, tmp_path / "out", 1, "0:object-send-fail@2")
    only(dispatch, send_failures=1)
    assert dispatch["objects_shipped"] == dispatch["dispatched"] == figures["executions"]
    assert figures["extra"]["executor_errors"] == 0


@pytest.mark.parametrize("workers", [1, 2])
def test_a_send_that_delivered_but_reported_failure_is_never_committed_twice(
        build, tmp_path, workers):
    # F313 §4: the master undoes the dispatch as unsent and sends the input again under a new
    # token; the worker runs the first WORK anyway, and its RESULT for it must be refused.
    out = tmp_path / "out"
    figures, dispatch, _ = campaign(build, out, workers, "0:send-ambiguous@3")
    only(dispatch, send_failures=1, stale_results=1)
    assert dispatch["rolled_back_before_send"] == 1
    assert len(done_digests(out)) == figures["executions"] == dispatch["committed"]


def test_an_input_that_keeps_failing_is_deferred_then_retried_on_resume(build, tmp_path):
    out = tmp_path / "out"
    seeds = build.parent / "seeds" / "magic"  # one seed: the input that fails twice
    args = ["--target", f"{build / 'magic'} @@", "--seeds", seeds, "--workers", 1,
            "--timeout", 20]
    faults = dict(os.environ, SYMCC_MPI_FAULTS="1:malformed-result@1,1:malformed-result@2")
    process = explore(out, *args, env=faults)
    assert_oracles(out, process)
    dispatch = stats(out)["extra"]["dispatch"]
    only(dispatch, protocol_requeued=1, protocol_deferred=1)
    assert dispatch["invalid_joins"] == 2
    assert stats(out)["extra"]["stop_reason"] == "frontier exhausted"
    assert "1 deferred" in process.stdout
    seed = hashlib.sha256(next(seeds.iterdir()).read_bytes()).hexdigest()
    journal = (out / "state" / ".dispatch_protocol_deferred.jsonl").read_text()
    assert seed in journal and "invalid-result" in journal
    assert "deferred: 1" in verify(out).stdout

    process = explore(out, *args, "--resume")
    assert_oracles(out, process)
    assert seed in done_digests(out)
    assert stats(out)["extra"]["stop_reason"] == "frontier exhausted"
    assert crash_files(out)


def test_a_rank_that_never_answers_stays_parked_and_the_job_ends_without_losing_work(
        build, tmp_path):
    # F317 W10: rank 1 stays silent past the end of the campaign. Rank 2 does all the work;
    # the master cannot finish MPI with a silent rank, so it ends the job, and nothing is lost.
    out = tmp_path / "out"
    env = dict(os.environ, SYMCC_MPI_FAULTS=f"1:pause@2={SILENT_FOR}",
               SYMCC_DISPATCH_WATCHDOG_SEC=str(WATCHDOG_SECONDS))
    process = explore(out, "--target", f"{build / 'magic'} @@", "--seeds",
                      build.parent / "seeds" / "magic", "--workers", 2, "--timeout", 20,
                      env=env)
    # The master calls MPI_Abort(70); prterun passes 70 on, except when it crashes itself while
    # tearing down the stopped rank (exit -11, seen 1 run in 4), so only "not 0" is ours.
    assert process.returncode != 0, process.stdout
    assert "(parked: silent since the watchdog took back their work); ending the job" \
        in process.stdout
    assert "continue with --resume" in process.stdout
    dispatch = stats(out)["extra"]["dispatch"]
    assert dispatch["parked"] == [1]
    assert (dispatch["watchdog_timeouts"], dispatch["worker_recoveries"]) == (1, 0)
    assert stats(out)["extra"]["stop_reason"] == "frontier exhausted"
    checked = verify(out)
    assert checked.returncode == 0, checked.stdout
    assert crash_files(out)
