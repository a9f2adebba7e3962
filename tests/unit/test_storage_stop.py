"""A filesystem that refuses writes (full, over quota, read-only) stops the campaign once,
in one line, and costs no input a retry or a deferral; stop requests belong to their run."""

from __future__ import annotations

import errno
import logging
import os

import pytest
from fakes import LoopbackChannel

from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.layout import check_out_dir
from symcc_mpi.campaign.stop import StopRequest, stop_request_verdict
from symcc_mpi.config import CampaignConfig
from symcc_mpi.dispatch.watchdog import WatchdogConfig
from symcc_mpi.durable.deferred import DEFERRED_JOURNAL_NAME, DeferredWorkJournal
from symcc_mpi.durable.storage import STOP_ADVICE, STORAGE_EXIT, describe, storage_refused
from symcc_mpi.roles.master import Master, Phase
from symcc_mpi.wire.protocol import STORAGE_REFUSED, Result, Tag
from symcc_mpi.wire.transport import Incoming

WORKERS = (1, 2)


@pytest.fixture
def master(tmp_path):
    out = tmp_path / "out"
    check_out_dir(out, resume=False)
    campaign = CampaignDir(out)
    campaign.create({})
    campaign.lock()
    seeds = [campaign.add_seed(b"seed %d" % i, f"s{i}") for i in range(4)]
    # No retry at all: an input that a storage failure counted against would be deferred.
    journal = DeferredWorkJournal(campaign.state / DEFERRED_JOURNAL_NAME)
    config = CampaignConfig(target=("t",), seeds=tmp_path, out=out, executor="noop")
    m = Master(LoopbackChannel(len(WORKERS)), config, campaign, deferrals=journal,
               watchdog=WatchdogConfig(0, 0))
    for digest in seeds:
        m.frontier.add(digest)
    for rank in WORKERS:
        m.dispatch.ready(rank, None)
    m.dispatch.dispatch(m.sender.send)
    yield m
    m.close()


def work_of(master: Master, rank: int):
    return next(message for dest, tag, message in reversed(master.channel.sent)
                if dest == rank and tag == Tag.WORK)


def result_for(work, outcome="ok", message="") -> Result:
    return Result(token=work.token, digest=work.digest, outcome=outcome,
                  exit_status=0, wall_time=0.0, solver_time=0.0, staged=[], generated=0,
                  message=message)


def assert_given_back_and_stopping(master: Master, inputs) -> None:
    master.dispatch.join()
    assert master.phase is Phase.DRAINING
    assert set(inputs) <= set(master.frontier.pending)
    assert master.dispatch.in_flight == 0
    assert not master.dispatch.recovery.deferred()
    statistics = master.dispatch.statistics()
    assert statistics.protocol_requeued == statistics.protocol_deferred == 0
    journal = master.campaign.state / DEFERRED_JOURNAL_NAME
    assert not journal.exists() or journal.stat().st_size == 0
    assert master.stats.executions == 0 and master.campaign.read_done() == []


def storage_errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.ERROR and STOP_ADVICE in r.getMessage()]


def test_a_worker_that_could_not_stage_stops_the_campaign_and_costs_no_input_a_retry(
        master, caplog):
    first, second = work_of(master, 1), work_of(master, 2)
    where = f"no space left on device writing {master.config.out}/.staging/{first.token}/x"
    master._on_result(1, result_for(first, STORAGE_REFUSED, where))
    # The other worker's result arrives after the stop: it is given back, not committed.
    master._on_result(2, result_for(second))
    assert_given_back_and_stopping(master, [first.digest, second.digest])
    assert storage_errors(caplog) == [f"rank 1: {where}: {STOP_ADVICE}"]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS])
def test_a_commit_the_filesystem_refuses_stops_the_campaign_once(master, caplog,
                                                                 monkeypatch, code):
    target = str(master.campaign.corpus / ("ab" * 32))

    def refused(*args, **kwargs):
        raise OSError(code, os.strerror(code), target)

    monkeypatch.setattr(master.committer, "commit", refused)
    first, second = work_of(master, 1), work_of(master, 2)
    master._on_result(1, result_for(first))
    master._on_result(2, result_for(second))
    monkeypatch.setattr(master, "report", refused)  # the same fault again: not said twice
    with master.guard:
        master.report()
    assert_given_back_and_stopping(master, [first.digest, second.digest])
    assert storage_errors(caplog) == [
        f"{os.strerror(code).lower()} writing {target}: {STOP_ADVICE}"]


def test_checkpoints_that_fail_end_the_run_with_the_storage_status(master, monkeypatch,
                                                                   caplog):
    def refused(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(master.checkpoint, "after_round", refused)
    master.channel.incoming.extend(
        Incoming(rank, Tag.RESULT, result_for(work_of(master, rank))) for rank in WORKERS)
    assert master.run() == STORAGE_EXIT
    assert master.stats.stop_reason == \
        f"no space left on device writing {master.config.out}"
    assert len(storage_errors(caplog)) == 1
    assert [dest for dest, tag, _ in master.channel.sent if tag == Tag.STOP] == list(WORKERS)


def test_storage_errors_are_recognised_and_named_by_the_path_written():
    assert storage_refused(OSError(errno.ENOSPC, "x"))
    assert storage_refused(OSError(errno.EDQUOT, "x"))
    assert storage_refused(OSError(errno.EROFS, "x"))
    assert not storage_refused(OSError(errno.EIO, "x"))
    assert not storage_refused(ValueError("x"))
    moved = OSError(errno.ENOSPC, "No space left on device", "/scratch/g/0", None, "/o/f")
    assert describe(moved, "/o") == "no space left on device writing /o/f"
    assert describe(OSError(errno.EROFS, "x"), "/o") == "read-only file system writing /o"


@pytest.mark.parametrize("text, made, verdict", [
    ("run-a\n", 0.0, StopRequest.THIS_RUN),  # the launcher's, for this run: whenever made
    ("run-b\n", 200.0, StopRequest.STALE),  # another run's, even a recent one
    ("", 200.0, StopRequest.THIS_RUN),  # `touch`ed during this run (README)
    ("", 50.0, StopRequest.STALE),  # `touch`ed before it started: left by a dead run
    ("12345\n", 200.0, StopRequest.STALE),  # the old format: a launcher's pid
])
def test_a_stop_request_belongs_to_the_run_it_was_made_for(text, made, verdict):
    assert stop_request_verdict(text, made, "run-a", run_started=100.0) is verdict


def test_another_runs_stop_request_is_removed_once_read_this_runs_once_withdrawn(tmp_path):
    """This run's stays while the run goes on: found by the simulation (seed 1479), a master
    that died while stopping left a successor that never learnt of the stop."""
    campaign = CampaignDir(tmp_path)
    assert campaign.read_stop_request("run-a", 0.0) is StopRequest.NONE
    campaign.request_stop("run-b")
    assert campaign.read_stop_request("run-a", 0.0) is StopRequest.STALE
    assert not campaign.stop_request.exists()
    campaign.request_stop("run-a")
    assert campaign.read_stop_request("run-a", 0.0) is StopRequest.THIS_RUN
    assert campaign.read_stop_request("run-a", 0.0) is StopRequest.THIS_RUN  # a successor's
    campaign.withdraw_stop_request()
    assert not campaign.stop_request.exists()
