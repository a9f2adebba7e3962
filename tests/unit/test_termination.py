"""SIGTERM from a scheduler (scancel, preemption) reaches every process of the job: workers
leave the stop to the master, and a run the signal cut short is not a finding."""

from __future__ import annotations

import signal

import pytest
from mpi4py import MPI
from test_storage_stop import master, result_for, work_of  # noqa: F401 - the fixture

from symcc_mpi.campaign.corpus import sha256_bytes
from symcc_mpi.config import CampaignConfig
from symcc_mpi.executors.base import ExecutionResult, Outcome
from symcc_mpi.roles.master import Phase
from symcc_mpi.roles.worker import TERMINATING, Worker, note_termination
from symcc_mpi.wire.protocol import INTERRUPTED, Tag, Work
from symcc_mpi.wire.transport import RankFailure


class Executor:
    name = "scripted"
    targetable = False

    def __init__(self, outcome: Outcome, status: int):
        self.outcome, self.status = outcome, status

    def run(self, input_path, output_dir, targets=None, *, pruned=True) -> ExecutionResult:
        return ExecutionResult(self.outcome, self.status, 0.1)

    def cancel(self) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture
def terminating():
    TERMINATING.clear()
    yield TERMINATING
    TERMINATING.clear()


def run_once(tmp_path, executor: Executor):
    config = CampaignConfig(target=("/bin/true", "@@"), seeds=None, out=tmp_path / "out",
                            executor="noop")
    worker = Worker(1, config)
    worker.executor = executor
    data = b"an input"
    digest = sha256_bytes(data)
    try:
        return worker._run(None, Work(token="ab" * 16, digest=digest,
                                      objects={digest: data}), worker.scratch / "pack",
                           watch=False)
    finally:
        worker.close()


@pytest.mark.parametrize("outcome, status", [(Outcome.CRASH, -signal.SIGTERM),
                                             (Outcome.CRASH, -signal.SIGKILL),
                                             (Outcome.ERROR, 1), (Outcome.TIMEOUT, None)])
def test_a_run_cut_short_by_sigterm_is_reported_interrupted_not_as_a_finding(
        tmp_path, terminating, outcome, status):
    note_termination(signal.SIGTERM, None)
    result = run_once(tmp_path, Executor(outcome, status))
    assert result.outcome == INTERRUPTED
    assert result.staged == [] and "SIGTERM" in result.message


def test_a_run_that_finished_is_reported_as_it_ended(tmp_path, terminating):
    note_termination(signal.SIGTERM, None)
    assert run_once(tmp_path, Executor(Outcome.OK, 0)).outcome == Outcome.OK.value
    terminating.clear()  # no SIGTERM: a target killed by a signal is a crash, as always
    assert run_once(tmp_path, Executor(Outcome.CRASH, -signal.SIGTERM)).outcome == \
        Outcome.CRASH.value


def test_the_master_gives_an_interrupted_input_back_without_counting_a_failure(master):  # noqa: F811
    first = work_of(master, 1)
    master._on_result(1, result_for(first, INTERRUPTED, "rank 1: SIGTERM reached the job"))
    master.dispatch.join()
    assert first.digest in master.frontier.pending
    assert master.phase is Phase.RUNNING  # the master's own SIGTERM decides the stop
    statistics = master.dispatch.statistics()
    assert statistics.protocol_requeued == statistics.protocol_deferred == 0
    assert master.stats.executions == 0 and master.campaign.read_done() == []
    assert not master.dispatch.recovery.deferred()


def test_a_worker_found_dead_at_the_release_does_not_keep_the_others_waiting(master):  # noqa: F811
    """The simulation's seed 550: a worker died after the campaign was closed, and the send
    of its RELEASE, failing, ended the loop before the next worker's: that one waited for
    ever."""
    sent = master.channel.send

    def send(rank, tag, message):
        if rank == 1:
            raise RankFailure(MPI.Exception(MPI.ERR_PROC_FAILED))
        sent(rank, tag, message)

    master.channel.send = send
    master.release_workers()
    assert [(rank, tag) for rank, tag, _ in master.channel.sent if tag is Tag.RELEASE] \
        == [(2, Tag.RELEASE)]
