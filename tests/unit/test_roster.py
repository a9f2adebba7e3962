"""The first master's view of where the other masters are and which are gone (roster.py)."""

from __future__ import annotations

from symcc_mpi.federation.roster import SUCCESSION_WAIT, Claim, Roster
from symcc_mpi.wire.protocol import Death, Successor

GROUPS = [range(0, 3), range(3, 6), range(6, 9)]  # masters at world ranks 0, 3 and 6


def test_a_dead_master_is_awaited_then_given_up_and_a_farewell_is_no_death():
    roster = Roster(GROUPS)
    roster.farewells.add(2)
    assert roster.died({3, 4, 6}, now=10.0, awaits=True) == [1]  # 4 a worker; 2 said farewell
    assert roster.died({3}, now=11.0, awaits=True) == []  # known already
    assert roster.not_done((1, 2)) == {1}  # may still be replaced
    assert roster.overdue(10.0 + SUCCESSION_WAIT - 1) == []
    assert roster.overdue(10.0 + SUCCESSION_WAIT) == [1]
    assert roster.not_done((1, 2)) == set()


def test_only_a_rank_of_the_dead_masters_group_takes_its_place():
    roster = Roster(GROUPS)
    news = Successor(1, [Death("rank 3 (pid 9 on vm)", 5.0, 0.1)])
    assert roster.vet(4, news) is Claim.LIVES
    roster.died({3}, now=5.0, awaits=True)
    assert roster.vet(7, news) is Claim.INVALID  # master 2's group
    assert roster.vet(3, news) is Claim.INVALID  # the dead one itself
    assert roster.vet(4, Successor(0)) is Claim.INVALID  # the first master's place
    assert roster.vet(4, news) is Claim.TAKEN
    roster.replace(4, news)
    assert roster.world_of[1] == 4 and roster.index_of(4) == 1 and roster.index_of(3) is None
    assert not roster.dead and not roster.awaiting
    roster.replace(4, news)  # told again: on record once
    assert [s["failed"] for s in roster.successions] == [["rank 3 (pid 9 on vm)"]]


def test_the_last_rank_of_a_group_ends_the_wait_once():
    roster = Roster(GROUPS)
    roster.died({3}, now=5.0, awaits=True)
    alone = Successor(1, [Death("rank 3 (pid 9 on vm)", 5.0, 0.1)], alone=True)
    assert roster.vet(5, alone) is Claim.ALONE
    assert roster.vet(5, alone) is Claim.LATE
    assert roster.not_done((1, 2)) == {2}
