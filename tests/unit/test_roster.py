"""A master's view of where the masters it talks to are and which are gone (roster.py)."""

from __future__ import annotations

from symcc_mpi.federation.roster import SUCCESSION_WAIT, Claim, Roster
from symcc_mpi.wire.protocol import Death, Successor

GROUPS = [range(0, 3), range(3, 6), range(6, 9)]  # masters at world ranks 0, 3 and 6


def test_a_dead_master_is_awaited_then_given_up_and_a_farewell_is_no_death():
    roster = Roster(GROUPS)
    roster.farewells.add(2)
    assert roster.died({3, 4, 6}, now=10.0, awaits=(1, 2)) == [1]  # 4 a worker; 2 said farewell
    assert roster.died({3}, now=11.0, awaits=(1, 2)) == []  # known already
    assert roster.not_done((1, 2)) == {1}  # may still be replaced
    assert roster.overdue(10.0 + SUCCESSION_WAIT - 1) == []
    assert roster.overdue(10.0 + SUCCESSION_WAIT) == [1]
    assert roster.not_done((1, 2)) == set()


def test_only_a_rank_of_the_dead_masters_group_takes_its_place():
    roster = Roster(GROUPS)
    news = Successor(1, [Death("rank 3 (pid 9 on vm)", 5.0, 0.1)])
    assert roster.vet(4, news, root=True) is Claim.LIVES
    roster.died({3}, now=5.0, awaits=(1, 2))
    assert roster.vet(7, news, root=True) is Claim.INVALID  # master 2's group
    assert roster.vet(3, news, root=True) is Claim.INVALID  # the dead one itself
    assert roster.vet(4, Successor(0), root=True) is Claim.INVALID  # the first master's place
    assert roster.vet(4, news, root=True) is Claim.TAKEN
    roster.replace(4, news)
    assert roster.world_of[1] == 4 and roster.index_of(4) == 1 and roster.index_of(3) is None
    assert not roster.dead and not roster.awaiting
    roster.replace(4, news)  # told again: on record once
    assert [s["failed"] for s in roster.successions] == [["rank 3 (pid 9 on vm)"]]


def test_a_master_other_than_root_awaits_only_the_first_masters_successor():
    roster = Roster(GROUPS)
    assert roster.died({0, 6}, now=5.0, awaits=(0,)) == [0, 2]
    assert set(roster.awaiting) == {0}  # master 2's successor is root's business
    news = Successor(0, [Death("rank 0 (pid 7 on vm)", 5.0, 0.1)])
    assert roster.vet(7, Successor(2), root=False) is Claim.INVALID
    assert roster.vet(4, news, root=False) is Claim.INVALID  # not of the first group
    assert roster.vet(1, news, root=True) is Claim.INVALID  # root heeds no root succession
    assert roster.vet(1, news, root=False) is Claim.TAKEN
    roster.replace(1, news)
    assert roster.world_of[0] == 1 and roster.index_of(1) == 0 and 0 not in roster.awaiting


def test_a_new_root_finds_each_master_at_its_groups_lowest_living_rank():
    roster = Roster(GROUPS)
    # Master 1 died and rank 4 took its place, unknown to the new root; group 2 is gone.
    assert roster.locate({0, 3, 6, 7, 8}, range(1, 3), now=5.0) == [2]
    assert roster.world_of[1] == 4 and 2 in roster.dead and 1 not in roster.dead
    # Awaited until it says so: rank 4 may have ended after a STOP, and nobody reports it.
    assert roster.awaiting == {1: 5.0 + SUCCESSION_WAIT}
    news = Successor(1, [Death("rank 3 (pid 9 on vm)", 5.0, 0.1)])
    # Rank 4's word is a takeover all the same: what a new root owes a successor (a STOP
    # once the end is decided) is owed it; told again, it is news no more.
    assert roster.vet(4, news, root=True) is Claim.TAKEN
    roster.replace(4, news)
    assert [s["master_index"] for s in roster.successions] == [1]
    assert roster.vet(4, news, root=True) is Claim.KNOWN and not roster.awaiting
    assert roster.locate({0}, (0,), now=6.0) == [] and roster.world_of[0] == 1


def test_a_located_successor_that_never_speaks_is_overdue():
    roster = Roster(GROUPS)
    roster.locate({0}, (0,), now=5.0)
    assert roster.overdue(5.0 + SUCCESSION_WAIT - 0.1) == []
    assert roster.overdue(5.0 + SUCCESSION_WAIT) == [0] and not roster.awaiting
