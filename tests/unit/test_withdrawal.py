"""federation/withdrawal.py without MPI: a master left with no worker gives its share of the
work to the masters still working, each input to exactly one of them, and its leases to
whoever claims them."""

from __future__ import annotations

from types import SimpleNamespace

from symcc_mpi.campaign import wal
from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.layout import sha256_bytes
from symcc_mpi.durable.clock import ManualClock
from symcc_mpi.federation.layout import groups
from symcc_mpi.federation.masters import QUIESCENCE_WINDOW, Federation
from symcc_mpi.federation.ownership import new_epoch, owner
from symcc_mpi.federation.withdrawal import RECLAIM_LOCK_WAIT
from symcc_mpi.scheduling.frontier import Frontier
from symcc_mpi.wire.control import Prepare
from symcc_mpi.wire.control import Status as ControlStatus

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
                              give_up_splits=list,
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


def test_the_last_master_that_works_does_not_withdraw(tmp_path):
    (first, first_own), (second, second_own) = masters_sharing(tmp_path, count=2)
    assert second.withdraw(second_own)
    assert not first.withdraw(first_own)  # nobody would run the campaign's inputs
    assert first.at_work


def test_an_input_a_master_was_splitting_goes_whole_to_its_new_owner(tmp_path):
    (first, first_own), (second, second_own) = masters_sharing(tmp_path, count=2)
    dispatched_or_dropped(first, first_own)
    dispatched_or_dropped(second, second_own)  # its share claimed: one input it splits
    splitting = next(d for d in DIGESTS if owner(d, (0, 1)) == 1)
    second_own.give_up_splits = lambda: [splitting]
    second_own.done.update(d for d in second.held if d != splitting)  # the rest analysed
    first_own.done.update(second_own.done)
    assert second.withdraw(second_own) and not second.held
    first.check_withdrawals(first_own, 0.0)
    assert list(first_own.frontier.pending) == [splitting]
    assert first.admit(splitting)  # its lease given up: the new owner wins it


def test_an_input_whose_lease_a_withdrawn_master_had_taken_over_goes_back_to_its_owner(
        tmp_path):
    (first, first_own), (second, second_own) = masters_sharing(tmp_path, count=2)
    clock = first.clock
    dispatched_or_dropped(first, first_own)  # its share out; then it pauses past the TTL
    clock.advance(1000.0)
    lost, = second.leases.recover_expired(limit=1, rescan=True)
    second.held[lost] = second.leases.read(lost).token
    first.heartbeat()  # finds the lease taken
    assert lost not in first.held and lost in first.lost_leases
    assert second.withdraw(second_own)  # and gives it up, unanalysed
    assert not first_own.frontier
    first.check_withdrawals(first_own, clock.monotonic() + 10)
    assert lost in set(first_own.frontier.pending) and not first.lost_leases
    assert first.admit(lost)


class DeadRanks:
    """A masters' channel on which nothing arrives; MPI's dead as the test says."""

    def __init__(self, failed):
        self.failed = set(failed)

    def failed_ranks(self):
        return set(self.failed)

    def poll(self):
        return None


def dead_group_of_master_1(tmp_path):
    """Root and master 1 of 2 (world ranks 0-2 and 3-5) over one campaign. Master 1 took
    three inputs, all its own: it analysed `done` (publishing `child`, which root never
    named), began the commit of `committing` (its manifest written, `half` published) and
    had `out` in flight; then its whole group died."""
    epoch, clock = new_epoch(), ManualClock()
    root_frontier = Frontier()
    campaign = CampaignDir(tmp_path, root_frontier)
    campaign.create({})
    campaign.lock()
    campaign.open_journal()
    root = Federation(DeadRanks({3, 4, 5}), index=0, masters=2, out=tmp_path,
                      epoch=epoch, world_ranks=groups(6, 2), execution_timeout=1.0)
    root.open(clock)
    root_frontier.mine = root.mine
    dead = Federation(None, index=1, masters=2, out=tmp_path, epoch=epoch,
                      world_ranks=groups(6, 2), execution_timeout=1.0)
    dead.open(clock)
    done, committing, out = [d for d in DIGESTS if owner(d, (0, 1)) == 1][:3]
    child, half = sha256_bytes(b"a child"), sha256_bytes(b"half a commit")
    for digest in (done, committing, out, child, half):
        campaign.promote(digest, b"")  # whoever published them: they are in corpus/
        root_frontier.add(digest)
    assert all(dead.admit(digest) for digest in (done, committing, out))
    journal = CampaignDir(tmp_path, master=1)
    journal.lock()
    journal.open_journal()
    for digest in (done, committing, out):
        journal.record_work(wal.Dispatch(digest=digest, token=digest[:32],
                                         generation=0))
        (tmp_path / ".staging" / (digest[:32])).write_bytes(b"a pack")
    assert dead.begin_commit(done) and dead.begin_commit(committing)
    journal.record_done(done, done[:32], "ok", published=[child])
    dead.complete(done)
    journal.record_work(wal.Commit(digest=committing, token=committing[:32], generation=0,
                                   outcome="ok", publish=[[half, 0, "ok"]]))
    journal.close()  # its lock goes with the dead process
    own = SimpleNamespace(frontier=root_frontier, campaign=campaign, busy=lambda: False)
    return root, own, clock, (done, committing, out, child, half)


def test_root_withdraws_a_master_whose_whole_group_died_and_takes_its_work(tmp_path):
    root, own, clock, (done, committing, out, child, half) = dead_group_of_master_1(tmp_path)
    root._masters_died()
    assert not root.lost and set(root.reclaiming) == {1}
    root.reclaim(own, clock.monotonic())
    assert not root.lost and not root.reclaiming
    assert (root.directory / "withdrawn-1").exists() and root.working == (0,)
    # What it had out, a commit it began included, is taken back on record and goes to
    # root; what it analysed does not.
    records, _ = CampaignDir(tmp_path, master=1).inspect_journal()
    taken_back = [r for r in records if wal.kind_of(r) is wal.Kind.RECOVERED]
    assert [(r["requeued"], r["master"], r["failed"]) for r in taken_back] == [
        (sorted([committing, out]), "reclaimed", ["rank 3", "rank 4", "rank 5"])]
    assert wal.outstanding(records) == set()
    assert sorted(own.frontier.pending) == sorted([committing, out, child, half])  # root's
    # Its leases: the done one completed, the others given up, for root to claim.
    assert root.leases._table.read(done).status == "done"
    assert root.roster.successions[-1]["first_dispatch"] is None
    assert root.admit(committing) and root.admit(out)
    assert root.roster.successions[-1]["first_dispatch"] is not None  # work again, timed
    # Its unnamed finds are named, and its workers' packs are gone.
    assert own.campaign.inputs.queue_id(child) is not None
    assert own.campaign.inputs.queue_id(half) is not None
    assert not list((tmp_path / ".staging").iterdir())
    assert [(f["master_index"], f["requeued"], f["master"]) for f in root.roster.successions] \
        == [(1, 2, "reclaimed")]
    root.coordinator.on_status(0, ControlStatus(1, idle=True), 0.0)  # master 1 not waited for
    assert [type(message) for _, message in root.coordinator.tick(QUIESCENCE_WINDOW)] \
        == [Prepare]


def test_a_dead_groups_lock_still_held_is_tried_again_then_the_campaign_stops(tmp_path):
    root, own, clock, _ = dead_group_of_master_1(tmp_path)
    held = CampaignDir(tmp_path, master=1)
    held.lock()  # as NFS keeps a dead client's lock for a while
    root._masters_died()
    root.reclaim(own, clock.monotonic())
    assert set(root.reclaiming) == {1} and not root.lost
    held.close()
    root.reclaim(own, clock.monotonic())  # released in time
    assert not root.reclaiming and not root.lost and root.working == (0,)

    root, own, clock, _ = dead_group_of_master_1(tmp_path / "again")
    held = CampaignDir(tmp_path / "again", master=1)
    held.lock()
    root._masters_died()
    root.reclaim(own, clock.monotonic() + RECLAIM_LOCK_WAIT)
    assert root.lost and root.working == (0, 1)
    assert root.stop_reason == "master 1 died and no worker of its is left: continue with " \
                               "--resume"
    held.close()


def test_a_dead_group_is_not_withdrawn_when_no_other_master_works(tmp_path):
    root, own, clock, _ = dead_group_of_master_1(tmp_path)
    (root.directory / "withdrawn-0").touch()  # root had no worker left
    root._masters_died()
    root.reclaim(own, clock.monotonic())
    assert root.lost and not (root.directory / "withdrawn-1").exists()
