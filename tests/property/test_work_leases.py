"""F320 work lease table against an in-memory model: several masters, expiry, grouped claims
and fences, deferred completions, write faults, corrupt and torn log lines."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass, fields, replace
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from symcc_mpi.config import WORK_LEASE_TTL_ENV, WORK_LOCK_ACQUIRE_TIMEOUT_ENV
from symcc_mpi.durable import range_lock
from symcc_mpi.durable.clock import ManualClock
from symcc_mpi.durable.locks import LockTimeout
from symcc_mpi.federation.lease_config import LeaseConfig
from symcc_mpi.federation.leases import FencedWorkLeaseTable
from symcc_mpi.federation.shards import InvalidRecord, TableMismatch
from symcc_mpi.federation.work_leases import (
    WORK_PAYLOAD_SCHEMA,
    WORK_SCHEMA,
    WorkLease,
    WorkPayload,
    decode_lease,
    encode_lease,
)

IDS = [hashlib.sha256(f"input-{i}".encode()).hexdigest() for i in range(6)]
TTLS = [10.0, 10.0, 4.0]  # masters may disagree on TTL: each record carries its own expiry
SHARDS = 4


class FaultyIO:
    """A table's `writer(fd, data)`, failing its next call when armed.

    `before`: the OSError comes before a byte is written; `after`: every byte was written,
    then the error came (as a failed fsync would); `torn`: half the bytes were written.
    Whatever reached the log, the table must cut it off again: the change did not happen.
    """

    def __init__(self):
        self.armed: str | None = None
        self.calls = 0

    def write(self, fd: int, data: bytes) -> int:
        self.calls += 1
        mode, self.armed = self.armed, None
        if mode == "before":
            raise OSError(5, "injected failure before the write")
        if mode == "torn":
            os.write(fd, data[: len(data) // 2])
            raise OSError(5, "injected failure in mid-write")
        written = os.write(fd, data)
        if mode == "after":
            raise OSError(5, "injected failure after the write")
        return written


@dataclass(frozen=True)
class Model:
    status: str
    owner: str
    token: str
    expires: float
    attempts: int
    steals: int


def _log_name(shard: int) -> str:
    return f"{shard:0{len(f'{SHARDS - 1:x}')}x}.log"


def _forged(digest: str, **changes) -> bytes:
    """A complete-looking record line (newline-less) that the table must refuse."""
    record = WorkLease(WORK_SCHEMA, digest, "done", "m0", "forged", 0.0, 0.0, 1, 0,
                       WorkPayload(WORK_PAYLOAD_SCHEMA, digest, "generated"))
    return encode_lease(msgspec.structs.replace(record, **changes))[:-1]


GARBAGE = {
    "brace": lambda log: b"{",
    "object": lambda log: b"{}",
    "array": lambda log: b"[1, 2]",
    "nul": lambda log: b"\x00" * 9,
    "empty": lambda log: b"",
    "not-utf8": lambda log: b"\xff\xfe[",
    # the first half of a real line: what a writer killed in mid-write leaves
    "half-line": lambda log: (log.splitlines() or [_forged(IDS[0], steals=0)])[-1][:60],
    # records that decode as JSON but are impossible: they must change nothing either
    "impossible-counters": lambda log: _forged(IDS[1], steals=1),
    "foreign-payload": lambda log: _forged(IDS[2], payload=WorkPayload(
        WORK_PAYLOAD_SCHEMA, IDS[3], "generated")),
    "wrong-schema": lambda log: _forged(IDS[4], schema="symcc-work-lease-v0"),
    "no-token": lambda log: _forged(IDS[5], token=""),
}


class WorkLeaseMachine(RuleBasedStateMachine):
    """Three masters' table objects on one directory, and the model of what the logs say.

    The model's `status` is the logical one: "done" once a completion was accepted. The logs
    say `committing` until a table holding that completion writes it (`written`); each
    table's `pending` completions ride on its next write to their shard, or `flush`. What a
    table object answers without a lock round (`complete`, a fence of a record it saw
    committing) comes from what it last read of that shard (`view`).
    """

    tokens = Bundle("tokens")

    def __init__(self):
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="work-leases-"))
        self.clock = ManualClock()
        self.io = [FaultyIO() for _ in TTLS]
        self.tables = [self._open(m) for m in range(len(TTLS))]
        # Reads the logs after every step and does nothing else: a reader from another table.
        self.observer = FencedWorkLeaseTable(self.dir, "observer", ttl=1, lock_timeout=0,
                                             clock=self.clock, sleep=self.clock.advance)
        self.shard = {i: self.tables[0].shard_of(i) for i in IDS}
        self.model: dict[str, Model] = {}
        self.issued: set[str] = set()
        self.done: dict[str, str] = {}  # work id -> token that completed it
        self.written: set[str] = set()  # done ids whose done line is in the log
        self.revoked: set[str] = set()  # tokens an adoption replaced
        self.garbage = [0] * SHARDS  # complete lines in each log that do not decode
        self.torn: set[int] = set()  # logs that end in a torn (newline-less) line
        self.pending: list[set[str]] = []
        self.view: list[dict[str, Model | None]] = []
        self.seen_garbage: list[list[int]] = []
        self.cut: list[int] = []  # torn tails each table object cut off
        self.failures: list[int] = []
        for m in range(len(TTLS)):
            self._forget(m)

    def _open(self, m: int) -> FencedWorkLeaseTable:
        return FencedWorkLeaseTable(self.dir, f"m{m}", ttl=TTLS[m], shards=SHARDS,
                                    lock_timeout=0, clock=self.clock, sleep=self.clock.advance,
                                    writer=self.io[m].write)

    def _forget(self, m: int) -> None:
        """Table m is a new object: it holds no completion and has read nothing yet."""
        for name, fresh in (("pending", set()), ("view", {}), ("seen_garbage", [0] * SHARDS),
                            ("cut", 0), ("failures", 0)):
            values = getattr(self, name)
            if m < len(values):
                values[m] = fresh
            else:
                values.append(fresh)

    def _reopen(self, m: int) -> None:
        self.tables[m].close()
        self.tables[m] = self._open(m)
        self._forget(m)

    def teardown(self):
        for table in [*self.tables, self.observer]:
            with contextlib.suppress(OSError):
                table.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- the model

    def _disk(self, i: str) -> Model | None:
        """What the logs say of `i`: the model, but `committing` for a completion not written."""
        rec = self.model.get(i)
        if rec is not None and rec.status == "done" and i not in self.written:
            return replace(rec, status="committing")
        return rec

    def _after(self, m: int, rounded=(), read=(), *, wrote: bool = True) -> None:
        """Table m took the lock of each shard of `rounded` (cutting its torn tail, if any; with
        `wrote`, its write there carried m's pending completions of that shard) and read the
        shards of `read`: it now knows those shards as the logs say them."""
        rounded = set(rounded)
        for s in rounded & self.torn:
            event("a lock round cut a torn tail")
            self.torn.discard(s)
            self.cut[m] += 1
        if wrote:
            for i in [i for i in self.pending[m] if self.shard[i] in rounded]:
                assert self.model[i].status == "done"
                self.pending[m].discard(i)
                self.written.add(i)
        for s in rounded | set(read):
            self.seen_garbage[m][s] = self.garbage[s]
            for i in IDS:
                if self.shard[i] == s:
                    self.view[m][i] = self._disk(i)

    def _claimable(self, i: str) -> bool:
        rec = self.model.get(i)
        return rec is None or (rec.status == "leased" and self.clock.time() >= rec.expires)

    def _record_claim(self, m: int, i: str, got: WorkLease) -> None:
        old = self.model.get(i)
        assert got.token not in self.issued
        self.issued.add(got.token)
        assert got.owner == f"m{m}" and got.status == "leased" and got.digest == i
        assert got.attempts == (old.attempts + 1 if old else 1)
        assert got.steals == (old.steals + 1 if old else 0)
        self.model[i] = Model("leased", got.owner, got.token, self.clock.time() + TTLS[m],
                              got.attempts, got.steals)

    def _current_on_disk(self, i: str, token: str, *statuses: str) -> bool:
        rec = self._disk(i)
        return rec is not None and rec.token == token and rec.status in statuses

    def _seen_committing(self, m: int, i: str, token: str) -> bool:
        """Table m's fence of (i, token) needs no round: it saw i committing under it."""
        seen = self.view[m].get(i)
        return seen is not None and seen.token == token and seen.status == "committing"

    def _unstale(self, m: int, tokens: dict[str, str]) -> None:
        """Table m may still have seen a record committing (or done) under a token that an
        adoption has replaced since, and would take it for current without a lock round
        (test_a_zombie_holder_cannot_complete_after_its_successor_adopted). Only the dead
        holder had that token: let m read the record afresh before it is presented."""
        for i, token in tokens.items():
            seen, rec = self.view[m].get(i), self.model.get(i)
            if seen is not None and seen.token == token and seen.status != "leased" and (
                    rec is None or rec.token != token):
                assert token in self.revoked
                event("a table saw a record under a token an adoption revoked")
                self.tables[m].read(i)
                self._after(m, read=[self.shard[i]])

    def _pick(self, i: str, token: str, current: bool) -> str:
        """A token of the bundle (mostly stale ones), or the record's own."""
        rec = self.model.get(i)
        return rec.token if current and rec is not None else token

    def _logs(self) -> dict[int, bytes]:
        return {s: (self.dir / "logs" / _log_name(s)).read_bytes() for s in range(SHARDS)}

    def _unchanged_but_cut(self, before: dict[int, bytes], shard: int) -> None:
        """The logs are as they were, less the torn tail a lock round of `shard` cut off."""
        want = dict(before)
        want[shard] = before[shard][: before[shard].rfind(b"\n") + 1]
        assert self._logs() == want

    # -- the operations

    @initialize(target=tokens)
    def a_stale_token(self):
        return "never-issued"

    @rule(target=tokens, m=st.integers(0, 2), i=st.sampled_from(IDS))
    def claim(self, m, i):
        expect = self._claimable(i)
        got = self.tables[m].claim(i)
        assert (got is not None) == expect
        if got is not None:
            self._record_claim(m, i, got)
        self._after(m, rounded=[self.shard[i]])
        return got.token if got else "refused"

    @rule(target=tokens, m=st.integers(0, 2),
          ids=st.lists(st.sampled_from(IDS), min_size=1, max_size=6))
    def claim_many(self, m, ids):
        expect = {i for i in ids if self._claimable(i)}
        won = self.tables[m].claim_many(ids)
        assert set(won) == expect
        for i, got in won.items():
            self._record_claim(m, i, got)
        self._after(m, rounded={self.shard[i] for i in ids})
        return next(iter(won.values())).token if won else "refused"

    @rule(target=tokens, m=st.integers(0, 2),
          pairs=st.lists(st.tuples(st.sampled_from(IDS), tokens), max_size=4),
          claims=st.lists(st.sampled_from(IDS), max_size=4))
    def fence(self, m, pairs, claims):
        """Several results' fences and the next inputs' claims in one call. (A caller never
        fences and claims one input in one call: the claims are of other inputs.)"""
        fences = dict(pairs)
        claims = [i for i in claims if i not in fences]
        self._unstale(m, fences)
        seen = {i for i, token in fences.items() if self._seen_committing(m, i, token)}
        if seen:
            event("fence without a lock round")
        begun = {i for i, token in fences.items()
                 if i not in seen and self._current_on_disk(i, token, "leased")}
        expect = seen | begun | {i for i, token in fences.items()
                                 if self._current_on_disk(i, token, "committing")}
        expect_claims = {i for i in claims if self._claimable(i)}
        fenced = self.tables[m].fence(fences, claims=claims)
        assert fenced.committing == expect
        assert set(fenced.claimed) == expect_claims
        for i in fenced.committing:  # never a token that is not the record's
            assert self.model[i].token == fences[i]
        for i in begun:
            self.model[i] = replace(self.model[i], status="committing")
        for i, got in fenced.claimed.items():
            self._record_claim(m, i, got)
        self._after(m, rounded={self.shard[i] for i in [*claims, *fences] if i not in seen})
        return next(iter(fenced.claimed.values())).token if fenced.claimed else "refused"

    @rule(target=tokens, m=st.integers(0, 2))
    def recover_expired(self, m):
        now = self.clock.time()
        # Not its own: their holder knows them in memory (recovering one would dispatch the
        # input twice); another holder's expired leases only.
        expect = {i for i, r in self.model.items()
                  if r.status == "leased" and now >= r.expires and r.owner != f"m{m}"}
        won = self.tables[m].recover_expired()
        assert {w.digest for w in won} == expect and len(won) == len(expect)
        for got in won:
            self._record_claim(m, got.digest, got)
        self._after(m, rounded={self.shard[i] for i in expect}, read=range(SHARDS))
        return won[0].token if won else "nothing-recovered"

    @rule(m=st.integers(0, 2), i=st.sampled_from(IDS), token=tokens, current=st.booleans())
    def heartbeat(self, m, i, token, current):
        token = self._pick(i, token, current)
        expect = self._current_on_disk(i, token, "leased")
        assert self.tables[m].heartbeat(i, token) == expect
        if expect:
            self.model[i] = replace(self.model[i], expires=self.clock.time() + TTLS[m])
        self._after(m, rounded=[self.shard[i]])

    @rule(m=st.integers(0, 2),
          pairs=st.lists(st.tuples(st.sampled_from(IDS), tokens), min_size=1, max_size=4))
    def heartbeat_many(self, m, pairs):
        beats = dict(pairs)
        expect = {i for i, token in beats.items() if self._current_on_disk(i, token, "leased")}
        assert self.tables[m].heartbeat_many(beats) == expect
        for i in expect:
            self.model[i] = replace(self.model[i], expires=self.clock.time() + TTLS[m])
        self._after(m, rounded={self.shard[i] for i in beats})

    @rule(m=st.integers(0, 2), i=st.sampled_from(IDS), token=tokens, current=st.booleans())
    def begin_commit(self, m, i, token, current):
        token = self._pick(i, token, current)
        self._unstale(m, {i: token})
        seen = self._seen_committing(m, i, token)
        begins = not seen and self._current_on_disk(i, token, "leased")
        expect = seen or begins or self._current_on_disk(i, token, "committing")
        assert self.tables[m].begin_commit(i, token) == expect
        if expect:
            assert self.model[i].token == token
        if begins:
            self.model[i] = replace(self.model[i], status="committing")
        self._after(m, rounded=[] if seen else [self.shard[i]])

    @rule(m=st.integers(0, 2), i=st.sampled_from(IDS), token=tokens, current=st.booleans())
    def complete(self, m, i, token, current):
        """Deferred: answered from what table m holds and last read, written later."""
        token = self._pick(i, token, current)
        self._unstale(m, {i: token})
        rec = self.model.get(i)
        seen = self.view[m].get(i)
        if i in self.pending[m]:
            expect = rec.token == token
        else:
            expect = (seen is not None and seen.token == token
                      and seen.status in ("committing", "done"))
        writes_before = self.tables[m].statistics().writes
        assert self.tables[m].complete(i, token) == expect
        assert self.tables[m].statistics().writes == writes_before  # nothing written yet
        event(f"complete: {'accepted' if expect else 'refused'}")
        if expect:
            assert rec.token == token and rec.status in ("committing", "done")
            if i not in self.pending[m] and seen.status == "committing":
                self.pending[m].add(i)
            self.model[i] = replace(rec, status="done")
            assert self.done.setdefault(i, token) == token  # nothing committed twice

    @precondition(lambda self: any(rec.status == "leased" for rec in self.model.values()))
    @rule(data=st.data(), finish=st.booleans())
    def holder_commits(self, data, finish):
        """The usual path of a result: its lease's holder fences it and (now, or later)
        completes it; the done line waits for that table's next write to the shard."""
        i = data.draw(st.sampled_from(sorted(i for i, rec in self.model.items()
                                             if rec.status == "leased")))
        m, token = int(self.model[i].owner[1:]), self.model[i].token
        self.begin_commit(m, i, token, current=True)
        assert self.model[i].status == "committing"
        if finish:
            self.complete(m, i, token, current=True)
            assert i in self.pending[m]

    @rule(m=st.integers(0, 2))
    def flush(self, m):
        shards = {self.shard[i] for i in self.pending[m]}
        if shards:
            event("flush wrote completions")
        assert self.tables[m].flush() == len(self.pending[m])
        self._after(m, rounded=shards)
        assert not self.pending[m]

    @rule(m=st.integers(0, 2), i=st.sampled_from(IDS), token=tokens, current=st.booleans())
    def abandon(self, m, i, token, current):
        token = self._pick(i, token, current)
        expect = self._current_on_disk(i, token, "leased")
        assert self.tables[m].abandon(i, token) == expect
        if expect:
            del self.model[i]
        self._after(m, rounded=[self.shard[i]])

    @rule(m=st.integers(0, 2), i=st.none() | st.sampled_from(IDS))
    def look(self, m, i):
        """Table m reads the logs, one digest's shard or all of them (no lock): what it then
        answers from memory is what it read now."""
        if i is None:
            got = {rec.digest: self._as_model(rec) for rec in self.tables[m].records()}
            assert got == {i: self._disk(i) for i in self.model}
            self._after(m, read=range(SHARDS))
        else:
            rec = self.tables[m].read(i)
            assert (None if rec is None else self._as_model(rec)) == self._disk(i)
            self._after(m, read=[self.shard[i]])

    @rule(seconds=st.sampled_from([1.0, 3.0, 5.0, 11.0]))
    def advance(self, seconds):
        self.clock.advance(seconds)

    @rule(m=st.integers(0, 2))
    def reopen(self, m):
        """Table m is dropped and opened anew: the completions it had not written are lost,
        and their records stay committing for ever (safe: no one takes them over)."""
        lost = self.pending[m] - self.written - set().union(
            *(self.pending[k] for k in range(len(TTLS)) if k != m))
        self._reopen(m)
        if lost:
            event("a reopen lost completions")
            self._nobody_takes(lost)

    def _nobody_takes(self, ids: set[str]) -> None:
        """On a copy of the logs, long after every TTL: nobody claims, recovers, completes
        or abandons the records of `ids` (committing, their completion lost)."""
        copy = Path(tempfile.mkdtemp(prefix="work-leases-copy-"))
        later = ManualClock(self.clock.time() + 1000 * max(TTLS))
        try:
            shutil.copytree(self.dir, copy, dirs_exist_ok=True)
            probe = FencedWorkLeaseTable(copy, "probe", ttl=1, lock_timeout=0, clock=later,
                                         sleep=later.advance)
            try:
                recovered = {lease.digest for lease in probe.recover_expired()}
                assert not recovered & ids
                for i in ids:
                    token = self.model[i].token
                    assert probe.claim(i) is None
                    assert not probe.begin_commit(i, "another-token")
                    assert not probe.complete(i, "another-token")
                    assert not probe.heartbeat(i, token) and not probe.abandon(i, token)
                    got = probe.read(i)
                    assert (got.status, got.token) == ("committing", token)
                assert probe.flush() == 0
            finally:
                probe.close()
        finally:
            shutil.rmtree(copy, ignore_errors=True)

    def _may_be_adopted(self, m: int) -> bool:
        # Another table holding the completion of one of m's records: its write is dropped once
        # the successor leased the record anew (test_a_zombie_...), which this model does not
        # follow. In a job only m holds its tokens.
        return not any(self.model[i].owner == f"m{m}"
                       for k in range(len(TTLS)) if k != m for i in self.pending[k])

    @precondition(lambda self: any(map(self._may_be_adopted, range(len(TTLS)))))
    @rule(target=tokens, data=st.data(), finished=st.sets(st.sampled_from(IDS)))
    def successor_adopts(self, data, finished):
        """Owner m dies and a worker of its group takes its place: a table under the same
        owner name (one master index of one job) adopts its records. Those the journal it
        took over holds as done (`finished`) are completed; every other one is leased anew
        with a fresh token, whatever its status, and the dead holder's tokens count no more.
        Nobody else's record changes. The dead table's unwritten completions die with it."""
        m = data.draw(st.sampled_from([m for m in range(len(TTLS)) if self._may_be_adopted(m)]))
        self._reopen(m)
        now = self.clock.time()
        owned = {self.shard[i] for i, rec in self.model.items() if rec.owner == f"m{m}"}
        adopted = {lease.digest: lease for lease in self.tables[m].adopt(finished.__contains__)}
        for i, rec in list(self.model.items()):
            if rec.owner != f"m{m}":
                assert i not in adopted
            elif i in finished:
                assert i not in adopted
                self.model[i] = replace(rec, status="done")
                self.written.add(i)
                self.done[i] = rec.token
            else:
                got = adopted.pop(i)
                event(f"adopt leased a {rec.status} record anew")
                assert got.token not in self.issued and got.status == "leased"
                assert (got.attempts, got.steals) == (rec.attempts + 1, rec.steals)
                self.issued.add(got.token)
                self.revoked.add(rec.token)
                self.model[i] = Model("leased", rec.owner, got.token, now + TTLS[m],
                                      got.attempts, got.steals)
                self.written.discard(i)
                self.done.pop(i, None)  # its done line never reached the journal
        assert not adopted
        self._after(m, rounded=owned, read=range(SHARDS))
        return next(iter(self.model.values())).token if self.model else "none"

    @precondition(lambda self: any(map(self._may_be_adopted, range(len(TTLS)))))
    @rule(data=st.data(), finished=st.sets(st.sampled_from(IDS)))
    def root_releases(self, data, finished):
        """Owner m's whole group dies, so nobody takes its place: another table (root's)
        releases its records. Those a journal holds as done (`finished`) are completed; every
        other one is removed, whatever its status, and any table may claim its input afresh.
        Nobody else's record changes. The dead table's unwritten completions die with it."""
        m = data.draw(st.sampled_from([m for m in range(len(TTLS)) if self._may_be_adopted(m)]))
        k = data.draw(st.sampled_from([k for k in range(len(TTLS)) if k != m]))
        self._reopen(m)
        owned = {self.shard[i] for i, rec in self.model.items() if rec.owner == f"m{m}"}
        released = {lease.digest for lease in
                    self.tables[k].release(f"m{m}", finished.__contains__)}
        for i, rec in list(self.model.items()):
            if rec.owner != f"m{m}":
                assert i not in released
            elif i in finished:
                assert i not in released
                self.model[i] = replace(rec, status="done")
                self.written.add(i)
                self.done[i] = rec.token
            else:
                released.remove(i)
                event(f"release removed a {rec.status} record")
                self.revoked.add(rec.token)
                del self.model[i]
                self.written.discard(i)
                self.done.pop(i, None)  # its done line never reached a journal
        assert not released
        self._after(k, rounded=owned, read=range(SHARDS))

    # -- faults

    @rule(m=st.integers(0, 2), i=st.sampled_from(IDS),
          mode=st.sampled_from(["before", "after", "torn"]),
          op=st.sampled_from(["claim", "begin_commit", "abandon", "heartbeat"]))
    def failing_write(self, m, i, mode, op):
        """F320 fault rule: the log write fails; the operation must change nothing, and the
        completions riding on it stay pending."""
        rec = self.model.get(i)
        token = rec.token if rec else "no-such-token"
        shard = self.shard[i]
        seen = op == "begin_commit" and self._seen_committing(m, i, token)
        changes = (self._claimable(i) if op == "claim"
                   else self._current_on_disk(i, token, "leased"))
        writes = not seen and (changes or any(self.shard[j] == shard for j in self.pending[m]))
        event(f"failing {op}: {'raised' if writes else 'wrote nothing'}")
        before = self._logs()
        other = (m + 1) % len(TTLS)
        was = self.tables[other].read(i)
        self._after(other, read=[shard])
        self.io[m].armed = mode
        call = getattr(self.tables[m], op)
        try:
            if writes:
                with pytest.raises(OSError, match="injected"):
                    call(i) if op == "claim" else call(i, token)
                self.failures[m] += 1
                self._unchanged_but_cut(before, shard)
                assert self.tables[other].read(i) == was  # a reader sees the old state
            else:
                call(i) if op == "claim" else call(i, token)
                assert self.io[m].armed == mode  # a refusal writes nothing
                if seen:
                    assert self._logs() == before  # not even a lock round
                else:
                    self._unchanged_but_cut(before, shard)
        finally:
            self.io[m].armed = None
        self._after(m, rounded=[] if seen else [shard], wrote=not writes)

    def _unwritten(self) -> list[int]:
        """The tables whose every pending completion still has a line to write: a completion
        of a record another table has written done already is moot, its shard's round writes
        nothing (the `flush` rule has those)."""
        return [m for m in range(len(TTLS))
                if self.pending[m] and not self.pending[m] & self.written]

    @precondition(lambda self: self._unwritten())
    @rule(data=st.data(), mode=st.sampled_from(["before", "after", "torn"]),
          again=st.booleans())
    def failing_flush(self, data, mode, again):
        """A completion's write fails: the record stays committing on disk, the completion
        pending; a later flush writes it."""
        m = data.draw(st.sampled_from(self._unwritten()))
        first = min(self.shard[i] for i in self.pending[m])
        event("failing flush")
        before = self._logs()
        self.io[m].armed = mode
        try:
            with pytest.raises(OSError, match="injected"):
                self.tables[m].flush()
        finally:
            self.io[m].armed = None
        self.failures[m] += 1
        self._after(m, rounded=[first], wrote=False)
        self._unchanged_but_cut(before, first)
        for i in self.pending[m] - self.written:
            assert self.observer.read(i).status == "committing"
        if again:
            self.flush(m)

    @rule(s=st.integers(0, SHARDS - 1), kind=st.sampled_from(sorted(GARBAGE)),
          torn=st.booleans())
    def corrupt(self, s, kind, torn):
        """Garbage appended to a log: a complete line that does not decode (skipped and
        counted by every reader; it names no record, so nothing changes), or a torn last line
        (ignored by readers, cut off by the next lock holder)."""
        path = self.dir / "logs" / _log_name(s)
        log = path.read_bytes()
        garbage = GARBAGE[kind](log[: log.rfind(b"\n") + 1])
        assert b"\n" not in garbage and b"\r" not in garbage
        with open(path, "ab") as handle:
            if torn:
                handle.write(garbage or b"?")
                self.torn.add(s)
            else:
                handle.write(garbage + b"\n")  # after a torn tail: one line with it
                self.garbage[s] += 1
                self.torn.discard(s)
        auditor = FencedWorkLeaseTable(self.dir, "auditor", ttl=1, lock_timeout=0,
                                       clock=self.clock, sleep=self.clock.advance)
        try:
            assert {r.digest: self._as_model(r) for r in auditor.records()} == {
                i: self._disk(i) for i in self.model}
            stats = auditor.statistics()
            assert (stats.corrupt_lines, stats.torn_tails) == (sum(self.garbage), 0)
        finally:
            auditor.close()

    # -- invariants

    @staticmethod
    def _as_model(rec: WorkLease) -> Model:
        return Model(rec.status, rec.owner, rec.token, rec.expires, rec.attempts, rec.steals)

    @invariant()
    def disk_agrees_with_model(self):
        for i in IDS:
            rec = self.observer.read(i)
            want = self._disk(i)
            if want is None:
                assert rec is None
                continue
            assert rec is not None
            assert self._as_model(rec) == want
            assert rec.payload.digest == i
        assert {r.digest for r in self.observer.records()} == set(self.model)
        stats = self.observer.statistics()
        assert (stats.corrupt_lines, stats.torn_tails, stats.writes) == (sum(self.garbage), 0, 0)

    @invariant()
    def done_is_final(self):
        """A completed record stays done under its token (the log says committing until its
        done line is written, for ever if every table holding it was dropped) unless the
        successor of its holder adopts it: then its done line never reached the journal."""
        for i, token in self.done.items():
            assert self.model[i].status == "done" and self.model[i].token == token
            rec = self.observer.read(i)
            assert rec.token == token
            assert rec.status == ("done" if i in self.written else "committing")
        holders = set().union(*self.pending)
        for i in holders:
            assert self.model[i].status == "done"

    @invariant()
    def tables_count_what_they_read_and_cut(self):
        for m, table in enumerate(self.tables):
            stats = table.statistics()
            assert stats.corrupt_lines == sum(self.seen_garbage[m])
            assert stats.torn_tails == self.cut[m]
            assert stats.write_failures == self.failures[m]

    @invariant()
    def nothing_but_whole_logs(self):
        """table.json and one log per shard; every log is whole lines, but a torn tail
        garbage left; its lines decode but the garbage, each in its digest's shard."""
        assert sorted(os.listdir(self.dir)) == ["logs", "table.json"]
        assert sorted(os.listdir(self.dir / "logs")) == [_log_name(s) for s in range(SHARDS)]
        for s, log in self._logs().items():
            end = log.rfind(b"\n") + 1
            assert (end < len(log)) == (s in self.torn)
            bad = 0
            for line in log[:end].splitlines():
                try:
                    record = decode_lease(line)
                except InvalidRecord:
                    bad += 1
                    continue
                assert self.shard[record.digest] == s
            assert bad == self.garbage[s]


TestWorkLeaseMachine = WorkLeaseMachine.TestCase
TestWorkLeaseMachine.settings = settings(
    max_examples=200, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])


# --- examples beside the machine ----------------------------------------------------------------


def _table(path, owner="m0", **kw) -> FencedWorkLeaseTable:
    kw.setdefault("clock", ManualClock())
    kw.setdefault("ttl", 120)
    kw.setdefault("lock_timeout", 1)
    kw.setdefault("sleep", kw["clock"].advance)  # a wait for a lock passes on the test's clock
    return FencedWorkLeaseTable(path, owner, **kw)


def _lines(root: Path) -> int:
    return sum(path.read_bytes().count(b"\n") for path in (root / "logs").glob("*.log"))


def _records_in(log: Path) -> list[WorkLease]:
    return [decode_lease(line) for line in log.read_bytes().splitlines()]


def test_done_refuses_later_claims_and_late_results(tmp_path):
    clock = ManualClock()
    a, b = _table(tmp_path, "m0", clock=clock, ttl=5), _table(tmp_path, "m1", clock=clock, ttl=5)
    first = a.claim(IDS[0])
    clock.advance(6)
    (second,) = b.recover_expired()
    # The old holder's late result is stale: it can neither commit nor complete (F320 §2.2).
    assert not a.begin_commit(IDS[0], first.token)
    assert not a.complete(IDS[0], first.token)
    assert not a.heartbeat(IDS[0], first.token)
    assert not a.abandon(IDS[0], first.token)
    assert b.begin_commit(IDS[0], second.token) and b.begin_commit(IDS[0], second.token)
    clock.advance(600)
    assert b.recover_expired() == [] and a.claim(IDS[0]) is None  # committing is not stealable
    assert b.complete(IDS[0], second.token) and b.complete(IDS[0], second.token)
    assert not b.complete(IDS[0], first.token)
    assert a.read(IDS[0]).status == "committing"  # the done line waits for b's next write...
    assert b.flush() == 1 and b.flush() == 0
    assert a.read(IDS[0]).status == "done"  # ...or its flush
    assert b.complete(IDS[0], second.token) and b.flush() == 0  # done: nothing to write again
    clock.advance(600)
    assert a.claim(IDS[0]) is None and b.claim(IDS[0]) is None
    assert not a.begin_commit(IDS[0], second.token) and not b.begin_commit(IDS[0], second.token)
    assert a.statistics().stale == 4 and b.statistics().taken_over == 1
    assert b.recover_expired() == []
    assert b.statistics().completed == 1


def test_grouped_claim_takes_each_shard_lock_once_and_writes_once(tmp_path, monkeypatch):
    entered = []
    real = range_lock.RangeLock.__enter__

    def counting(lock):
        entered.append(lock.path.name)
        return real(lock)

    monkeypatch.setattr(range_lock.RangeLock, "__enter__", counting)
    table = _table(tmp_path, shards=2)
    shards = {table.shard_of(i) for i in IDS}
    assert len(shards) == 2
    won = table.claim_many(IDS + IDS[:2])  # repeats are claimed once
    assert sorted(won) == sorted(IDS)
    assert sorted(entered) == sorted(_log_name_of(table, s) for s in shards)
    stats = table.statistics()
    assert (stats.writes, stats.changes, stats.claims) == (2, len(IDS), len(IDS))
    assert _lines(tmp_path) == len(IDS)
    for s in shards:
        log = tmp_path / "logs" / _log_name_of(table, s)
        assert {r.digest for r in _records_in(log)} == {i for i in IDS if table.shard_of(i) == s}
    entered.clear()
    assert table.claim_many(IDS) == {} and table.statistics().refused == len(IDS)
    assert len(entered) == 2 and table.statistics().writes == 2  # refusals write nothing
    assert _lines(tmp_path) == len(IDS)


def _log_name_of(table: FencedWorkLeaseTable, shard: int) -> str:
    return f"{shard:0{len(f'{table.shards - 1:x}')}x}.log"


def test_fence_of_several_results_with_claims_is_one_write(tmp_path):
    table = _table(tmp_path, shards=1)
    held = table.claim_many(IDS[:3])
    fenced = table.fence({IDS[0]: held[IDS[0]].token, IDS[1]: held[IDS[1]].token,
                          IDS[2]: "stale", IDS[5]: "never-claimed"}, claims=IDS[3:5])
    assert fenced.committing == {IDS[0], IDS[1]}
    assert sorted(fenced.claimed) == sorted(IDS[3:5])
    stats = table.statistics()
    assert (stats.writes, stats.changes, stats.commits_begun) == (2, 3 + 4, 2)
    assert _lines(tmp_path) == 7
    other = _table(tmp_path, "m1", clock=table.clock)
    assert [other.read(i).status for i in IDS[:5]] == ["committing"] * 2 + ["leased"] * 3
    # Already committing under its token: no lock round at all, even while another holds it.
    with other._logs[0].lock:
        again = table.fence({IDS[0]: held[IDS[0]].token, IDS[1]: held[IDS[1]].token})
        assert again.committing == {IDS[0], IDS[1]} and again.claimed == {}
        assert table.begin_commit(IDS[0], held[IDS[0]].token)
        with pytest.raises(TimeoutError):
            table.fence({IDS[0]: held[IDS[0]].token}, claims=[IDS[5]])
    assert table.statistics().writes == 2
    # heartbeats of many leases: one write
    beats = {i: lease.token for i, lease in fenced.claimed.items()} | {IDS[2]: held[IDS[2]].token}
    assert table.heartbeat_many(beats | {IDS[0]: held[IDS[0]].token}) == set(beats)
    assert table.statistics().writes == 3 and _lines(tmp_path) == 10


def test_a_completion_rides_on_the_next_write_and_flush_writes_the_rest(tmp_path):
    clock = ManualClock()
    # digests 0 and 1 in shard 0, 2 in shard 1
    shard_of = {IDS[0]: 0, IDS[1]: 0, IDS[2]: 1, IDS[3]: 1}.__getitem__
    table = _table(tmp_path, clock=clock, shards=2, shard_of=shard_of)
    reader = _table(tmp_path, "m1", clock=clock, shards=2, shard_of=shard_of)
    held = table.claim_many(IDS[:3])
    assert table.fence({i: lease.token for i, lease in held.items()}).committing == set(IDS[:3])
    assert table.statistics().writes == 4 and _lines(tmp_path) == 6
    for i in IDS[:3]:
        assert table.complete(i, held[i].token)
    assert table.statistics().writes == 4 and _lines(tmp_path) == 6  # nothing written yet
    assert {reader.read(i).status for i in IDS[:3]} == {"committing"}
    assert reader.claim(IDS[0]) is None  # treated as done: never claimed, never taken over
    clock.advance(10**6)
    assert reader.recover_expired() == []
    # The next write to shard 1 carries its completion: one write, two lines.
    assert table.claim(IDS[3]) is not None
    stats = table.statistics()
    assert (stats.writes, stats.changes, stats.completed) == (5, 6 + 2, 3)
    assert _lines(tmp_path) == 8
    assert [reader.read(i).status for i in IDS[:3]] == ["committing", "committing", "done"]
    assert table.flush() == 2  # shard 0's two completions: one more write
    assert table.statistics().writes == 6 and _lines(tmp_path) == 10
    assert [reader.read(i).status for i in IDS[:3]] == ["done"] * 3
    assert table.flush() == 0 and table.statistics().writes == 6


def test_a_completion_never_written_leaves_its_record_committing_for_ever(tmp_path):
    clock = ManualClock()
    table = _table(tmp_path, clock=clock, ttl=5)
    lease = table.claim(IDS[0])
    assert table.begin_commit(IDS[0], lease.token) and table.complete(IDS[0], lease.token)
    table.close()  # dropped before its next write: the done line is lost
    clock.advance(10**6)
    other = _table(tmp_path, "m1", clock=clock, ttl=5)
    assert other.claim(IDS[0]) is None and other.recover_expired() == []
    assert not other.complete(IDS[0], "another-token")
    assert not other.begin_commit(IDS[0], "another-token")
    assert not other.abandon(IDS[0], lease.token) and not other.heartbeat(IDS[0], lease.token)
    got = other.read(IDS[0])
    assert (got.status, got.token, got.owner) == ("committing", lease.token, "m0")


def test_a_failed_write_is_cut_back_and_keeps_its_completion(tmp_path):
    clock = ManualClock()
    failing = {"mode": None}

    def writer(fd, data):
        mode, failing["mode"] = failing["mode"], None
        if mode == "torn":
            os.write(fd, data[:10])
            raise OSError(28, "injected: no space left")
        written = os.write(fd, data)
        if mode == "after":
            raise OSError(5, "injected: fsync failed")
        return written

    table = _table(tmp_path, clock=clock, shards=1, writer=writer)
    lease = table.claim(IDS[0])
    assert table.begin_commit(IDS[0], lease.token) and table.complete(IDS[0], lease.token)
    log = tmp_path / "logs" / "0.log"
    before = log.read_bytes()
    for mode in ("torn", "after"):
        failing["mode"] = mode
        with pytest.raises(OSError, match="injected"):
            table.claim(IDS[1])  # carries the completion: both fail
        assert log.read_bytes() == before
    reader = _table(tmp_path, "m1", clock=clock)
    assert reader.read(IDS[0]).status == "committing" and reader.read(IDS[1]) is None
    stats = table.statistics()
    assert (stats.write_failures, stats.writes, stats.changes, stats.torn_tails) == (2, 4, 2, 0)
    assert table.claim(IDS[1]) is not None  # the completion rides again, and lands
    assert reader.read(IDS[0]).status == "done" and reader.read(IDS[1]).status == "leased"
    assert table.flush() == 0


def test_two_table_objects_in_one_process_exclude_each_other(tmp_path):
    clock = ManualClock()
    holder = _table(tmp_path, "m0", clock=clock, shards=1, lock_timeout=0)
    waiter = _table(tmp_path, "m1", clock=clock, shards=1, lock_timeout=0)
    with holder._logs[0].lock:
        with pytest.raises(LockTimeout) as raised:
            waiter.claim(IDS[0])
        assert isinstance(raised.value, TimeoutError) and raised.value.path.name == "0.log"
        for refused in (lambda: waiter.claim_many(IDS), lambda: waiter.heartbeat(IDS[0], "t"),
                        lambda: waiter.abandon(IDS[0], "t"),
                        lambda: waiter.begin_commit(IDS[0], "t")):
            with pytest.raises(TimeoutError):
                refused()
        assert waiter.read(IDS[0]) is None  # reading takes no lock
    assert waiter.claim(IDS[0]) is not None
    assert _lines(tmp_path) == 1
    # A bounded wait: the waiter naps on its clock until the deadline, and gives up.
    patient = _table(tmp_path, "m2", clock=clock, shards=1, lock_timeout=2)
    start = clock.monotonic()
    with holder._logs[0].lock, pytest.raises(LockTimeout) as raised:
        patient.claim(IDS[1])
    assert clock.monotonic() - start == pytest.approx(2) and raised.value.waited >= 2
    # A holder that lets go while the waiter naps: the waiter gets the lock and counts its wait.
    with contextlib.ExitStack() as stack:
        stack.enter_context(holder._logs[0].lock)

        def nap(seconds):
            clock.advance(seconds)
            stack.close()

        late = _table(tmp_path, "m3", clock=clock, shards=1, lock_timeout=2, sleep=nap)
        assert late.claim(IDS[1]) is not None
    stats = late.statistics()
    assert stats.lock_waits == 1 and 0 < stats.lock_wait_seconds <= 2


def test_a_torn_tail_is_ignored_by_readers_and_cut_by_the_next_holder(tmp_path):
    clock = ManualClock()
    writer = _table(tmp_path, "m0", clock=clock, shards=1)
    reader = _table(tmp_path, "m1", clock=clock, shards=1)
    first = writer.claim(IDS[0])
    log = tmp_path / "logs" / "0.log"
    whole = log.read_bytes()
    # A writer killed in mid-write: half of a line that would have leased IDS[1].
    half = _forged(IDS[1], status="leased", owner="dead", steals=0)[:70]
    with open(log, "ab") as handle:
        handle.write(half)
    assert reader.read(IDS[1]) is None and reader.read(IDS[0]) == first
    assert {r.digest for r in reader.records()} == {IDS[0]}
    assert (reader.statistics().torn_tails, reader.statistics().corrupt_lines) == (0, 0)
    assert log.read_bytes() == whole + half  # a reader leaves it be
    second = writer.claim(IDS[1])  # the next lock holder cuts it off first
    assert writer.statistics().torn_tails == 1
    data = log.read_bytes()
    assert data == whole + encode_lease(second)
    assert reader.read(IDS[1]) == second and reader.statistics().corrupt_lines == 0
    assert [r.digest for r in _records_in(log)] == [IDS[0], IDS[1]]


def test_a_corrupt_line_is_skipped_and_counted_and_its_digest_keeps_its_state(tmp_path):
    clock = ManualClock()
    table = _table(tmp_path, clock=clock, shards=1)
    leases = table.claim_many(IDS[:3])
    log = tmp_path / "logs" / "0.log"
    with open(log, "ab") as handle:
        # IDS[0] committing, but with impossible counters; then plain garbage
        handle.write(_forged(IDS[0], status="committing", token=leases[IDS[0]].token,
                             attempts=1, steals=1) + b"\n")
        handle.write(b"\x00garbage\n")
    assert table.begin_commit(IDS[1], leases[IDS[1]].token)  # a write after the garbage
    reader = _table(tmp_path, "m1", clock=clock)
    assert reader.read(IDS[0]) == leases[IDS[0]]  # the corrupt line changed nothing
    assert reader.read(IDS[1]).status == "committing" and reader.read(IDS[2]) == leases[IDS[2]]
    assert reader.statistics().corrupt_lines == 2 and table.statistics().corrupt_lines == 2
    assert reader.statistics().torn_tails == 0
    assert table.heartbeat(IDS[0], leases[IDS[0]].token)  # still its lease


def test_shard_count_is_fixed_by_the_creator(tmp_path):
    first = _table(tmp_path, shards=8)
    second = _table(tmp_path, shards=64)
    assert first.shards == second.shards == 8
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [f"{s}.log" for s in range(8)]
    token = first.claim(IDS[0]).token
    assert second.claim(IDS[0]) is None and second.heartbeat(IDS[0], token)
    assert sorted(os.listdir(tmp_path)) == ["logs", "table.json"]


def test_shard_of_is_honoured(tmp_path):
    def shard_of(digest):
        return 3 if digest == IDS[0] else 0

    table = _table(tmp_path, shards=4, shard_of=shard_of)
    table.claim_many(IDS[:2])
    logs = tmp_path / "logs"
    assert [r.digest for r in _records_in(logs / "3.log")] == [IDS[0]]
    assert [r.digest for r in _records_in(logs / "0.log")] == [IDS[1]]
    assert (logs / "1.log").read_bytes() == (logs / "2.log").read_bytes() == b""
    alike = _table(tmp_path, "m1", shard_of=shard_of)
    assert alike.read(IDS[0]).owner == "m0" and alike.claim(IDS[0]) is None
    # Every opener must shard alike: one that does not looks in the wrong log.
    unlike = _table(tmp_path, "m2", shard_of=lambda digest: 1)
    assert unlike.read(IDS[0]) is None


def test_a_foreign_table_directory_is_refused(tmp_path):
    for description in ('{"schema": "symcc-lease-table-v1", "shards": 4}',
                        '{"schema": "symcc-work-lease-table-v2", "shards": 0}',
                        '{"schema": "symcc-work-lease-table-v2", "shards": true}',
                        '{"schema": "symcc-work-lease-table-v2"}', "not json"):
        (tmp_path / "table.json").write_text(description)
        with pytest.raises(TableMismatch):
            _table(tmp_path)


def test_bad_arguments_are_rejected_up_front(tmp_path):
    table = _table(tmp_path)
    for bad in ("abc", IDS[0].upper(), IDS[0] + "0", 7):
        for call in (table.claim, lambda d: table.claim_many([IDS[1], d]),
                     lambda d: table.begin_commit(d, "t"), lambda d: table.complete(d, "t"),
                     lambda d: table.heartbeat(d, "t"), lambda d: table.abandon(d, "t"),
                     table.read, lambda d: table.fence({}, claims=[d])):
            with pytest.raises(ValueError):
                call(bad)
    assert table.read(IDS[1]) is None  # nothing of a refused batch was claimed
    with pytest.raises(ValueError):
        table.claim(IDS[0], origin="elsewhere")
    for owner in ("", "x" * 201, None):
        with pytest.raises(ValueError):
            _table(tmp_path, owner=owner)
    for ttl in (0, -1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ValueError):
            _table(tmp_path, ttl=ttl)
    for shards in (0, 4097, True, 2.0):
        with pytest.raises(ValueError):
            _table(tmp_path / "other", shards=shards)
    for lock_timeout in (-1, float("nan"), "1"):
        with pytest.raises(ValueError):
            _table(tmp_path, lock_timeout=lock_timeout)
    assert _lines(tmp_path) == 0


def test_recover_expired_takes_at_most_its_limit(tmp_path):
    clock = ManualClock()
    a, b = _table(tmp_path, "m0", clock=clock, ttl=5), _table(tmp_path, "m1", clock=clock, ttl=5)
    a.claim_many(IDS)
    clock.advance(5)
    assert a.recover_expired() == []  # its own: its holder knows them
    first = b.recover_expired(limit=2)
    assert len(first) == 2 and all(r.steals == 1 and r.owner == "m1" for r in first)
    rest = b.recover_expired()
    assert sorted(r.digest for r in first + rest) == sorted(IDS)


def test_a_zombie_holder_cannot_complete_after_its_successor_adopted(tmp_path):
    """Fencing (F320 §2.2): a token that is no longer the record's changes nothing. Master m0
    is declared dead, but its process lives on (paused, say): its successor, under the same
    owner name, leases its committing records anew. The zombie's completions, one accepted
    before the adoption and one after, must not overwrite the successor's leases."""
    clock = ManualClock()
    zombie = _table(tmp_path, "m0", clock=clock, shards=1)
    held = zombie.claim_many(IDS[:2])
    assert zombie.fence({i: lease.token for i, lease in held.items()}).committing == set(IDS[:2])
    assert zombie.complete(IDS[0], held[IDS[0]].token)  # not written yet
    successor = _table(tmp_path, "m0", clock=clock, shards=1)
    adopted = {lease.digest: lease for lease in successor.adopt(lambda digest: False)}
    assert set(adopted) == set(IDS[:2])
    zombie.complete(IDS[1], held[IDS[1]].token)  # answered from its view: it may say True...
    zombie.flush()  # ...but writes nothing over the successor's leases
    for i in IDS[:2]:
        got = successor.read(i)
        assert (got.status, got.token) == ("leased", adopted[i].token)


# --- configuration ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "want", "rejected"),
    [
        ({}, (120.0, 1.25), ()),
        ({WORK_LEASE_TTL_ENV: "300", WORK_LOCK_ACQUIRE_TIMEOUT_ENV: "0.5"}, (300.0, 0.5), ()),
        ({WORK_LEASE_TTL_ENV: "  ", WORK_LOCK_ACQUIRE_TIMEOUT_ENV: ""}, (120.0, 1.25), ()),
        ({WORK_LEASE_TTL_ENV: " 7.5 "}, (7.5, 1.25), ()),
        ({WORK_LEASE_TTL_ENV: "abc"}, (120.0, 1.25), (WORK_LEASE_TTL_ENV,)),
        ({WORK_LEASE_TTL_ENV: "-1", WORK_LOCK_ACQUIRE_TIMEOUT_ENV: "0"}, (120.0, 1.25),
         (WORK_LEASE_TTL_ENV, WORK_LOCK_ACQUIRE_TIMEOUT_ENV)),
        ({WORK_LEASE_TTL_ENV: "nan", WORK_LOCK_ACQUIRE_TIMEOUT_ENV: "inf"}, (120.0, 1.25),
         (WORK_LEASE_TTL_ENV, WORK_LOCK_ACQUIRE_TIMEOUT_ENV)),
        ({WORK_LOCK_ACQUIRE_TIMEOUT_ENV: "-inf"}, (120.0, 1.25),
         (WORK_LOCK_ACQUIRE_TIMEOUT_ENV,)),
        # the shard count is the job's masters now: the old variable is not read
        ({"SYMCC_STANDALONE_WORK_LEASE_SHARDS": "16"}, (120.0, 1.25), ()),
    ],
)
def test_config_from_env(env, want, rejected):
    config = LeaseConfig.from_env(env)
    assert (config.ttl, config.lock_timeout) == want
    assert tuple(r.split("=")[0] for r in config.rejected) == rejected


def test_config_defaults_follow_timeouts():
    config = LeaseConfig.from_env({}, execution_timeout=60, shutdown_grace=400)
    assert config.ttl == 240.0 and config.lock_timeout == 30.0
    assert LeaseConfig.from_env({}, shutdown_grace=1).lock_timeout == 1.0
    assert LeaseConfig().options() == {"ttl": 120.0, "lock_timeout": 1.25}
    assert {f.name for f in fields(LeaseConfig)} == {"ttl", "lock_timeout", "rejected"}


def test_a_garbage_line_longer_than_a_read_hides_nothing_after_it(tmp_path):
    writer = _table(tmp_path, shards=1)
    writer.claim(IDS[0])
    with open(next((tmp_path / "logs").glob("*.log")), "ab") as log:
        log.write(b"x" * (3 << 20) + b"\n")
    writer.claim(IDS[1])  # its lock round read past the garbage: nothing was cut
    reader = _table(tmp_path, "m1", shards=1)
    assert {r.digest for r in reader.records()} == set(IDS[:2])
    assert reader.statistics().corrupt_lines == 1 and reader.statistics().torn_tails == 0
    assert reader.claim(IDS[1]) is None


def test_a_fenced_digest_among_the_claims_is_not_claimed_again(tmp_path):
    clock = ManualClock()
    table = _table(tmp_path, clock=clock, ttl=5)
    lease = table.claim(IDS[0])
    clock.advance(6)  # expired, but nobody took it over: still this holder's
    fenced = table.fence({IDS[0]: lease.token}, claims=[IDS[0], IDS[1]])
    assert fenced.committing == {IDS[0]} and set(fenced.claimed) == {IDS[1]}
    assert table.read(IDS[0]).status == "committing"


def test_a_table_closed_or_dropped_leaves_no_descriptor_open(tmp_path):
    def open_descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_descriptors()
    table = _table(tmp_path, shards=8)
    table.claim(IDS[0])
    assert open_descriptors() == before + 8
    table.close()
    table.close()  # twice is harmless
    assert open_descriptors() == before
    dropped = _table(tmp_path, "m1", shards=8)
    dropped.claim(IDS[1])
    del dropped  # a dead simulated rank's table, say: freed, not closed
    gc.collect()
    assert open_descriptors() == before
