"""F311 target lease table against an in-memory model: group claims, expiry, faults, corruption."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule
from test_work_leases import FaultyIO

from symcc_mpi.durable.atomic import write_durable
from symcc_mpi.durable.clock import ManualClock
from symcc_mpi.durable.leases import (
    CorruptRecord,
    FencedTargetLeaseTable,
    TargetGroupClaim,
    normalize_group,
    target_id,
)

TARGETS = [11, 22, 33, 44, 55, 66]
TTLS = [10.0, 10.0, 4.0]
GROUPS = st.lists(st.sampled_from(TARGETS), min_size=1, max_size=4)


@dataclass(frozen=True)
class Member:
    token: str
    owner: str
    group: tuple[int, ...]
    expires: float
    attempts: int
    steals: int


class FailOnNthWrite(FaultyIO):
    """Fail the n-th write from now (0 = the next one), in `before` or `after` mode."""

    def arm_nth(self, n: int, mode: str) -> None:
        self.countdown, self.mode = n, mode

    def _fault(self):
        if getattr(self, "countdown", None) is None:
            return None
        if self.countdown == 0:
            self.countdown = None
            return self.mode
        self.countdown -= 1
        return None


class TargetLeaseMachine(RuleBasedStateMachine):
    claims = Bundle("claims")

    def __init__(self):
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="target-leases-"))
        self.clock = ManualClock()
        self.io = [FailOnNthWrite() for _ in TTLS]
        self.tables = [self._open(m) for m in range(len(TTLS))]
        self.model: dict[int, Member] = {}
        self.issued: set[str] = set()
        self.partial: set[str] = set()  # tokens left partial on purpose: corrupted, half released

    def _open(self, m: int) -> FencedTargetLeaseTable:
        return FencedTargetLeaseTable(self.dir, f"m{m}", ttl=TTLS[m], shards=4, lock_timeout=0,
                                      clock=self.clock, sleep=self.clock.advance, fsync=False,
                                      writer=self.io[m].write, remover=self.io[m].remove)

    def teardown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    @initialize(target=claims)
    def a_stale_claim(self):
        return TargetGroupClaim("m9::0:0:never-issued", (11, 22), 0.0)

    def _free(self, group) -> bool:
        now = self.clock.time()
        return all(t not in self.model or now >= self.model[t].expires for t in group)

    @rule(target=claims, m=st.integers(0, 2), members=GROUPS, worker=st.sampled_from(["", "w1"]))
    def claim_group(self, m, members, worker):
        group = normalize_group(members)
        expect = self._free(group)
        got = self.tables[m].claim_group(members, worker=worker, payload={"seed": "s"})
        assert (got is not None) == expect
        if got is None:
            return TargetGroupClaim("m9::0:0:refused", group, 0.0)
        assert got.group == group and got.token not in self.issued
        assert set(got.taken_over) == {t for t in group if t in self.model}
        self.issued.add(got.token)
        for t in group:
            old = self.model.get(t)
            self.model[t] = Member(got.token, f"m{m}", group, self.clock.time() + TTLS[m],
                                   old.attempts + 1 if old else 1, old.steals + 1 if old else 0)
        return got

    @rule(m=st.integers(0, 2), claim=claims)
    def heartbeat(self, m, claim):
        expect = all(self.model.get(t) and self.model[t].token == claim.token
                     for t in claim.group)
        assert self.tables[m].heartbeat(claim.group, claim.token) == expect
        if expect:
            for t in claim.group:
                self.model[t] = replace(self.model[t], expires=self.clock.time() + TTLS[m])

    @rule(m=st.integers(0, 2), claim=claims, extra=st.sampled_from([(), (66,)]))
    def release(self, m, claim, extra):
        group = normalize_group(claim.group + extra)
        mine = [t for t in group if self.model.get(t) and self.model[t].token == claim.token]
        assert self.tables[m].release(group, claim.token) == len(mine)
        for t in mine:
            del self.model[t]

    @rule(seconds=st.sampled_from([1.0, 3.0, 5.0, 11.0]))
    def advance(self, seconds):
        self.clock.advance(seconds)

    @rule(m=st.integers(0, 2))
    def reopen(self, m):
        self.tables[m] = self._open(m)

    @rule(m=st.integers(0, 2), members=GROUPS, nth=st.integers(0, 3),
          mode=st.sampled_from(["before", "after"]))
    def failing_claim(self, m, members, nth, mode):
        """F311 §4 step 5: a member's write fails; the whole claim leaves the table as it was."""
        group = normalize_group(members)
        self.io[m].arm_nth(nth, mode)
        if self._free(group) and nth < len(group):
            with pytest.raises(OSError, match="injected"):
                self.tables[m].claim_group(group)
        else:
            got = self.tables[m].claim_group(group)
            self.io[m].arm_nth(None, mode)
            assert (got is not None) == self._free(group)
            if got is not None:  # the fault was armed past the group: release it by hand
                assert self.tables[m].release(group, got.token) == len(group)
                for t in group:
                    self.model.pop(t, None)
        self.io[m].arm_nth(None, mode)

    @rule(m=st.integers(0, 2), claim=claims, mode=st.sampled_from(["before", "after"]))
    def failing_release(self, m, claim, mode):
        mine = [t for t in claim.group
                if self.model.get(t) and self.model[t].token == claim.token]
        self.io[m].arm_nth(0, mode)
        if mine:
            with pytest.raises(OSError, match="injected"):
                self.tables[m].release(claim.group, claim.token)
            # the other members were still released; the failed one was left or put back
            on_disk = {t for t in mine if self.tables[0].read(t) is not None}
            assert len(on_disk) == 1
            for t in set(mine) - on_disk:
                del self.model[t]
            self.partial.add(claim.token)
        else:
            assert self.tables[m].release(claim.group, claim.token) == 0
        self.io[m].arm_nth(None, mode)

    @rule(data=st.data(), garbage=st.sampled_from([b"", b"{", b'{"schema": 1}', b"\xff" * 3]))
    def corrupt_member(self, data, garbage):
        if not self.model:
            return
        t = data.draw(st.sampled_from(sorted(self.model)))
        path = self.tables[0].path(t)
        path.write_bytes(garbage)
        others = [u for u in TARGETS if u != t][:2]
        with pytest.raises(CorruptRecord) as raised:
            self.tables[2].claim_group([*others, t])
        assert raised.value.path == path and raised.value.quarantined.read_bytes() == garbage
        self.partial.add(self.model.pop(t).token)

    @invariant()
    def disk_agrees_with_model(self):
        for t in TARGETS:
            rec = self.tables[0].read(t)
            want = self.model.get(t)
            if want is None:
                assert rec is None
                continue
            got = Member(rec.token, rec.owner, rec.group, rec.expires, rec.attempts, rec.steals)
            assert got == want
            assert rec.target_id == target_id(t)

    @invariant()
    def live_leases_are_whole_groups(self):
        # F311 §8: a live claim holds every member of its group (all-or-nothing).
        now = self.clock.time()
        for member in self.model.values():
            if now < member.expires and member.token not in self.partial:
                assert all(self.model.get(u) and self.model[u].token == member.token
                           for u in member.group)

    @invariant()
    def no_litter(self):
        for tree in ("records", "locks"):
            for directory, _, names in os.walk(self.dir / tree):
                assert not [n for n in names if n.startswith(".tmp-")], directory
                assert not (tree == "locks" and names), directory


TestTargetLeaseMachine = TargetLeaseMachine.TestCase
TestTargetLeaseMachine.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])


# --- examples beside the machine ----------------------------------------------------------------


def _tables(path, clock, ttl=10.0, **kw):
    return [FencedTargetLeaseTable(path, f"m{m}", ttl=ttl, clock=clock, fsync=False, **kw)
            for m in range(2)]


def test_target_id_is_the_spec_digest():
    assert target_id(88) == hashlib.sha256(b"target:88").hexdigest()
    for bad in (0, -1, True, 1.0, "88"):
        with pytest.raises(ValueError):
            target_id(bad)


def test_group_is_normalised_and_capped():
    assert normalize_group([22, 11, 22, 33, 11]) == (22, 11, 33)
    assert len(normalize_group(range(1, 200))) == 64
    with pytest.raises(ValueError):
        normalize_group([])
    with pytest.raises(ValueError):
        normalize_group([5, 0])


def test_crossing_groups_conflict_without_partial_records(tmp_path):
    # F311 §10 regression 1: {11,22} then {22,33} from another table; 33 is never written.
    a, b = _tables(tmp_path, ManualClock())
    got = a.claim_group([11, 22], worker="w3", payload={"seed": "A"})
    assert got is not None
    assert b.claim_group([22, 33]) is None
    assert b.read(33) is None
    assert b.claim_group([33, 44]) is not None


def test_expiry_hands_over_and_the_old_token_deletes_nothing(tmp_path):
    # F311 §10 regression 2.
    clock = ManualClock()
    a, b = _tables(tmp_path, clock)
    old = a.claim_group([77, 88])
    clock.advance(6)
    assert a.heartbeat([77, 88], old.token)
    clock.advance(6)
    assert b.claim_group([88, 99]) is None  # the heartbeat extended it
    clock.advance(5)
    new = b.claim_group([88, 99])
    assert new.taken_over == (88,)
    assert not a.heartbeat([77, 88], old.token)
    assert a.release([77, 88], old.token) == 1  # only 77, still its own leftover
    assert b.read(88).token == new.token and b.read(77) is None
    assert b.release([88, 99], new.token) == 2


def test_second_member_write_failure_rolls_back_the_first(tmp_path):
    # F311 §10 regression 3, with a taken-over (expired) first member to restore, not delete.
    clock = ManualClock()
    calls = []

    def second_fails(path, data):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        write_durable(path, data, fsync=False)

    a, _ = _tables(tmp_path, clock)
    group = sorted([5, 6, 7], key=target_id)
    stale = a.claim_group(group[:1])
    clock.advance(11)
    before = a.path(group[0]).read_bytes()
    b = FencedTargetLeaseTable(tmp_path, "m1", ttl=10.0, clock=clock, fsync=False,
                               writer=second_fails)
    with pytest.raises(OSError, match="No space"):
        b.claim_group(group)
    assert a.path(group[0]).read_bytes() == before
    assert a.read(group[1]) is None and a.read(group[2]) is None
    assert a.release(group[:1], stale.token) == 1


def test_bad_arguments(tmp_path):
    a, _ = _tables(tmp_path, ManualClock())
    with pytest.raises(ValueError):
        a.claim_group([1], payload=object())
    with pytest.raises(ValueError):
        a.claim_group([1], worker=3)
