"""F311 target-group lease table against an in-memory model: three masters on one directory,
overlapping groups, heartbeats, releases, expiry and failed writes."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule

from symcc_mpi.durable.atomic import write_durable
from symcc_mpi.durable.clock import ManualClock
from symcc_mpi.federation.target_leases import FencedTargetLeaseTable
from symcc_mpi.scheduling.splitting import MAX_GROUP

TARGETS = [1, 2, 3, 4, 5, 6]
TTLS = [10.0, 10.0, 4.0]  # masters may disagree on TTL: each record carries its own expiry
GROUPS = st.lists(st.sampled_from(TARGETS + [0, -3]), min_size=1, max_size=4).filter(
    lambda targets: any(t > 0 for t in targets))
NEVER_ISSUED = "m9:0:0:0"



def group_of(members) -> tuple[int, ...]:
    """The group a claim of `members` covers: positive targets, first occurrence, at most
    MAX_GROUP."""
    return tuple(dict.fromkeys(t for t in members if t > 0))[:MAX_GROUP]

class ArmedWrite:
    """A table's `write`: when armed, the `fail_at`-th write from then on fails, before or
    after its replace (as a failed directory fsync would)."""

    def __init__(self):
        self.fail_at: int | None = None
        self.after_replace = False
        self.calls = 0

    def arm(self, fail_at: int, after_replace: bool) -> None:
        self.fail_at, self.after_replace, self.calls = fail_at, after_replace, 0

    def __call__(self, path: Path, data: bytes) -> None:
        self.calls += 1
        failing = self.calls == self.fail_at
        if failing and not self.after_replace:
            raise OSError(5, "injected write failure", str(path))
        write_durable(path, data, fsync=False)
        if failing:
            raise OSError(5, "injected failure after replace", str(path))


@dataclass(frozen=True)
class Held:
    token: str
    owner: str
    worker: int
    group: tuple[int, ...]
    expires: float
    attempts: int
    steals: int


class TargetLeaseMachine(RuleBasedStateMachine):
    tokens = Bundle("tokens")

    def __init__(self):
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="target-leases-"))
        self.clock = ManualClock()
        self.writes = [ArmedWrite() for _ in TTLS]
        self.tables = [self._open(m) for m in range(len(TTLS))]
        self.model: dict[int, Held] = {}
        self.claims: dict[str, tuple[int, ...]] = {}  # every token won -> its group
        self.lost: dict[str, set[int]] = {}  # token -> members released or taken over

    def _open(self, m: int) -> FencedTargetLeaseTable:
        return FencedTargetLeaseTable(self.dir, owner=f"m{m}", ttl=TTLS[m], shards=4,
                                      lock_timeout=0, clock=self.clock, fsync=False,
                                      sleep=self.clock.advance, write=self.writes[m])

    def teardown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def _disk(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in (self.dir / "records").glob("*/*.json")}

    def _claimable(self, group: tuple[int, ...]) -> bool:
        now = self.clock.time()
        return all(t not in self.model or now >= self.model[t].expires for t in group)

    def _won(self, m: int, group: tuple[int, ...], worker: int, token: str) -> None:
        assert token not in self.claims
        assert token.startswith(f"m{m}:{worker}:{os.getpid()}:")
        self.claims[token] = group
        self.lost[token] = set()
        for t in group:
            old = self.model.get(t)
            if old is not None:
                self.lost[old.token].add(t)
            self.model[t] = Held(token, f"m{m}", worker, group, self.clock.time() + TTLS[m],
                                 old.attempts + 1 if old else 1, old.steals + 1 if old else 0)

    @initialize(target=tokens)
    def a_token_never_issued(self):
        return NEVER_ISSUED

    @rule(target=tokens, m=st.integers(0, 2), members=GROUPS, worker=st.integers(0, 3))
    def claim(self, m, members, worker):
        group = group_of(members)
        expect, before = self._claimable(group), self._disk()
        token = self.tables[m].claim_group(members, worker=worker)
        assert (token is not None) == expect
        if token is None:
            assert self._disk() == before  # a refused claim wrote nothing
            return NEVER_ISSUED
        self._won(m, group, worker, token)
        return token

    @rule(target=tokens, m=st.integers(0, 2), members=GROUPS, worker=st.integers(0, 3),
          fail_at=st.integers(1, 4), after_replace=st.booleans())
    def claim_with_a_failing_write(self, m, members, worker, fail_at, after_replace):
        """F311 §4 step 5: a failed member write leaves every member as it was."""
        group = group_of(members)
        expect, before = self._claimable(group), self._disk()
        self.writes[m].arm(fail_at, after_replace)
        try:
            if expect and fail_at <= len(group):
                with pytest.raises(OSError, match="injected"):
                    self.tables[m].claim_group(members, worker=worker)
                assert self._disk() == before
                return NEVER_ISSUED
            token = self.tables[m].claim_group(members, worker=worker)
        finally:
            self.writes[m].fail_at = None
        assert (token is not None) == expect
        if token is None:
            assert self.writes[m].calls == 0 and self._disk() == before
            return NEVER_ISSUED
        self._won(m, group, worker, token)
        return token

    @rule(m=st.integers(0, 2), token=tokens, members=GROUPS)
    def heartbeat(self, m, token, members):
        group = group_of(members)
        mine = [t for t in group if t in self.model and self.model[t].token == token]
        assert self.tables[m].heartbeat(token, members) == (len(mine) == len(group))
        for t in mine:
            self.model[t] = replace(self.model[t], expires=self.clock.time() + TTLS[m])

    @rule(m=st.integers(0, 2), token=tokens, members=GROUPS)
    def release(self, m, token, members):
        group = group_of(members)
        mine = [t for t in group if t in self.model and self.model[t].token == token]
        before = self._disk()
        assert self.tables[m].release(token, members) == len(mine)
        after = self._disk()
        for name, data in before.items():
            if not any(name.startswith(self.tables[m].path(t).stem) for t in mine):
                assert after.get(name) == data  # nothing else, a newer owner's least of all
        for t in mine:
            del self.model[t]
            self.lost[token].add(t)

    @rule(seconds=st.sampled_from([1.0, 3.0, 5.0, 11.0]))
    def advance(self, seconds):
        self.clock.advance(seconds)

    @rule(m=st.integers(0, 2))
    def reopen(self, m):
        self.tables[m] = self._open(m)

    @invariant()
    def disk_agrees_with_model(self):
        for t in TARGETS:
            record = self.tables[0].read(t)
            want = self.model.get(t)
            if want is None:
                assert record is None
                continue
            got = Held(record.token, record.owner, record.worker, record.group, record.expires,
                       record.attempts, record.steals)
            assert got == want and record.target == t

    @invariant()
    def every_claim_holds_every_member_it_has_not_lost(self):
        holders: dict[int, set[str]] = {}
        for token, group in self.claims.items():
            for t in set(group) - self.lost[token]:
                assert self.tables[1].read(t).token == token
                holders.setdefault(t, set()).add(token)
        assert all(len(tokens) == 1 for tokens in holders.values())  # one holder per target

    @invariant()
    def no_litter(self):
        for directory, _, names in os.walk(self.dir / "records"):
            assert not [n for n in names if n.startswith(".tmp-")], directory
        assert os.listdir(self.dir / "locks") == []


TestTargetLeaseMachine = TargetLeaseMachine.TestCase
TestTargetLeaseMachine.settings = settings(
    max_examples=40, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
