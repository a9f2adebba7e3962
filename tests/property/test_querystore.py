"""Stateful property test: QueryStore beside an in-memory model of F443's controller state.

Rules: dispatch / finish / cancel (valid and stale), idempotent retries and forks at used
ordinals, skipped ordinals, recovery prepare (same plan reused, different plan refused) and
commit (exact receipt or a mismatching one), batches, injected write faults, reopen.
Invariants: the stored snapshot equals the model; the ordinal grows by one per applied
mutation and never on a refusal, a retry or a failed write; the generation equals the number
of receipts. Also example tests for corrupt and truncated database files."""

from __future__ import annotations

import errno
import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from symcc_mpi.durable.clock import ManualClock
from symcc_mpi.durable.querystore import (
    Fence,
    ForkRefused,
    Lease,
    OrdinalOutOfOrder,
    QueryStore,
    QueryStoreCorrupt,
    QueryStoreError,
    QueuedWork,
    ReceiptMismatch,
    RecoveryPending,
    Refused,
    Snapshot,
    StaleFence,
    preferred_shard,
    shard_owner,
)

N_SHARDS = 4
FIRST_MEMBERS = ["m", "w1", "w2", "w3"]
WORKS = st.sampled_from(["a", "b", "c", "d", "e"])
WORKERS = st.sampled_from(["w1", "w2", "w3", "m", "ghost"])


class Fault:
    def __init__(self) -> None:
        self.armed = False

    def __call__(self, kind: str) -> None:
        if self.armed:
            self.armed = False
            raise OSError(errno.EIO, f"injected failure committing {kind}")


class QueryStoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="querystore-machine-"))
        self.clock = ManualClock()
        self.fault = Fault()
        self.store = self._open()
        self.store.initialize(FIRST_MEMBERS, N_SHARDS)
        self.generation = 0
        self.ordinal = 0
        self.members = list(FIRST_MEMBERS)
        self.leases: dict[int, Lease] = {}
        self.queue: dict[str, QueuedWork] = {}
        self.pending = None  # the real RecoveryPlan once prepared
        self.log: dict[int, tuple] = {0: ("init", (FIRST_MEMBERS, N_SHARDS), None)}

    def _open(self) -> QueryStore:
        return QueryStore(self.directory / "state" / "querystore.sqlite", clock=self.clock,
                          fault=self.fault)

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _applied(self) -> bool:
        """An applying mutation is about to run: with a fault armed it must fail and change
        nothing, so the model does not move either."""
        return not self.fault.armed

    # -- hot path ---------------------------------------------------------------------------

    def _expect_dispatch(self, work: str, worker: str) -> type[Exception] | None:
        if self.pending is not None:
            return RecoveryPending
        if worker not in self.members or any(x.work_id == work for x in self.leases.values()):
            return Refused
        return None

    def _model_dispatch(self, work: str, worker: str, shard: int | None) -> Fence:
        self.ordinal += 1
        if work in self.queue:
            shard = self.queue.pop(work).shard
        elif shard is None:
            shard = preferred_shard(work, N_SHARDS)
        self.leases[self.ordinal] = Lease(self.ordinal, work, shard, worker, self.generation,
                                          self.clock.time())
        return Fence(self.generation, shard, self.ordinal)

    @rule(work=WORKS, worker=WORKERS, shard=st.none() | st.integers(0, N_SHARDS - 1))
    def dispatch(self, work, worker, shard):
        refusal = self._expect_dispatch(work, worker)
        if refusal is not None:
            with pytest.raises(refusal):
                self.store.dispatch(work, worker, shard=shard)
            return
        if not self._applied():
            with pytest.raises(OSError):
                self.store.dispatch(work, worker, shard=shard)
            return
        fence = self.store.dispatch(work, worker, shard=shard)
        assert fence == self._model_dispatch(work, worker, shard)
        self.log[self.ordinal] = ("dispatch", (work, worker, shard), fence)

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), finish=st.booleans())
    def close_active(self, data, finish):
        lease = data.draw(st.sampled_from(sorted(self.leases.values(), key=lambda x: x.lease)))
        call = self.store.finish if finish else self.store.cancel
        args = (lease.fence, lease.work_id, lease.worker)
        if self.pending is not None:
            with pytest.raises(RecoveryPending):
                call(*args)
            return
        if not self._applied():
            with pytest.raises(OSError):
                call(*args)
            return
        assert call(*args) == self.ordinal + 1
        self.ordinal += 1
        del self.leases[lease.lease]
        self.log[self.ordinal] = ("finish" if finish else "cancel", args, self.ordinal)

    @rule(generation=st.integers(0, 3), shard=st.integers(0, N_SHARDS - 1),
          lease=st.integers(0, 40), work=WORKS, worker=WORKERS)
    def stale_result(self, generation, shard, lease, work, worker):
        fence = Fence(generation, shard, lease)
        live = self.leases.get(lease)
        if live is not None and (live.fence, live.work_id, live.worker) == (fence, work, worker):
            return  # that would be a current result, covered by close_active
        expected = RecoveryPending if self.pending is not None else StaleFence
        with pytest.raises(expected):
            self.store.finish(fence, work, worker)

    # -- the ordinal discipline -------------------------------------------------------------

    def _replay(self, ordinal: int):
        kind, args, _ = self.log[ordinal]
        if kind == "init":
            return self.store.initialize(*args)
        if kind == "dispatch":
            work, worker, shard = args
            return self.store.dispatch(work, worker, shard=shard, ordinal=ordinal)
        if kind in ("finish", "cancel"):
            return getattr(self.store, kind)(*args, ordinal=ordinal)
        if kind == "prepare":
            return self.store.prepare(args, ordinal=ordinal)
        return self.store.commit(**args, ordinal=ordinal)

    @rule(data=st.data())
    def retry_is_idempotent(self, data):
        ordinal = data.draw(st.sampled_from(sorted(self.log)))
        before = self.store.snapshot()
        result = self._replay(ordinal)
        expected = self.log[ordinal][2]
        if expected is not None:
            assert result == expected
        assert self.store.snapshot() == before

    @rule(data=st.data(), worker=WORKERS)
    def fork_is_refused(self, data, worker):
        ordinal = data.draw(st.sampled_from(sorted(self.log)))
        with pytest.raises(ForkRefused):
            self.store.dispatch("forked-work", worker, ordinal=ordinal)

    @rule(skip=st.integers(2, 5))
    def skipped_ordinal_is_refused(self, skip):
        with pytest.raises(OrdinalOutOfOrder):
            self.store.dispatch("a", "w1", ordinal=self.ordinal + skip)

    # -- recovery ---------------------------------------------------------------------------

    @rule(data=st.data())
    def prepare(self, data):
        failed = data.draw(st.sets(st.sampled_from(self.members + ["ghost"]), max_size=3))
        self._prepare(tuple(sorted(failed)))

    def _prepare(self, failed: tuple[str, ...]) -> None:
        if self.pending is not None:
            if failed == self.pending.failed:
                assert self.store.prepare(failed) == self.pending  # reused, no new ordinal
            else:
                with pytest.raises(ForkRefused):
                    self.store.prepare(failed)
            return
        if not failed or not set(failed) < set(self.members):
            with pytest.raises(Refused):
                self.store.prepare(failed)
            return
        if not self._applied():
            with pytest.raises(OSError):
                self.store.prepare(failed)
            return
        plan = self.store.prepare(failed)
        self.ordinal += 1
        assert plan.generation == self.generation and plan.failed == failed
        assert plan.members == tuple(self.members)
        assert plan.survivors == tuple(m for m in self.members if m not in failed)
        assert plan.leases == tuple(sorted(self.leases.values(), key=lambda x: x.lease))
        self.pending = plan
        self.log[self.ordinal] = ("prepare", failed, plan)

    @rule(data=st.data(), variant=st.sampled_from(
        ["exact", "exact", "wrong-generation", "wrong-digest", "missing-member",
         "extra-member", "not-agreed"]))
    def commit(self, data, variant):
        survivors = list(self.pending.survivors) if self.pending else list(self.members)
        self._commit(data, variant, data.draw(st.permutations(survivors)))

    def _commit(self, data, variant: str, members: list[str]) -> None:
        plan = self.pending  # any new rank order of the survivors is exact
        receipt = {"generation": self.generation + 1,
                   "plan_digest": plan.digest if plan else "0" * 64,
                   "members": members, "agreed": True}
        if variant == "wrong-generation":
            receipt["generation"] += data.draw(st.sampled_from([-1, 1]))
        elif variant == "wrong-digest":
            receipt["plan_digest"] = "f" * 64
        elif variant == "missing-member":
            receipt["members"] = members[1:]
        elif variant == "extra-member":
            receipt["members"] = members + ["ghost"]
        elif variant == "not-agreed":
            receipt["agreed"] = False
        if plan is None or variant != "exact":
            with pytest.raises(ReceiptMismatch):
                self.store.commit(**receipt)
            return
        if not self._applied():
            with pytest.raises(OSError):
                self.store.commit(**receipt)
            return
        result = self.store.commit(**receipt)
        self.ordinal += 1
        self.generation += 1
        self.members = list(members)
        for lease in plan.leases:
            self.queue[lease.work_id] = QueuedWork(lease.work_id, lease.shard, lease.lease,
                                                   lease.generation)
        self.leases.clear()
        self.pending = None
        assert result.generation == self.generation and result.ordinal == self.ordinal
        assert result.members == tuple(members)
        assert result.post_state_sha256 == self.store.snapshot().digest()
        self.log[self.ordinal] = ("commit", receipt, result)

    @rule(data=st.data())
    def fail_and_recover(self, data):
        # The path F443 §4 takes, directed so that plans freeze live leases and commits fill
        # the recovery queue often: prepare for some failed members, or commit the plan.
        if self.pending is not None:
            self._commit(data, "exact", data.draw(st.permutations(self.pending.survivors)))
        elif len(self.members) > 1:
            failed = data.draw(st.sets(st.sampled_from(self.members), min_size=1,
                                       max_size=len(self.members) - 1))
            self._prepare(tuple(sorted(failed)))

    @rule(data=st.data())
    def dispatch_valid(self, data):
        leased = {lease.work_id for lease in self.leases.values()}
        free = [work for work in ("a", "b", "c", "d", "e") if work not in leased]
        if self.pending is None and free:
            self.dispatch(data.draw(st.sampled_from(free)),
                          data.draw(st.sampled_from(self.members)), None)

    # -- faults and restarts ----------------------------------------------------------------

    @rule()
    def fail_next_write(self):
        self.fault.armed = True

    @precondition(lambda self: self.pending is None)
    @rule(works=st.lists(WORKS, min_size=2, max_size=3, unique=True), worker=WORKERS)
    def batch(self, works, worker):
        if any(self._expect_dispatch(work, worker) for work in works):
            return
        if not self._applied():
            with pytest.raises(OSError):  # the first mutation fails: the batch is all-or-none
                with self.store.batch():
                    for work in works:
                        self.store.dispatch(work, worker)
            return
        with self.store.batch():
            fences = [self.store.dispatch(work, worker) for work in works]
        for work, fence in zip(works, fences, strict=True):
            assert fence == self._model_dispatch(work, worker, None)
            self.log[self.ordinal] = ("dispatch", (work, worker, None), fence)

    @rule()
    def reopen(self):
        self.store.close()
        self.store = self._open()

    @rule()
    def time_passes(self):
        self.clock.advance(7.5)

    @invariant()
    def agrees_with_model(self):
        expected = Snapshot(
            self.generation, self.ordinal, N_SHARDS, tuple(self.members),
            tuple(shard_owner(shard, self.members) for shard in range(N_SHARDS)),
            tuple(sorted(self.leases.values(), key=lambda x: x.lease)),
            tuple(sorted(self.queue.values(), key=lambda x: x.from_lease)),
            None if self.pending is None else self.pending.digest)
        assert self.store.snapshot() == expected
        assert len(self.store.receipts()) == self.generation


TestQueryStoreMachine = QueryStoreMachine.TestCase
TestQueryStoreMachine.settings = settings(max_examples=50, stateful_step_count=30,
                                          deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])


# -- examples ------------------------------------------------------------------------------------


def test_two_survivors_share_one_plan_and_one_commit(tmp_path):
    path = tmp_path / "qs.sqlite"
    first, second = QueryStore(path), QueryStore(path)
    first.initialize(["m", "w1", "w2"], 4)
    fence = first.dispatch("a", "w2")
    ordinal = first.state_ordinal + 1
    plan = first.prepare(["m"], ordinal=ordinal)
    assert second.prepare(["m"], ordinal=ordinal) == plan  # F443 §4 step 3: confirmation
    assert second.prepare(["m"]) == plan  # the slower survivor reuses the pending plan
    with pytest.raises(ForkRefused):
        second.prepare(["w1"], ordinal=ordinal)
    receipt = second.commit(generation=1, plan_digest=plan.digest, members=["w1", "w2"])
    again = first.commit(generation=1, plan_digest=plan.digest, members=["w1", "w2"],
                         ordinal=receipt.ordinal)
    assert again == receipt
    with pytest.raises(StaleFence):
        first.finish(fence, "a", "w2")
    assert first.recovery_queue() == (QueuedWork("a", fence.shard, fence.lease, 0),)
    refreshed = first.dispatch("a", "w1", shard=(fence.shard + 1) % 4)
    assert refreshed.shard == fence.shard and refreshed.generation == 1  # the original shard
    assert first.statistics().generation == 1


def test_old_hot_ordinals_are_forgotten_but_recovery_ones_kept(tmp_path):
    store = QueryStore(tmp_path / "qs.sqlite", history=4)
    store.initialize(["m", "w1"], 2)
    for i in range(300):
        fence = store.dispatch(f"x{i}", "w1")
        store.finish(fence, f"x{i}", "w1")
    with pytest.raises(OrdinalOutOfOrder, match="older than the kept history"):
        store.dispatch("x0", "w1", ordinal=1)
    store.initialize(["m", "w1"], 2)  # ordinal 0 is never forgotten
    kept = store._db.execute("SELECT count(*) FROM ordinals").fetchone()[0]
    assert kept < 300


def test_garbage_file_is_reported_and_moved_aside(tmp_path):
    path = tmp_path / "state" / "querystore.sqlite"
    path.parent.mkdir()
    path.write_bytes(b"this is not a database" * 300)
    with pytest.raises(QueryStoreCorrupt) as caught:
        QueryStore(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message
    moved = Path(message.rsplit("moved to ", 1)[1])
    assert moved.read_bytes().startswith(b"this is not a database")  # kept, not deleted
    assert not path.exists()
    assert QueryStore(path).initialized is False  # a fresh store can start in its place


def _filled_store(path: Path, operations: int = 400) -> None:
    store = QueryStore(path)
    store.initialize(["m", "w1", "w2"], 8)
    for i in range(operations):
        store.dispatch(f"work-{i:05d}-" + "p" * 60, "w1")
    store.close()  # checkpoints the WAL into the main file


def test_truncated_file_is_reported_and_moved_aside(tmp_path):
    path = tmp_path / "querystore.sqlite"
    _filled_store(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(QueryStoreCorrupt, match="moved to"):
        QueryStore(path)
    assert list((tmp_path / "quarantine").iterdir())


def test_damaged_page_header_is_reported_and_moved_aside(tmp_path):
    # SQLite pages carry no checksum: a flip inside a record's payload reads back as another
    # value. A damaged b-tree page header is structural and quick_check sees it.
    path = tmp_path / "querystore.sqlite"
    _filled_store(path)
    data = bytearray(path.read_bytes())
    page = 4096
    for offset in range(2 * page, 2 * page + 12):
        data[offset] ^= 0x5A
    path.write_bytes(bytes(data))
    with pytest.raises(QueryStoreCorrupt, match=str(path)):
        QueryStore(path)


def test_broken_invariant_is_reported_as_corrupt(tmp_path):
    path = tmp_path / "querystore.sqlite"
    _filled_store(path, operations=3)
    raw = sqlite3.connect(path)
    raw.execute("UPDATE meta SET value = '7' WHERE key = 'generation'")  # no receipts
    raw.commit()
    raw.close()
    with pytest.raises(QueryStoreCorrupt, match="receipt"):
        QueryStore(path)


def test_write_failure_leaves_state_unchanged(tmp_path):
    fault = Fault()
    store = QueryStore(tmp_path / "qs.sqlite", fault=fault)
    store.initialize(["m", "w1"], 2)
    before = store.snapshot()
    fault.armed = True
    with pytest.raises(OSError):
        store.dispatch("a", "w1")
    assert store.snapshot() == before
    assert store.dispatch("a", "w1").lease == 1  # the ordinal was not consumed


def test_other_schema_version_is_refused_and_left_in_place(tmp_path):
    path = tmp_path / "querystore.sqlite"
    _filled_store(path, operations=1)
    raw = sqlite3.connect(path)
    raw.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
    raw.commit()
    raw.close()
    with pytest.raises(QueryStoreError, match="schema '99'") as caught:
        QueryStore(path)
    assert not isinstance(caught.value, QueryStoreCorrupt) and path.exists()
