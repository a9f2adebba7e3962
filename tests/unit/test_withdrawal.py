"""federation/withdrawal.py without MPI: a master left with no worker gives its share of the
work to the masters still working, each input to exactly one of them, and its leases to
whoever claims them."""

from __future__ import annotations

from types import SimpleNamespace

from symcc_mpi.campaign.layout import sha256_bytes
from symcc_mpi.durable.clock import ManualClock
from symcc_mpi.federation.layout import groups
from symcc_mpi.federation.masters import Federation
from symcc_mpi.federation.ownership import new_epoch, owner
from symcc_mpi.scheduling.frontier import Frontier
from symcc_mpi.wire.control import Prepare

DIGESTS = [sha256_bytes(b"input %d" % number) for number in range(60)]


def masters_sharing(tmp_path, count=3):
    """`count` masters of one job over one corpus of DIGESTS, each knowing every input and
    its own share queued, as discovery leaves them."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for digest in DIGESTS:
        (corpus / digest).write_bytes(b"")
    epoch, clock, made = new_epoch(), ManualClock(), []
    for index in range(count):
        federation = Federation(None, index=index, masters=count, out=tmp_path, epoch=epoch,
                                world_ranks=groups(2 * count, count), execution_timeout=1.0)
        federation.open(clock)
        frontier = Frontier()
        frontier.mine = federation.mine  # as the master sets it: the others' known, not queued
        for digest in DIGESTS:
            frontier.add(digest)
        done: set[str] = set()
        own = SimpleNamespace(frontier=frontier, busy=lambda: False, done=done,
                              campaign=SimpleNamespace(corpus=corpus,
                                                       done_elsewhere=lambda done=done: done))
        made.append((federation, own))
    return made


def dispatched_or_dropped(federation, own) -> None:
    """The master's dispatch took every input out of its frontier: its own it claimed (and
    analysed, or not yet), the others' it dropped."""
    while own.frontier:
        digest = own.frontier.take()
        if federation.owns(digest):
            federation.admit(digest)


def test_a_master_with_no_worker_hands_each_input_of_its_share_to_one_other(tmp_path):
    (first, first_own), (middle, middle_own), (last, last_own) = masters_sharing(tmp_path)
    for federation, own in ((first, first_own), (last, last_own)):
        dispatched_or_dropped(federation, own)
    share = [d for d in DIGESTS if owner(d, (0, 1, 2)) == 1]
    middle.claim_ahead(middle_own.frontier.pending.head(), 8)
    assert len(middle.held) == 8
    analysed_elsewhere = set(share[:3])  # in another master's journal (a previous run)
    first_own.done.update(analysed_elsewhere)
    last_own.done.update(analysed_elsewhere)

    assert middle.withdraw(middle_own)
    assert not middle.held and not middle_own.frontier  # nothing kept, nothing to run
    assert (middle.directory / "withdrawn-1").exists()
    assert not any(middle.owns(digest) for digest in DIGESTS)
    for federation, own in ((first, first_own), (last, last_own)):
        federation.check_withdrawals(own, 0.0)
        assert federation.working == (0, 2)
    taken = {0: list(first_own.frontier.pending), 2: list(last_own.frontier.pending)}
    assert not set(taken[0]) & set(taken[2])
    assert sorted(taken[0] + taken[2]) == sorted(set(share) - analysed_elsewhere)
    for index, federation in ((0, first), (2, last)):
        assert all(federation.owns(digest) for digest in taken[index])
        federation.claim_ahead(iter(taken[index]), len(taken[index]))
        assert sorted(federation.held) == sorted(  # its earlier claims, and every lease given up
            [d for d in DIGESTS if owner(d, (0, 1, 2)) == index] + taken[index])


def test_a_frozen_master_takes_a_withdrawn_share_only_at_its_rescan(tmp_path):
    (first, first_own), (second, second_own) = masters_sharing(tmp_path, count=2)
    dispatched_or_dropped(first, first_own)
    first.participant.status(True, 0.0)
    first.participant.on_prepare(0, Prepare("ab" * 16), still_idle=True)
    assert first.participant.frozen
    assert second.withdraw(second_own)
    first.check_withdrawals(first_own, 5.0)
    assert first.working == (0, 1) and not first_own.frontier  # not while frozen
    assert not first.rescan(first_own)  # at the vote: the share is work, the vote BUSY
    assert first.working == (0,) and first_own.frontier


def test_the_last_master_that_works_or_one_with_work_in_hand_does_not_withdraw(tmp_path):
    (first, first_own), (second, second_own) = masters_sharing(tmp_path, count=2)
    busy = SimpleNamespace(**{**vars(second_own), "busy": lambda: True})
    assert not second.withdraw(busy)  # parts of a split input still to run
    assert second.withdraw(second_own)
    assert not first.withdraw(first_own)  # nobody would run the campaign's inputs
    assert first.at_work
