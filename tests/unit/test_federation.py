"""federation.py without MPI: the rank layout, admission by owner and lease, the figures
root combines, the fault plans addressed to a master by index, and the triage and pruning
maps the masters exchange."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from symcc_mpi.campaign.layout import sha256_bytes
from symcc_mpi.campaign.report import CampaignSnapshot
from symcc_mpi.config import UsageError
from symcc_mpi.coverage.edges import FileCoverage, Status, pack_u32
from symcc_mpi.coverage.pruning import MAP_SIZE, PruningLedger, PruningMode, decode, difference
from symcc_mpi.coverage.triage import CoverageMap
from symcc_mpi.durable.clock import ManualClock
from symcc_mpi.federation.figures import combine
from symcc_mpi.federation.layout import groups
from symcc_mpi.federation.masters import QUIESCENCE_WINDOW, Federation
from symcc_mpi.federation.ownership import new_epoch, owner
from symcc_mpi.federation.roster import SUCCESSION_WAIT, Claim, Roster
from symcc_mpi.roles.faults import Faults
from symcc_mpi.scheduling.frontier import Frontier
from symcc_mpi.wire.control import Prepare
from symcc_mpi.wire.control import Status as ControlStatus
from symcc_mpi.wire.protocol import Death, Finding, FindingKind, Successor, Tag
from symcc_mpi.wire.transport import Incoming

DIGESTS = [sha256_bytes(b"input %d" % number) for number in range(40)]


def test_groups_are_contiguous_blocks_that_differ_by_at_most_one_rank():
    assert groups(5, 2) == [range(0, 3), range(3, 5)]
    assert groups(8, 3) == [range(0, 3), range(3, 6), range(6, 8)]
    for size in range(4, 30):
        for masters in range(1, size // 2 + 1):
            blocks = groups(size, masters)
            assert [r for block in blocks for r in block] == list(range(size))
            assert max(map(len, blocks)) - min(map(len, blocks)) <= 1
            assert min(map(len, blocks)) >= 2  # a master and a worker at least
    with pytest.raises(UsageError, match="--masters 3 needs at least 6 MPI ranks"):
        groups(5, 3)


def federations(tmp_path, masters=2, clock=None):
    """`masters` federations of one job, their leases timed by `clock` (ManualClock if None)."""
    clock = clock or ManualClock()
    epoch = new_epoch()
    made = []
    for index in range(masters):
        federation = Federation(None, index=index, masters=masters, out=tmp_path,
                                epoch=epoch, world_ranks=groups(2 * masters, masters),
                                execution_timeout=1.0)
        federation.open(clock)
        made.append(federation)
    return made


def test_a_master_admits_only_what_it_owns_and_wins(tmp_path):
    first, second = federations(tmp_path)
    mine = [d for d in DIGESTS if owner(d, (0, 1)) == 0]
    theirs = [d for d in DIGESTS if owner(d, (0, 1)) == 1]
    assert mine and theirs
    assert all(first.admit(d) for d in mine)
    assert not any(first.admit(d) for d in theirs)  # not claimed either
    assert first.not_owned == len(theirs)
    assert all(second.admit(d) for d in theirs)


def test_a_commit_goes_through_only_while_the_lease_is_current(tmp_path, monkeypatch):
    monkeypatch.setenv("SYMCC_STANDALONE_WORK_LEASE_TTL", "0.2")
    clock = ManualClock()
    first, second = federations(tmp_path, clock=clock)
    digest = next(d for d in DIGESTS if owner(d, (0, 1)) == 0)
    assert first.admit(digest)
    clock.advance(0.3)  # past the TTL: the lease may be taken over (it never expires too early)
    frontier = Frontier()
    (tmp_path / digest).write_bytes(b"input")
    assert second._take_recovered(frontier, second.leases.recover_expired(4, rescan=True),
                                  tmp_path) == 1
    assert digest in frontier.pending and second.admit(digest)
    assert not first.begin_commit(digest)  # stale: its result changes nothing
    assert first.stale_results == 1
    assert second.begin_commit(digest)
    second.complete(digest)
    assert not first.admit(digest) and not second.admit(digest)  # done for the whole job


def test_claims_ahead_take_the_next_owned_inputs(tmp_path):
    first, _ = federations(tmp_path)
    owned = [d for d in DIGESTS if owner(d, (0, 1)) == 0]
    first.claim_ahead(DIGESTS, 2)
    assert set(first.held) == set(owned[:2])
    first.claim_ahead(DIGESTS, len(DIGESTS))
    assert set(first.held) == set(owned)


def test_a_fence_claims_the_next_owned_inputs_in_the_same_write(tmp_path):
    first, second = federations(tmp_path)
    owned = [d for d in DIGESTS if owner(d, (0, 1)) == 0]
    first.claim_ahead(DIGESTS, 1)
    writes = first.leases.statistics().writes
    assert first.begin_commit(owned[0], DIGESTS, 3)
    assert set(first.held) == set(owned[:4]) and first.leases.statistics().writes == writes + 1
    assert not second.admit(owned[1]) and first.admit(owned[1])


def test_root_combines_every_masters_figures():
    own = CampaignSnapshot(start_time=1.0, now=5.0, executions=3, interesting=2, workers=1,
                           pending=1, last_find=4.0, per_worker={1: {"executions": 3}},
                           extra={"federation": {"claims": 3}, "in_flight": 0,
                                  "world_ranks": [0, 1]})
    other = {"executions": 5, "interesting": 1, "workers": 2, "last_find": 4.5,
             "per_worker": {"1": {"executions": 2}, "2": {"executions": 3}},
             "extra": {"federation": {"claims": 6, "steals": 1}, "in_flight": 1,
                       "world_ranks": [2, 3, 4]}}
    # A master that died and was replaced: what it did counts, what it held is its successor's.
    replaced = {"executions": 4, "interesting": 2, "pending": 9, "workers": 2,
                "extra": {"master_index": 1}}
    combined = combine(own, {1: other}, [replaced])
    assert (combined.executions, combined.interesting, combined.workers) == (12, 5, 3)
    assert combined.pending == 1
    assert combined.last_find == 4.5
    assert sorted(combined.per_worker) == [1, 3, 4]  # world ranks
    assert combined.extra["per_master"]["1"]["claims"] == 6
    assert combined.extra["per_master"]["1"]["steals"] == 1
    assert combined.extra["per_master"]["0"]["world_rank"] == 0


def test_root_combines_the_masters_executor_failures_by_reason():
    z3 = {"reason": "SIGABRT: z3", "count": 2, "example_digest": "a" * 64, "example_path": None}
    own = CampaignSnapshot(start_time=1.0, now=5.0,
                           extra={"executor_errors": 2, "executor_failures": [z3]})
    other = {"extra": {"executor_errors": 4, "executor_failures": [
        {"reason": "SIGSEGV", "count": 1, "example_digest": "b" * 64, "example_path": None},
        dict(z3, count=3, example_digest="c" * 64)]}}
    extra = combine(own, {1: other}).extra
    assert extra["executor_errors"] == 6
    assert [(g["reason"], g["count"], g["example_digest"][0]) for g in
            extra["executor_failures"]] == [("SIGABRT: z3", 5, "a"), ("SIGSEGV", 1, "b")]
    assert z3["count"] == 2  # the masters' own figures are left alone


def test_root_lists_every_masters_survived_failures_in_the_order_they_came():
    def failure(rank: int, detected: float) -> dict:
        return {"generation": None, "failed": [f"rank {rank} (pid 9 on vm)"], "requeued": 1,
                "master": "kept", "detected": detected, "first_dispatch": detected + 0.2}

    own = CampaignSnapshot(start_time=1.0, now=5.0, extra={"failures": [failure(1, 3.0)]})
    other = {"extra": {"master_index": 1, "failures": [failure(4, 2.0), failure(5, 4.0)]}}
    extra = combine(own, {1: other}).extra
    assert [(f["master_index"], f["failed"][0].split()[1]) for f in extra["failures"]] == [
        (1, "4"), (0, "1"), (1, "5")]


def test_a_master_plan_is_addressed_by_index_whatever_its_rank():
    assert Faults(3, "m1:pause@2=4", master_index=1).pause_seconds(2) == 4.0
    assert not Faults(3, "m1:pause@2=4", master_index=2).planned
    assert not Faults(1, "m1:pause@2=4").planned  # a worker: no master plan
    with pytest.raises(ValueError, match="SYMCC_MPI_FAULTS"):
        Faults(0, "m1:hostile@1=size")  # a worker kind, addressed to a master
    with pytest.raises(ValueError, match="SYMCC_MPI_FAULTS"):
        Faults(0, "mx:pause@1")


def test_an_expired_lease_whose_file_is_missing_is_abandoned_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("SYMCC_STANDALONE_WORK_LEASE_TTL", "0.2")
    clock = ManualClock()
    first, second = federations(tmp_path, clock=clock)
    digest = next(d for d in DIGESTS if owner(d, (0, 1)) == 0)
    assert first.admit(digest)
    clock.advance(0.3)  # past the TTL
    frontier = Frontier()
    assert second._take_recovered(frontier, second.leases.recover_expired(4, rescan=True),
                                  tmp_path) == 0
    assert digest not in second.held and not frontier.pending
    assert second.leases.statistics().abandoned == 1


def test_a_successor_queues_an_adopted_lease_of_another_masters_input(tmp_path, monkeypatch):
    monkeypatch.setenv("SYMCC_STANDALONE_WORK_LEASE_TTL", "0.2")
    clock, epoch = ManualClock(), new_epoch()
    first, second, successor = (
        Federation(None, index=index, masters=2, out=tmp_path, epoch=epoch,
                   world_ranks=groups(6, 2), execution_timeout=1.0) for index in (0, 1, 1))
    for federation in (first, second):
        federation.open(clock)
    digest = next(d for d in DIGESTS if owner(d, (0, 1)) == 0)
    (tmp_path / digest).write_bytes(b"")
    assert first.admit(digest)
    clock.advance(0.3)  # past the TTL: master 1 takes the lease over, then dies
    second._take_recovered(Frontier(), second.leases.recover_expired(4, rescan=True), tmp_path)
    assert digest in second.held
    successor.open(clock)
    frontier = Frontier()
    frontier.mine = successor.mine
    frontier.add(digest)  # its journal read back: master 0's input, known and not queued
    assert not frontier.pending
    assert successor.take_over(frontier) == 1
    assert list(frontier.pending) == [digest] and successor.admit(digest)


def normal(*edges: int) -> FileCoverage:
    """A normal run's summary hitting `edges` once each."""
    return FileCoverage(Status.OK, pack_u32(sorted(edges)), b"\x01" * len(edges))


def qsym_map(bits: dict[int, int]) -> bytes:
    """A whole QSYM map holding `bits` ({index: byte})."""
    data = bytearray(MAP_SIZE)
    for index, byte in bits.items():
        data[index] = byte
    return bytes(data)


def test_masters_end_up_with_the_union_of_their_maps(tmp_path):
    """A child one master kept is not new to the other once they exchanged maps, and a
    branch context one master's runs solved ships to the other's workers."""
    masters = federations(tmp_path)
    states = [SimpleNamespace(triage=CoverageMap(), pruning=PruningLedger(PruningMode.SHARED),
                              triage_dirty=False) for _ in masters]
    states[0].triage.merge(normal(3, 4))
    states[1].triage.merge(normal(8))
    states[0].pruning.merge(1, difference(bytes(MAP_SIZE), qsym_map({11: 0x04})))
    states[1].pruning.merge(3, difference(bytes(MAP_SIZE), qsym_map({12: 0x08})))
    for master, state in zip(masters, states, strict=True):
        master.maps.exchange(state)  # the first publishes before the second has
    masters[0].maps.exchange(states[0])
    for state in states:
        assert not state.triage.adds_coverage(normal(3, 4, 8))
        assert state.triage.edges_covered == 3
        assert state.pruning.shared_map() == qsym_map({11: 0x04, 12: 0x08})
    assert states[0].triage_dirty and states[1].triage_dirty
    shipped = decode(states[0].pruning.plan(1).payload)  # to master 0's worker 1
    assert difference(bytes(MAP_SIZE), qsym_map({11: 0x04, 12: 0x08})) == shipped
    assert [m.maps.statistics().gained for m in masters] == [2, 2]


class RecordingChannel:
    """What a federation sends, by world rank; MPI's dead as the test says."""

    def __init__(self, failed=()):
        self.failed = set(failed)
        self.sent: list[tuple[int, Tag, object]] = []

    def send(self, world, tag, message):
        self.sent.append((world, Tag(tag), message))

    def failed_ranks(self):
        return set(self.failed)

    def poll(self):
        return None


def successor_of_master_1(tmp_path, channel):
    """Master 1 of 2 (world ranks 0-2 and 3-5), itself a successor, that sent root a STOP
    and its figures, and voted YES on a PREPARE of root's."""
    federation = Federation(channel, index=1, masters=2, out=tmp_path, epoch=new_epoch(),
                            world_ranks=groups(6, 2), execution_timeout=1.0)
    federation.open(ManualClock())
    federation.roster.world_of[1] = 4
    federation.announce(Successor(1, [Death("rank 3 (pid 9 on vm)", 1.0, 0.1)]))
    federation.stopping("OUT refused writes")
    federation.report(CampaignSnapshot(start_time=1.0, now=2.0, executions=5), final=False)
    federation.participant.status(True, 0.0)
    federation.participant.on_prepare(0, Prepare("ab" * 16), still_idle=True)
    assert federation.participant.frozen
    return federation


def own_master(findings=()):
    return SimpleNamespace(campaign=SimpleNamespace(findings_to_forward=lambda: list(findings)),
                           count_malformed=lambda: None)


@pytest.mark.parametrize("decided", [None, "ab" * 16], ids=["undecided", "decided"])
def test_a_new_first_master_is_handed_again_what_the_dead_one_may_have_lost(tmp_path,
                                                                            decided):
    channel = RecordingChannel(failed={0})
    federation = successor_of_master_1(tmp_path, channel)
    channel.sent.clear()
    finding = Finding(FindingKind.QUEUE, DIGESTS[0], DIGESTS[1])
    news = Successor(0, [Death("rank 0 (pid 7 on vm)", 5.0, 0.1)], decided=decided)
    federation._on_message(own_master([finding]), Incoming(1, Tag.SUCCESSOR, news), 6.0)
    assert federation.roster.world_of[0] == 1 and not federation.lost
    assert [(world, tag) for world, tag, _ in channel.sent] == [
        (1, Tag.SUCCESSOR), (1, Tag.FINDING), (1, Tag.STOP), (1, Tag.FIGURES)]
    assert channel.sent[0][2] == federation.announcement and channel.sent[1][2] == finding
    # Undecided: the dead root's PREPARE is void. Decided: the end holds.
    assert federation.participant.done is (decided is not None)
    assert not federation.participant.frozen or federation.participant.done


def test_a_master_waits_for_the_first_masters_successor_then_stops_the_campaign(tmp_path):
    clock = ManualClock()
    channel = RecordingChannel(failed={0})
    federation = successor_of_master_1(tmp_path, channel)
    federation.clock = clock
    federation._masters_died()
    assert set(federation.roster.awaiting) == {0} and not federation.lost
    federation._succession_overdue(clock.monotonic() + SUCCESSION_WAIT)
    assert federation.lost
    assert federation.stop_reason == ("master 0 died and no worker took its place: "
                                      "continue with --resume")


def root_of_2(tmp_path, channel):
    """Root of 2 masters (world ranks 0-2 and 3-5)."""
    root = Federation(channel, index=0, masters=2, out=tmp_path, epoch=new_epoch(),
                      world_ranks=groups(6, 2), execution_timeout=1.0)
    root.open(ManualClock())
    return root


def test_root_withdraws_at_once_a_master_whose_group_has_no_rank_left(tmp_path):
    """(test_withdrawal.py follows what root does then.)"""
    root = root_of_2(tmp_path, RecordingChannel(failed={3, 4, 5}))
    root._masters_died()
    assert not root.roster.awaiting  # no successor is waited for
    assert set(root.reclaiming) == {1} and not root.lost
    # A successor's claim delivered after its death (it died inside its takeover): void.
    late = Successor(1, [Death("rank 3 (pid 9 on vm)", 1.0, 0.1)])
    root._on_message(own_master(), Incoming(4, Tag.SUCCESSOR, late), 2.0)
    assert root.roster.world_of[1] == 3 and 1 in root.roster.dead
    assert not root.roster.successions and set(root.reclaiming) == {1}


def test_a_withdrawn_master_that_dies_is_no_loss_and_root_stops_waiting_for_it(tmp_path):
    root = root_of_2(tmp_path, RecordingChannel(failed={3, 4, 5}))
    (root.directory / "withdrawn-1").touch()  # on record before root read it
    root._masters_died()
    assert not root.lost and not root.stop_reason and not root.roster.awaiting
    assert [(f["master_index"], f["failed"], f["master"]) for f in root.roster.successions] \
        == [(1, ["rank 3"], "withdrawn")]  # in the summary's failures
    root.coordinator.on_status(0, ControlStatus(1, idle=True), 0.0)  # master 1 is not waited for
    assert [type(message) for _, message in root.coordinator.tick(QUIESCENCE_WINDOW)] \
        == [Prepare]


def test_the_first_masters_group_gone_after_it_withdrew_stops_the_campaign(tmp_path):
    channel = RecordingChannel(failed={0, 1, 2})
    federation = successor_of_master_1(tmp_path, channel)
    (federation.directory / "withdrawn-0").touch()
    federation._masters_died()
    assert federation.lost and not federation.heir
    assert "master 0 died and no worker of its is left" in federation.stop_reason


def masters_of_3(tmp_path, failed):
    """Masters 1 and 2 of 3 (world ranks 0-1, 2-3 and 4-5), MPI's dead as given."""
    epoch = new_epoch()
    made = []
    for index in (1, 2):
        federation = Federation(RecordingChannel(failed=failed), index=index, masters=3,
                                out=tmp_path, epoch=epoch, world_ranks=groups(6, 3),
                                execution_timeout=1.0)
        federation.open(ManualClock())
        made.append(federation)
    return made


def test_the_first_masters_whole_group_gone_the_next_group_with_a_living_rank_is_heir(
        tmp_path):
    first, second = masters_of_3(tmp_path, failed={0, 1})
    for federation in (first, second):
        federation._masters_died()
        assert not federation.lost
    assert first.heir and not second.heir
    assert 0 in second.roster.awaiting  # it waits for the heir as for a successor
    # Master 1's group dies too before it took the place: master 2 is the heir then.
    _, second = masters_of_3(tmp_path / "again", failed={0, 1, 2, 3})
    second._masters_died()
    assert second.heir and not second.lost


def test_a_master_of_another_group_may_take_the_first_masters_place_once_its_group_is_gone():
    roster = Roster(groups(6, 3))
    roster.dead.add(0)
    heir = Successor(0, [Death("ranks 0-1 (the first master's whole group)", 1.0, 0.1)])
    assert roster.vet(2, heir, root=False, failed={0}) is Claim.INVALID  # rank 1 lives
    assert roster.vet(1, heir, root=False, failed={0}) is Claim.TAKEN  # a worker of it
    assert roster.vet(2, heir, root=False, failed={0, 1}) is Claim.TAKEN
    assert roster.vet(5, heir, root=False, failed={0, 1}) is Claim.TAKEN  # a successor of 2
    assert roster.vet(2, Successor(1, []), root=False, failed={0, 1}) is Claim.INVALID


def test_a_new_first_master_learns_from_the_record_of_the_masters_that_closed(tmp_path):
    """Their farewell and their STOP went to the dead root: a master that stopped early
    stops the campaign, as its STOP would have."""
    root = Federation(RecordingChannel(failed={0}), index=0, masters=3, out=tmp_path,
                      epoch=new_epoch(), world_ranks=groups(9, 3), execution_timeout=1.0)
    root.open(ManualClock())
    root.record.farewell(1, {"executions": 4}, None)
    root.inherit_root()
    assert root.roster.farewells == {1} and root.figures[1] == {"executions": 4}
    assert not root.stop_reason
    root.record.farewell(2, {"executions": 2}, ("OUT refused writes", False))
    root.check_farewells(0.5)
    assert root.stop_reason == "master 2 stopped: OUT refused writes" and not root.lost
    assert root.roster.farewells == {1, 2} and root.final == {1, 2}
