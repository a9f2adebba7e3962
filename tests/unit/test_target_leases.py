"""F311's target-group lease table: the §10 table cases, heartbeat and release edges, corrupt
records, lock timeouts, and the pure functions beside it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from symcc_mpi.durable.atomic import write_durable
from symcc_mpi.durable.clock import ManualClock
from symcc_mpi.durable.locks import DirectoryLock, LockTimeout
from symcc_mpi.federation.shards import TableMismatch
from symcc_mpi.federation.target_leases import (
    FencedTargetLeaseTable,
    heartbeat_interval,
    target_id,
)


def _table(path: Path, owner: str = "m0", **options) -> FencedTargetLeaseTable:
    clock = options.setdefault("clock", ManualClock())
    options.setdefault("ttl", 30.0)
    options.setdefault("lock_timeout", 1.0)
    options.setdefault("sleep", clock.advance)
    options.setdefault("fsync", False)
    return FencedTargetLeaseTable(path, owner=owner, **options)


def _masters(path: Path, count: int = 2, **options):
    clock = ManualClock()
    return clock, [_table(path, f"m{m}", clock=clock, **options) for m in range(count)]


def _records(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (root / "records").glob("*/*.json")}


class FailingWrites:
    """A `write` that fails its `fail_at`-th call, before or after the replace."""

    def __init__(self, fail_at: int, after_replace: bool = False):
        self.fail_at = fail_at
        self.after_replace = after_replace
        self.calls = 0

    def __call__(self, path: Path, data: bytes) -> None:
        self.calls += 1
        failing = self.calls == self.fail_at
        if failing and not self.after_replace:
            raise OSError(5, "injected write failure", str(path))
        write_durable(path, data, fsync=False)
        if failing:
            raise OSError(5, "injected failure after replace", str(path))


# --- F311 §10 -----------------------------------------------------------------------------------


def test_f311_1_overlapping_groups_conflict_without_partial_records(tmp_path):
    _, (a, b) = _masters(tmp_path)
    token = a.claim_group([11, 22], worker=1)
    assert token is not None
    before = _records(tmp_path)
    assert b.claim_group([22, 33], worker=2) is None
    assert b.read(33) is None and not b.path(33).exists()
    assert _records(tmp_path) == before
    assert a.read(11).token == a.read(22).token == token
    assert b.statistics().conflicts == 1 and b.statistics().claims == 0
    assert b.claim_group([33], worker=2) is not None  # 33 itself was never held


def test_f311_2_heartbeat_extends_then_expired_group_is_taken_over_and_old_token_is_fenced(
        tmp_path):
    clock, (a, b) = _masters(tmp_path, ttl=10.0)
    old = a.claim_group([77, 88], worker=1)
    clock.advance(8)
    assert a.heartbeat(old, [77, 88])
    assert a.read(88).expires == clock.time() + 10
    clock.advance(8)  # 16 s after the claim: alive only thanks to the heartbeat
    assert b.claim_group([88, 99], worker=4) is None
    clock.advance(3)
    new = b.claim_group([88, 99], worker=4)
    assert new is not None and new != old
    record = b.read(88)
    assert (record.token, record.attempts, record.steals) == (new, 2, 1)
    assert record.group == (88, 99) and record.owner == "m1" and record.worker == 4
    assert not a.heartbeat(old, [77, 88])  # lost 88; 77, nobody's since, is extended
    assert a.read(88).token == new and a.read(77).token == old
    assert a.release(old, [77, 88]) == 1  # 77 only: nothing of the new owner's
    assert a.read(77) is None and b.read(88).token == new and b.read(99).token == new
    assert b.statistics().steals == 1 and a.statistics().releases == 1


def test_f311_3_failed_write_of_second_member_rolls_back_the_first(tmp_path):
    for after_replace in (False, True):
        root = tmp_path / f"after-{after_replace}"
        clock = ManualClock()
        failing = FailingWrites(fail_at=2, after_replace=after_replace)
        table = _table(root, clock=clock, write=failing)
        with pytest.raises(OSError, match="injected"):
            table.claim_group([11, 22], worker=1)
        assert _records(root) == {}
        assert table.statistics().write_failures == 1
        assert table.statistics().claims == 0
        assert os.listdir(root / "locks") == []
        other = _table(root, "m1", clock=clock)
        assert other.claim_group([11, 22], worker=2) is not None


def test_f311_3_rollback_restores_an_expired_record_taken_over(tmp_path):
    clock = ManualClock()
    healthy = _table(tmp_path, "m0", clock=clock, ttl=5.0)
    old = healthy.claim_group([11, 22], worker=1)
    clock.advance(6)
    before = _records(tmp_path)
    failing = _table(tmp_path, "m1", clock=clock, write=FailingWrites(fail_at=2))
    with pytest.raises(OSError, match="injected"):
        failing.claim_group([22, 11], worker=2)
    assert _records(tmp_path) == before  # the expired records are back, byte for byte
    assert healthy.heartbeat(old, [11, 22])  # and still the old holder's


def test_f311_8_heartbeat_interval_is_a_third_of_the_smaller_ttl_capped_at_30s():
    assert heartbeat_interval(120.0, 60.0) == 20.0
    assert heartbeat_interval(60.0, 120.0) == 20.0
    assert heartbeat_interval(600.0, 900.0) == 30.0
    assert heartbeat_interval(1.0, 300.0) == pytest.approx(1 / 3)
    assert heartbeat_interval(1, 1) <= 1 / 3
    for bad in (0, -1, float("nan"), float("inf"), True, "10"):
        with pytest.raises(ValueError):
            heartbeat_interval(bad, 10.0)
        with pytest.raises(ValueError):
            heartbeat_interval(10.0, bad)


# --- identity and locking -----------------------------------------------------------------------


def test_target_id_is_the_sha256_of_the_decimal_target():
    assert target_id(88) == hashlib.sha256(b"target:88").hexdigest()
    for bad in (True, "88", 8.0):
        with pytest.raises(ValueError):
            target_id(bad)


def test_locks_are_taken_in_target_id_order_and_released_in_reverse(tmp_path, monkeypatch):
    events = []
    real_acquire, real_release = DirectoryLock.acquire, DirectoryLock.release

    def acquire(lock):
        events.append(("acquire", lock.path.name))
        real_acquire(lock)

    def release(lock):
        events.append(("release", lock.path.name))
        real_release(lock)

    monkeypatch.setattr(DirectoryLock, "acquire", acquire)
    monkeypatch.setattr(DirectoryLock, "release", release)
    table = _table(tmp_path)
    group = [5, 4, 3, 2, 1]
    assert table.claim_group(group, worker=0) is not None
    names = sorted(f"{target_id(t)}.lock" for t in group)
    assert events == [("acquire", n) for n in names] + [("release", n) for n in reversed(names)]


def test_a_held_member_lock_times_out_fail_closed_and_releases_the_rest(tmp_path):
    clock = ManualClock()
    table = _table(tmp_path, clock=clock, lock_timeout=2.0)
    middle = sorted([1, 2, 3], key=target_id)[1]
    other_master = DirectoryLock(tmp_path / "locks" / f"{target_id(middle)}.lock", timeout=0)
    with other_master:
        with pytest.raises(LockTimeout):
            table.claim_group([1, 2, 3], worker=0)
        assert os.listdir(tmp_path / "locks") == [f"{target_id(middle)}.lock"]  # ours are gone
        with pytest.raises(LockTimeout):
            table.heartbeat("m0:0:1:1", [middle])
        with pytest.raises(LockTimeout):
            table.release("m0:0:1:1", [middle])
    assert clock.monotonic() == pytest.approx(6.0)  # three waits of 2 s, on the manual clock
    assert _records(tmp_path) == {}
    assert table.claim_group([1, 2, 3], worker=0) is not None


# --- heartbeat and release edges ----------------------------------------------------------------


def test_heartbeat_and_release_need_the_exact_current_token(tmp_path):
    clock, (a, b) = _masters(tmp_path, ttl=10.0)
    token = a.claim_group([1, 2], worker=3)
    for stale in ("", token + "x", token.replace("m0", "m1"), "m9:0:0:0"):
        assert not a.heartbeat(stale, [1, 2])
        assert a.release(stale, [1, 2]) == 0
    assert a.read(1).token == token and a.statistics().heartbeats == 0
    assert b.heartbeat(token, [1, 2])  # the token is the authority, not the object that claimed
    clock.advance(25)  # expired, but nobody took it over: still the holder's
    assert a.heartbeat(token, [1, 2]) and a.read(2).expires == clock.time() + 10


def test_heartbeat_of_a_group_partly_taken_over_extends_what_is_still_held(tmp_path):
    clock, (a, b) = _masters(tmp_path, ttl=10.0)
    token = a.claim_group([1, 2, 3], worker=0)
    clock.advance(11)
    newer = b.claim_group([2], worker=1)
    assert not a.heartbeat(token, [1, 2, 3])
    assert a.read(1).expires == a.read(3).expires == clock.time() + 10
    assert a.read(2).token == newer
    assert a.statistics().heartbeats == 2


def test_release_deletes_records_and_twice_deletes_nothing(tmp_path):
    _, (a, b) = _masters(tmp_path)
    token = a.claim_group([1, 2, 3], worker=0)
    assert a.release(token, [3, 2, 1, 1, 0, -5]) == 3  # repeats and non-positives ignored
    assert _records(tmp_path) == {}
    assert a.release(token, [1, 2, 3]) == 0 and not a.heartbeat(token, [1, 2, 3])
    assert b.claim_group([1, 2, 3], worker=1) is not None  # deleted, not done: claimable again
    assert b.read(1).attempts == 1
    stats = a.statistics()
    assert (stats.releases, stats.leased, stats.expired) == (3, 3, 0)


def test_release_of_part_of_a_group_leaves_the_rest_held(tmp_path):
    _, (a, b) = _masters(tmp_path)
    token = a.claim_group([1, 2], worker=0)
    assert a.release(token, [2]) == 1
    assert b.claim_group([1, 2], worker=1) is None
    assert b.claim_group([2], worker=1) is not None


def test_a_successor_releases_every_group_its_dead_predecessor_held(tmp_path):
    clock, (dead, other) = _masters(tmp_path)
    dead.claim_group([1, 2], worker=0)
    dead.claim_group([7], worker=1)
    other.claim_group([3], worker=0)
    clock.advance(-3600.0)  # the wall clock went back: the dead one's leases stay for an hour
    successor = _table(tmp_path, "m0", clock=clock)  # its name
    assert successor.release_owner("m0") == 3
    assert successor.claim_group([1, 2, 7], worker=0) is not None
    assert successor.claim_group([3], worker=1) is None  # another master's stays


def test_statistics_count_leased_and_expired_records_on_disk(tmp_path):
    clock, (a, b) = _masters(tmp_path, ttl=10.0)
    a.claim_group([1, 2], worker=0)
    clock.advance(5)
    b.claim_group([3], worker=0)
    clock.advance(6)
    stats = a.statistics()
    assert (stats.leased, stats.expired, stats.claims) == (1, 2, 1)


# --- corrupt records ----------------------------------------------------------------------------


@pytest.mark.parametrize("garbage", [b"", b"{", b"{}", b"[1]", b"\x00" * 9, "another target",
                                     "truncated", "outside its group"])
def test_a_corrupt_record_is_quarantined_and_read_as_absent(tmp_path, garbage):
    clock, (a, b) = _masters(tmp_path)
    token = a.claim_group([1, 2], worker=0)
    victim = a.path(1)
    if garbage == "another target":
        garbage = a.path(2).read_bytes()
    elif garbage == "truncated":
        garbage = victim.read_bytes()[:-20]
    elif garbage == "outside its group":
        garbage = victim.read_bytes().replace(b'"group":[1,2]', b'"group":[2]')
    victim.write_bytes(garbage)
    assert not a.heartbeat(token, [1, 2])  # the corrupt member no longer carries the token
    assert not victim.exists()
    (kept,) = (tmp_path / "quarantine").iterdir()
    assert kept.read_bytes() == garbage
    assert a.statistics().quarantined == 1
    assert b.claim_group([1], worker=1) is not None  # absent, so claimable
    assert b.claim_group([2], worker=1) is None  # the healthy member is untouched


def test_a_corrupt_record_that_cannot_be_moved_aside_refuses_its_group(tmp_path):
    _, (a, b) = _masters(tmp_path)
    a.path(1).write_bytes(b"{")
    (tmp_path / "quarantine").rmdir()
    (tmp_path / "quarantine").write_bytes(b"not a directory")
    assert b.claim_group([1, 2], worker=1) is None
    assert b.read(2) is None and a.path(1).read_bytes() == b"{"
    assert b.statistics().conflicts == 1


# --- arguments and the table directory ----------------------------------------------------------


def test_bad_arguments_are_rejected_before_anything_is_locked(tmp_path):
    table = _table(tmp_path)
    for group in ([], [0, -1], ["7"], [True], [1.5]):
        with pytest.raises(ValueError):
            table.claim_group(group, worker=0)
    for worker in (-1, True, "3"):
        with pytest.raises(ValueError):
            table.claim_group([1], worker=worker)
    for payload in ([1, 2], {"f": object()}):
        with pytest.raises(ValueError):
            table.claim_group([1], worker=0, payload=payload)
    with pytest.raises(ValueError):
        table.heartbeat("t", [])
    for options in ({"owner": ""}, {"ttl": 0}, {"ttl": float("inf")}, {"shards": 0},
                    {"lock_timeout": -1}):
        with pytest.raises(ValueError):
            _table(tmp_path, **options)
    assert _records(tmp_path) == {} and os.listdir(tmp_path / "locks") == []


def test_payload_and_group_order_are_kept_in_every_member(tmp_path):
    table = _table(tmp_path)
    payload = {"seed": "ab" * 32, "actions": [[3, "solve"]], "strategy": None}
    token = table.claim_group([9, 3, 0, 9, 5], worker=2, payload=payload)
    owner, worker, pid, time_ns = token.split(":")
    assert (owner, worker, int(pid)) == ("m0", "2", os.getpid()) and int(time_ns) > 0
    for target in (9, 3, 5):
        record = table.read(target)
        assert record.group == (9, 3, 5) and record.payload == payload
        assert record.claimed == table.clock.time() and record.expires == record.claimed + 30


def test_shard_count_is_fixed_by_the_creator(tmp_path):
    first = _table(tmp_path, shards=8)
    second = _table(tmp_path, "m1", shards=64, clock=first.clock)
    assert first.shards == second.shards == 8 and second.path(5) == first.path(5)
    token = first.claim_group([5], worker=0)
    assert second.claim_group([5], worker=0) is None and second.heartbeat(token, [5])


def test_a_foreign_table_directory_is_refused(tmp_path):
    (tmp_path / "table.json").write_text('{"schema": "symcc-work-lease-table-v1", "shards": 4}')
    with pytest.raises(TableMismatch):
        _table(tmp_path)


def test_a_dead_writers_temporary_is_swept_by_statistics(tmp_path):
    table = _table(tmp_path)
    table.claim_group([4], worker=0)
    debris = table.path(4).with_name(f".tmp-{table.path(4).name}.999999")
    debris.write_bytes(b"half a rec")
    assert table.statistics().leased == 1
    assert not debris.exists() and os.listdir(tmp_path / "locks") == []


def test_a_failed_heartbeat_write_keeps_the_old_expiry_and_raises(tmp_path):
    clock = ManualClock()
    claimer = _table(tmp_path, clock=clock, ttl=10.0)
    token = claimer.claim_group([1], worker=0)
    beater = _table(tmp_path, clock=clock, ttl=10.0, write=FailingWrites(1, after_replace=True))
    clock.advance(4)
    with pytest.raises(OSError, match="injected"):
        beater.heartbeat(token, [1])
    assert claimer.read(1).expires == clock.time() + 6  # restored under the lock
    assert beater.statistics().write_failures == 1
    assert beater.heartbeat(token, [1]) and claimer.read(1).expires == clock.time() + 10
