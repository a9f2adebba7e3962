"""WorkLeases, the master's handle on the table: fences, heartbeat rate, recovery pacing,
figures."""

from __future__ import annotations

import hashlib

from symcc_mpi.durable.clock import ManualClock
from symcc_mpi.federation.leases import FencedWorkLeaseTable
from symcc_mpi.federation.master_leases import WorkLeases

IDS = [hashlib.sha256(f"input-{i}".encode()).hexdigest() for i in range(8)]


def _masters(tmp_path, ttl=30.0, count=2):
    clock = ManualClock()
    tables = [FencedWorkLeaseTable(tmp_path, f"m{m}", ttl=ttl, lock_timeout=1, shards=4,
                                   clock=clock, sleep=clock.advance) for m in range(count)]
    return clock, [WorkLeases(table) for table in tables]


def _commit(leases: WorkLeases, digest: str, token: str) -> bool:
    committing, _ = leases.fence({digest: token})
    return digest in committing


def test_claims_are_grouped_and_exclusive(tmp_path):
    _, (a, b) = _masters(tmp_path)
    won = a.claim(IDS[:5])
    assert sorted(won) == sorted(IDS[:5]) and len(set(won.values())) == 5
    assert sorted(b.claim(IDS[3:])) == sorted(IDS[5:])
    assert a.statistics().claims == 5 and b.statistics().refused == 2


def test_heartbeats_write_at_most_once_per_interval(tmp_path):
    clock, (a, _) = _masters(tmp_path, ttl=30.0)
    assert a.heartbeat_interval == 10.0
    tokens = a.claim(IDS[:3])
    for _ in range(20):  # a master ticking every 0.25 s for 5 s: nothing is due yet
        assert a.heartbeat(tokens) == []
        clock.advance(0.25)
    assert a.statistics().heartbeats == 0
    clock.advance(5)
    assert a.heartbeat(tokens) == [] and a.heartbeat(tokens) == []
    assert a.statistics().heartbeats == 3  # one write per token
    clock.advance(25)  # past the claim's TTL, but heartbeats kept the leases alive
    assert a.heartbeat(tokens) == []
    assert a.statistics().heartbeats == 6


def test_the_interval_is_capped_at_30_seconds(tmp_path):
    _, (a,) = _masters(tmp_path, ttl=600.0, count=1)
    assert a.heartbeat_interval == 30.0


def test_a_lease_taken_over_is_reported_lost_and_its_result_is_stale(tmp_path):
    clock, (a, b) = _masters(tmp_path)
    tokens = a.claim(IDS[:2])
    clock.advance(31)  # a stalled past its TTL without heartbeating
    recovered = b.recover_expired(limit=1)
    ((taken, new_token),) = recovered.items()
    (kept,) = set(IDS[:2]) - {taken}
    assert a.heartbeat(tokens) == [taken]  # `kept` expired but no one took it: still a's
    assert not _commit(a, taken, tokens[taken])
    assert _commit(a, kept, tokens[kept]) and a.complete(kept, tokens[kept])
    assert _commit(b, taken, new_token) and b.complete(taken, new_token)
    ours, theirs = a.statistics(), b.statistics()
    assert (ours.claims, ours.expiries, ours.stale_results, ours.completed) == (2, 1, 1, 1)
    assert (theirs.claims, theirs.steals, theirs.completed) == (1, 1, 1)
    assert a.heartbeat(tokens) == []  # finished and lost tokens are no longer beaten


def test_committing_and_abandoned_leases_are_not_heartbeaten(tmp_path):
    clock, (a, b) = _masters(tmp_path)
    tokens = a.claim(IDS[:2])
    assert _commit(a, IDS[0], tokens[IDS[0]])
    assert a.abandon(IDS[1], tokens[IDS[1]])
    clock.advance(600)
    assert a.heartbeat(tokens) == [] and a.statistics().heartbeats == 0
    assert b.recover_expired(limit=10) == {}  # committing is never taken over by age
    assert IDS[1] in b.claim([IDS[1]])  # abandoned: claimable afresh
    assert a.statistics().abandoned == 1


def test_recovery_scans_are_paced_unless_a_rescan_is_asked(tmp_path):
    clock, (a, b) = _masters(tmp_path)
    a.claim(IDS[:4])
    clock.advance(25)
    assert b.recover_expired(limit=10) == {}  # nothing expired yet: next scan in 10 s
    clock.advance(6)
    assert b.recover_expired(limit=10) == {}  # expired now, but the scan is paced
    assert len(b.recover_expired(limit=3, rescan=True)) == 3
    assert len(b.recover_expired(limit=3)) == 1  # the last scan hit its limit: scan again
    assert b.recover_expired(limit=3) == {}
    assert b.recover_expired(limit=0, rescan=True) == {}


def test_a_corrupt_line_is_counted_and_changes_nothing(tmp_path):
    clock, (a, _) = _masters(tmp_path)
    tokens = a.claim(IDS[:2])
    shard = FencedWorkLeaseTable(tmp_path, "m9", ttl=30, lock_timeout=1).shard_of(IDS[0])
    with open(tmp_path / "logs" / f"{shard}.log", "ab") as log:
        log.write(b"[not a record\n")
    clock.advance(10)
    assert a.heartbeat(tokens) == []
    assert _commit(a, IDS[0], tokens[IDS[0]])
    assert a.statistics().corrupt_lines == 1


def test_a_fence_carries_the_claims_ahead_and_the_completions_in_one_write(tmp_path):
    _, (a, b) = _masters(tmp_path, count=2)
    table = FencedWorkLeaseTable(tmp_path, "m0", ttl=30, lock_timeout=1, shards=4)
    many = [hashlib.sha256(f"more-{i}".encode()).hexdigest() for i in range(64)]
    first, second, *ahead, later = [d for d in many if table.shard_of(d) == 0][:6]
    tokens = a.claim([first, second])
    assert _commit(a, first, tokens[first]) and a.complete(first, tokens[first])
    assert table.read(first).status == "committing"  # not written yet
    writes = a.statistics().writes
    committing, claimed = a.fence({second: tokens[second]}, ahead)
    assert committing == {second} and sorted(claimed) == sorted(ahead)
    assert a.statistics().writes == writes + 1  # the claims and the completion rode along
    assert table.read(first).status == "done"
    assert b.claim([second, *ahead]) == {} and b.recover_expired(limit=10) == {}
    assert a.complete(second, tokens[second]) and table.read(second).status == "committing"
    assert later in a.claim([later])  # the next write carries it
    assert table.read(second).status == "done" and a.statistics().writes == writes + 2
