"""F320 work lease table against an in-memory model: several masters, expiry, grouped claims,
faults, corruption."""

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
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from symcc_mpi.config import (
    WORK_LEASE_SHARDS_ENV,
    WORK_LEASE_TTL_ENV,
    WORK_LOCK_ACQUIRE_TIMEOUT_ENV,
)
from symcc_mpi.durable.atomic import write_durable
from symcc_mpi.durable.clock import ManualClock
from symcc_mpi.federation.lease_config import LeaseConfig
from symcc_mpi.federation.leases import FencedWorkLeaseTable
from symcc_mpi.federation.shards import CorruptRecord, TableMismatch
from symcc_mpi.federation.work_leases import WorkLease

IDS = [hashlib.sha256(f"input-{i}".encode()).hexdigest() for i in range(6)]
TTLS = [10.0, 10.0, 4.0]  # masters may disagree on TTL: each record carries its own expiry


class FaultyIO:
    """The tables' writer/remover, failing the next call when armed.

    `before`: the OSError comes before anything reaches the disk; `after`: the file operation
    happened and then the error came (as a failed directory fsync would).
    """

    def __init__(self):
        self.armed: str | None = None
        self.calls = 0

    def _fault(self):
        mode, self.armed = self.armed, None
        return mode

    def write(self, path: Path, data: bytes) -> None:
        self.calls += 1
        mode = self._fault()
        if mode == "before":
            raise OSError(5, "injected write failure", str(path))
        write_durable(path, data, fsync=False)
        if mode == "after":
            raise OSError(5, "injected failure after replace", str(path))

    def remove(self, path: Path) -> None:
        self.calls += 1
        mode = self._fault()
        if mode == "before":
            raise OSError(5, "injected remove failure", str(path))
        path.unlink(missing_ok=True)
        if mode == "after":
            raise OSError(5, "injected failure after unlink", str(path))


@dataclass(frozen=True)
class Model:
    status: str
    owner: str
    token: str
    expires: float
    attempts: int
    steals: int


class WorkLeaseMachine(RuleBasedStateMachine):
    tokens = Bundle("tokens")

    def __init__(self):
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="work-leases-"))
        self.clock = ManualClock()
        self.io = [FaultyIO() for _ in TTLS]
        self.tables = [self._open(m) for m in range(len(TTLS))]
        self.model: dict[str, Model] = {}
        self.issued: set[str] = set()
        self.done: dict[str, str] = {}  # work id -> token that completed it

    def _open(self, m: int) -> FencedWorkLeaseTable:
        return FencedWorkLeaseTable(self.dir, f"m{m}", ttl=TTLS[m], shards=4, lock_timeout=0,
                                    clock=self.clock, sleep=self.clock.advance,
                                    writer=self.io[m].write, remover=self.io[m].remove)

    def teardown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    @initialize(target=tokens)
    def a_stale_token(self):
        return "m9:0:0:never-issued"

    def _claimable(self, i: str) -> bool:
        rec = self.model.get(i)
        return rec is None or (rec.status == "leased" and self.clock.time() >= rec.expires)

    def _record_claim(self, m: int, i: str, got: WorkLease) -> None:
        old = self.model.get(i)
        assert got.token not in self.issued
        self.issued.add(got.token)
        assert got.owner == f"m{m}" and got.status == "leased"
        assert got.attempts == (old.attempts + 1 if old else 1)
        assert got.steals == (old.steals + 1 if old else 0)
        self.model[i] = Model("leased", got.owner, got.token, self.clock.time() + TTLS[m],
                              got.attempts, got.steals)

    def _current(self, i: str, token: str) -> Model | None:
        rec = self.model.get(i)
        return rec if rec is not None and rec.token == token else None

    @rule(target=tokens, m=st.integers(0, 2), i=st.sampled_from(IDS))
    def claim(self, m, i):
        expect = self._claimable(i)
        got = self.tables[m].claim(i)
        assert (got is not None) == expect
        if got is None:
            return "m9:0:0:refused"
        self._record_claim(m, i, got)
        return got.token

    @rule(target=tokens, m=st.integers(0, 2),
          ids=st.lists(st.sampled_from(IDS), min_size=1, max_size=6))
    def claim_many(self, m, ids):
        expect = {i for i in ids if self._claimable(i)}
        won = self.tables[m].claim_many(ids)
        assert set(won) == expect
        for i, got in won.items():
            self._record_claim(m, i, got)
        return next(iter(won.values())).token if won else "m9:0:0:refused"

    @rule(target=tokens, m=st.integers(0, 2))
    def recover_expired(self, m):
        now = self.clock.time()
        # Not its own: their holder knows them in memory (recovering one would dispatch the
        # input twice); another holder's expired leases only.
        expect = {i for i, r in self.model.items()
                  if r.status == "leased" and now >= r.expires and r.owner != f"m{m}"}
        won = self.tables[m].recover_expired()
        assert {w.digest for w in won} == expect
        for got in won:
            self._record_claim(m, got.digest, got)
        return won[0].token if won else "m9:0:0:nothing-recovered"

    @rule(m=st.integers(0, 2), i=st.sampled_from(IDS), token=tokens)
    def heartbeat(self, m, i, token):
        rec = self._current(i, token)
        expect = rec is not None and rec.status == "leased"
        assert self.tables[m].heartbeat(i, token) == expect
        if expect:
            self.model[i] = replace(rec, expires=self.clock.time() + TTLS[m])

    @rule(m=st.integers(0, 2), i=st.sampled_from(IDS), token=tokens)
    def begin_commit(self, m, i, token):
        rec = self._current(i, token)
        expect = rec is not None and rec.status in ("leased", "committing")
        assert self.tables[m].begin_commit(i, token) == expect
        if expect:
            self.model[i] = replace(rec, status="committing")

    @rule(m=st.integers(0, 2), i=st.sampled_from(IDS), token=tokens)
    def complete(self, m, i, token):
        rec = self._current(i, token)
        expect = rec is not None and rec.status in ("committing", "done")
        assert self.tables[m].complete(i, token) == expect
        if expect:
            self.model[i] = replace(rec, status="done")
            assert self.done.setdefault(i, token) == token  # nothing committed twice

    @rule(m=st.integers(0, 2), i=st.sampled_from(IDS), token=tokens)
    def abandon(self, m, i, token):
        rec = self._current(i, token)
        expect = rec is not None and rec.status == "leased"
        assert self.tables[m].abandon(i, token) == expect
        if expect:
            del self.model[i]

    @rule(seconds=st.sampled_from([1.0, 3.0, 5.0, 11.0]))
    def advance(self, seconds):
        self.clock.advance(seconds)

    @rule(m=st.integers(0, 2))
    def reopen(self, m):
        self.tables[m] = self._open(m)

    @rule(target=tokens, m=st.integers(0, 2), finished=st.sets(st.sampled_from(IDS)))
    def successor_adopts(self, m, finished):
        """Owner m dies and a worker of its group takes its place: a table under the same
        owner name (one master index of one job) adopts its records. Those the journal it
        took over holds as done (`finished`) are completed; every other one is leased anew
        with a fresh token, whatever its status, and the dead holder's tokens count no more.
        Nobody else's record changes."""
        self.tables[m] = self._open(m)
        now = self.clock.time()
        adopted = {lease.digest: lease for lease in self.tables[m].adopt(finished.__contains__)}
        for i, rec in list(self.model.items()):
            if rec.owner != f"m{m}":
                assert i not in adopted
            elif i in finished:
                assert i not in adopted
                self.model[i] = replace(rec, status="done")
                self.done[i] = rec.token
            else:
                got = adopted.pop(i)
                assert got.token not in self.issued and got.status == "leased"
                assert (got.attempts, got.steals) == (rec.attempts + 1, rec.steals)
                self.issued.add(got.token)
                self.model[i] = Model("leased", rec.owner, got.token, now + TTLS[m],
                                      got.attempts, got.steals)
                self.done.pop(i, None)  # its done line never reached the journal
        assert not adopted
        return next(iter(self.model.values())).token if self.model else "m9:0:0:none"

    @rule(m=st.integers(0, 2), i=st.sampled_from(IDS), mode=st.sampled_from(["before", "after"]),
          op=st.sampled_from(["claim", "begin_commit", "complete", "abandon", "heartbeat"]))
    def failing_write(self, m, i, mode, op):
        """F320 fault rule: the write/replace step fails; the operation must change nothing."""
        rec = self.model.get(i)
        token = rec.token if rec else "m9:0:0:none"
        writes = {
            "claim": self._claimable(i),
            "begin_commit": rec is not None and rec.status == "leased",
            "complete": rec is not None and rec.status == "committing",
            "abandon": rec is not None and rec.status == "leased",
            "heartbeat": rec is not None and rec.status == "leased",
        }[op]
        self.io[m].armed = mode
        call = getattr(self.tables[m], op)
        if writes:
            with pytest.raises(OSError, match="injected"):
                call(i) if op == "claim" else call(i, token)
        else:
            call(i) if op == "claim" else call(i, token)
            assert self.io[m].armed == mode  # a refusal writes nothing
        self.io[m].armed = None

    @precondition(lambda self: self.model)
    @rule(data=st.data(), garbage=st.sampled_from([b"", b"{", b"{}", b"[1, 2]", b"\x00" * 9,
                                                   "truncated"]))
    def corrupt(self, data, garbage):
        i = data.draw(st.sampled_from(sorted(self.model)))
        path = self.tables[0].path(i)
        if garbage == "truncated":
            garbage = path.read_bytes()[:-20]
        path.write_bytes(garbage)
        with pytest.raises(CorruptRecord) as raised:
            self.tables[1].read(i)
        assert raised.value.path == path
        assert raised.value.quarantined.read_bytes() == garbage
        assert not path.exists()
        del self.model[i]  # the repeated operation sees the key as absent
        self.done.pop(i, None)  # even a done one: its bytes are kept aside, its state is gone

    @invariant()
    def disk_agrees_with_model(self):
        for i in IDS:
            rec = self.tables[0].read(i)
            want = self.model.get(i)
            if want is None:
                assert rec is None
                continue
            assert rec is not None
            got = Model(rec.status, rec.owner, rec.token, rec.expires, rec.attempts, rec.steals)
            assert got == want
            assert rec.payload.digest == i

    @invariant()
    def done_is_final(self):
        for i, token in self.done.items():
            assert self.model[i].status == "done" and self.model[i].token == token

    @invariant()
    def no_litter(self):
        for directory, _, names in os.walk(self.dir / "records"):
            assert not [n for n in names if n.startswith(".tmp-")], directory
        assert os.listdir(self.dir / "locks") == []


TestWorkLeaseMachine = WorkLeaseMachine.TestCase
TestWorkLeaseMachine.settings = settings(
    max_examples=40, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])


# --- examples beside the machine ----------------------------------------------------------------


def _table(path, owner="m0", **kw) -> FencedWorkLeaseTable:
    kw.setdefault("clock", ManualClock())
    kw.setdefault("ttl", 120)
    kw.setdefault("lock_timeout", 1)
    return FencedWorkLeaseTable(path, owner, **kw)


def test_done_refuses_later_claims_and_late_results(tmp_path):
    clock = ManualClock()
    a, b = _table(tmp_path, "m0", clock=clock, ttl=5), _table(tmp_path, "m1", clock=clock, ttl=5)
    first = a.claim(IDS[0])
    clock.advance(6)
    (second,) = b.recover_expired()
    # The old holder's late result is stale: it can neither commit nor complete (F320 §2.2).
    assert not a.begin_commit(IDS[0], first.token)
    assert not a.heartbeat(IDS[0], first.token)
    assert not a.abandon(IDS[0], first.token)
    assert b.begin_commit(IDS[0], second.token) and b.begin_commit(IDS[0], second.token)
    clock.advance(600)
    assert b.recover_expired() == [] and a.claim(IDS[0]) is None  # committing is not stealable
    assert b.complete(IDS[0], second.token) and b.complete(IDS[0], second.token)
    clock.advance(600)
    assert a.claim(IDS[0]) is None and b.claim(IDS[0]) is None
    assert a.statistics().stale == 3 and b.statistics().taken_over == 1
    assert b.recover_expired() == []  # the done record is not even read again



def test_corrupt_record_is_reported_and_others_survive(tmp_path):
    table = _table(tmp_path)
    claims = {i: table.claim(i) for i in IDS}
    victim = table.path(IDS[2])
    victim.write_bytes(victim.read_bytes()[:17])
    clock = table.clock
    clock.advance(200)
    other = _table(tmp_path, owner="m1", clock=clock)
    recovered = other.recover_expired()
    assert sorted(r.digest for r in recovered) == sorted(set(IDS) - {IDS[2]})
    stats = other.statistics()
    assert stats.quarantined == 1 and stats.corrupt_paths == (str(victim),)
    quarantined = list((tmp_path / "quarantine").iterdir())
    assert len(quarantined) == 1 and quarantined[0].read_bytes().startswith(b'{"schema"')
    for i in set(IDS) - {IDS[2]}:
        assert not table.heartbeat(i, claims[i].token)  # taken over by the recovery above
    assert table.claim(IDS[2]) is not None


def test_record_that_contradicts_its_name_is_quarantined_then_claimed_as_absent(tmp_path):
    table = _table(tmp_path)
    table.claim(IDS[0])
    table.path(IDS[1]).write_bytes(table.path(IDS[0]).read_bytes())
    with pytest.raises(CorruptRecord, match="file name"):
        table.read(IDS[1])
    table.path(IDS[1]).write_bytes(table.path(IDS[0]).read_bytes())
    got = table.claim(IDS[1])
    assert got is not None and got.attempts == 1
    assert table.statistics().quarantined == 2


def test_grouped_claim_takes_each_shard_lock_once(tmp_path, monkeypatch):
    from symcc_mpi.federation import leases

    acquired = []
    real = leases.DirectoryLock.acquire

    def counting(lock):
        acquired.append(lock.path.name)
        real(lock)

    monkeypatch.setattr(leases.DirectoryLock, "acquire", counting)
    table = _table(tmp_path, shards=2)
    won = table.claim_many(IDS + IDS[:2])  # repeats are claimed once
    assert sorted(won) == sorted(IDS)
    assert sorted(acquired) == sorted({table.path(i).parent.name + ".lock" for i in IDS})
    assert table.claim_many(IDS) == {} and table.statistics().refused == len(IDS)


def test_bad_arguments_are_rejected_up_front(tmp_path):
    table = _table(tmp_path)
    for bad in ("abc", IDS[0].upper(), IDS[0] + "0", 7):
        with pytest.raises(ValueError):
            table.claim(bad)
    with pytest.raises(ValueError):
        table.claim(IDS[0], origin="elsewhere")
    with pytest.raises(ValueError):
        _table(tmp_path, owner="")
    with pytest.raises(ValueError):
        _table(tmp_path, ttl=0)


def test_shard_count_is_fixed_by_the_creator(tmp_path):
    first = _table(tmp_path, shards=8)
    second = _table(tmp_path, shards=64)
    assert first.shards == second.shards == 8
    token = first.claim(IDS[0]).token
    assert second.path(IDS[0]) == first.path(IDS[0])
    assert second.claim(IDS[0]) is None and second.heartbeat(IDS[0], token)


def test_a_foreign_table_directory_is_refused(tmp_path):
    (tmp_path / "table.json").write_text('{"schema": "symcc-lease-table-v1", "shards": 4}')
    with pytest.raises(TableMismatch):
        _table(tmp_path)


def test_write_failure_with_failed_rollback_leaves_a_lease_that_ttl_ends(tmp_path):
    clock = ManualClock()

    def broken(path, data):
        write_durable(path, data, fsync=False)
        raise OSError(5, "disk went away after replace")

    def also_broken(path):
        raise OSError(5, "cannot remove either")

    table = _table(tmp_path, clock=clock, ttl=5, writer=broken, remover=also_broken)
    with pytest.raises(OSError, match="after replace"):
        table.claim(IDS[0])
    assert table.statistics().rollback_failures == 1
    healthy = _table(tmp_path, "m1", clock=clock, ttl=5)
    assert healthy.claim(IDS[0]) is None  # conservative: the orphan blocks until its TTL
    clock.advance(5)
    assert healthy.claim(IDS[0]).steals == 1


@pytest.mark.parametrize(
    ("env", "want", "rejected"),
    [
        ({}, (120.0, 1.25, 64), ()),
        ({WORK_LEASE_TTL_ENV: "300", WORK_LOCK_ACQUIRE_TIMEOUT_ENV: "0.5",
          WORK_LEASE_SHARDS_ENV: "16"}, (300.0, 0.5, 16), ()),
        ({WORK_LEASE_TTL_ENV: "  ", WORK_LEASE_SHARDS_ENV: ""}, (120.0, 1.25, 64), ()),
        ({WORK_LEASE_TTL_ENV: "abc"}, (120.0, 1.25, 64), (WORK_LEASE_TTL_ENV,)),
        ({WORK_LEASE_TTL_ENV: "-1", WORK_LOCK_ACQUIRE_TIMEOUT_ENV: "0"}, (120.0, 1.25, 64),
         (WORK_LEASE_TTL_ENV, WORK_LOCK_ACQUIRE_TIMEOUT_ENV)),
        ({WORK_LEASE_TTL_ENV: "nan", WORK_LOCK_ACQUIRE_TIMEOUT_ENV: "inf"}, (120.0, 1.25, 64),
         (WORK_LEASE_TTL_ENV, WORK_LOCK_ACQUIRE_TIMEOUT_ENV)),
        ({WORK_LEASE_SHARDS_ENV: "1.5"}, (120.0, 1.25, 64), (WORK_LEASE_SHARDS_ENV,)),
        ({WORK_LEASE_SHARDS_ENV: "0"}, (120.0, 1.25, 64), (WORK_LEASE_SHARDS_ENV,)),
        ({WORK_LEASE_SHARDS_ENV: "5000"}, (120.0, 1.25, 64), (WORK_LEASE_SHARDS_ENV,)),
        ({WORK_LEASE_SHARDS_ENV: " 4096 "}, (120.0, 1.25, 4096), ()),
    ],
)
def test_config_from_env(env, want, rejected):
    config = LeaseConfig.from_env(env)
    assert (config.ttl, config.lock_timeout, config.shards) == want
    assert tuple(r.split("=")[0] for r in config.rejected) == rejected


def test_config_defaults_follow_timeouts():
    config = LeaseConfig.from_env({}, execution_timeout=60, shutdown_grace=400)
    assert config.ttl == 240.0 and config.lock_timeout == 30.0
    assert LeaseConfig.from_env({}, shutdown_grace=1).lock_timeout == 1.0
    assert LeaseConfig().options() == {"ttl": 120.0, "lock_timeout": 1.25, "shards": 64}
