"""A commit that raises (an OSError while promoting or queueing a child) inside the master
loop: the master goes on, the input is retried (and deferred after repeated failures, as an
invalid RESULT's is), its unpublished children stay unseen, and a later run publishes them.
A real Master over a fake channel: its message handling, dispatch and commit, no MPI."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from fakes import LoopbackChannel

from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.layout import check_out_dir, sha256_bytes
from symcc_mpi.config import CampaignConfig
from symcc_mpi.dispatch.watchdog import WatchdogConfig
from symcc_mpi.durable.deferred import DeferredWorkJournal
from symcc_mpi.roles.master import Master
from symcc_mpi.wire.protocol import Ready, Result, StagedFile, Tag, Work
from symcc_mpi.wire.staging import write_entries
from symcc_mpi.wire.transport import Incoming

RANK = 1
CHILDREN = (b"first child", b"second child")


class FailingPromotions:
    """campaign.promote raising EIO on the chosen calls (1-based). (ENOSPC, EDQUOT and EROFS
    stop the campaign instead: tests/unit/test_storage_stop.py.)"""

    def __init__(self, promote, failing_calls):
        self.promote, self.failing, self.calls = promote, set(failing_calls), 0

    def __call__(self, digest, data):
        self.calls += 1
        if self.calls in self.failing:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return self.promote(digest, data)


@pytest.fixture
def master(tmp_path):
    out = tmp_path / "out"
    check_out_dir(out, resume=False)
    campaign = CampaignDir(out)
    campaign.create({"test": True})
    campaign.lock()  # the master's: it alone appends to the done journal
    config = CampaignConfig(target=("t",), seeds=tmp_path, out=out, executor="noop")
    deferrals = DeferredWorkJournal(out / "state" / "deferred.jsonl", fsync=False)
    m = Master(LoopbackChannel(workers=1), config, campaign, deferrals=deferrals,
               watchdog=WatchdogConfig(seconds=0, protocol_retries=1))
    m.parent = campaign.add_seed(b"the seed", "seed")
    m.frontier.add(m.parent)
    yield m
    m.close()


def run_once(m: Master, last_token: str | None) -> Work:
    """The worker's READY, then the master's dispatch: the WORK it sent."""
    m._handle(Incoming(RANK, Tag.READY, Ready(last_token)))
    m.dispatch.join()
    m.dispatch.dispatch(m.sender.send)
    dest, tag, work = m.channel.sent[-1]
    assert (dest, tag) == (RANK, Tag.WORK)
    return work


def answer(m: Master, work: Work) -> None:
    """The worker's RESULT, with both children staged."""
    write_entries(Path(m.campaign.staged_pack(work.token)),
                  [(sha256_bytes(data), data) for data in CHILDREN])
    staged = [StagedFile(sha256_bytes(d), len(d)) for d in CHILDREN]
    m._handle(Incoming(RANK, Tag.RESULT, Result(
        token=work.token, digest=work.digest, outcome="ok", exit_status=0,
        wall_time=0.1, solver_time=0.0, staged=staged, generated=2)))


def test_a_failed_promotion_requeues_the_input_and_the_retry_publishes(master):
    m = master
    m.campaign.promote = FailingPromotions(m.campaign.promote, {2})
    work = run_once(m, None)
    assert work.digest == m.parent
    answer(m, work)  # raises inside the commit: the master must not
    first, second = (sha256_bytes(d) for d in CHILDREN)
    assert (m.campaign.corpus / first).read_bytes() == CHILDREN[0]  # stays valid
    assert not m.frontier.seen_before(second)
    assert m.parent not in m.frontier.done
    assert list(m.frontier.pending)[0] == m.parent  # back in front
    figures = m.dispatch.statistics()
    assert figures.commit_failures == 1
    assert figures.protocol_requeued == 1
    assert figures.recoveries_by_source == {"commit-failed": 1}
    assert (figures.active, figures.committing) == (0, 0)
    # The worker's next READY echoes the failed dispatch; the retry commits.
    retry = run_once(m, work.token)
    assert retry.digest == m.parent and retry.token != work.token
    answer(m, retry)
    assert (m.campaign.corpus / second).read_bytes() == CHILDREN[1]
    assert m.parent in m.frontier.done
    assert {first, second} <= set(m.frontier.known)
    assert m.dispatch.statistics().committed == 1
    assert m.stats.unique == 2 and m.stats.interesting == 2


def test_an_input_whose_commit_keeps_failing_is_deferred_not_lost(master, caplog):
    m = master
    m.campaign.promote = FailingPromotions(m.campaign.promote, {1, 2})
    work = run_once(m, None)
    with caplog.at_level("WARNING"):
        answer(m, work)
        answer(m, run_once(m, work.token))
    assert any("EIO" in r.getMessage() for r in caplog.records)
    figures = m.dispatch.statistics()
    assert (figures.commit_failures, figures.protocol_requeued,
            figures.protocol_deferred) == (2, 1, 1)
    assert m.parent not in m.frontier.done and m.parent not in list(m.frontier.pending)
    assert m.parent in m.dispatch.recovery.deferred()
    assert not any(m.frontier.seen_before(sha256_bytes(d)) for d in CHILDREN)


def test_an_error_that_is_not_an_oserror_still_goes_through_the_boundary(master):
    """A bug is not a failed promotion: the boundary compensates and re-raises."""
    m = master

    def broken(digest, data):
        raise RuntimeError("a bug")

    m.campaign.promote = broken
    work = run_once(m, None)
    with pytest.raises(RuntimeError):
        answer(m, work)
    assert list(m.frontier.pending) == [m.parent]
    assert m.dispatch.statistics().committing == 0
