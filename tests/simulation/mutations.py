"""Deliberately broken variants of the code under simulation: each breaks one rule the
simulation must catch (issue 14). `apply(name)` patches it in for the duration of a block."""

from __future__ import annotations

import contextlib

from symcc_mpi.dispatch import coordinator, tables
from symcc_mpi.dispatch.objects import ObjectTransferCache
from symcc_mpi.durable import leases
from symcc_mpi.roles import master


def _cache_before_send(patch):
    """F313 D7: the object cache updated before the WORK send (a failed send leaves the
    master believing the worker holds what it never received)."""
    original = coordinator.DispatchCoordinator._dispatch_one

    def dispatch_one(self, rank, work_id, send):
        def send_after_confirming(rank, work):
            plan = self.objects.plan(rank, list(work.objects), lambda digest: work.objects[digest])
            self.objects.confirm(plan)
            send(rank, work)

        return original(self, rank, work_id, send_after_confirming)

    patch(coordinator.DispatchCoordinator, "_dispatch_one", dispatch_one)
    forget = ObjectTransferCache.forget
    patch(ObjectTransferCache, "forget", lambda self, rank: None if forget else None)


def _active_popped_before_commit(patch):
    """F313 D5: the transaction leaves `active` before `begin_commit`'s fence ran: a fence
    that raises leaves it in no table, and the input is never requeued."""

    def begin_commit(self, worker, token, fence):
        tx = self._tables[tables.Table.ACTIVE].get(worker)
        if tx is None or tx.token != token:
            return tables.CommitStart.NOT_ACTIVE
        del self._tables[tables.Table.ACTIVE][worker]
        if not fence():
            self._counts["fenced"] += 1
            self._tables[tables.Table.ACTIVE][worker] = tx
            self._close(tx, tables.Table.ACTIVE)
            return tables.CommitStart.FENCED
        tx.begin_commit()
        self._tables[tables.Table.COMMITTING][worker] = tx
        return tables.CommitStart.COMMITTING

    patch(tables.DispatchTables, "begin_commit", begin_commit)


def _committing_stolen_by_age(patch):
    """F321: a `committing` work lease expires like a `leased` one, so another master takes
    over an input whose commit is under way."""
    patch(leases.WorkLease, "expired",
          lambda self, now: self.status in ("leased", "committing") and now >= self.expires)


def _older_generation_accepted(patch):
    """F443: a RESULT of an older generation is judged and committed."""
    original = master.Master._judge_and_commit

    def judge_and_commit(self, rank, result):
        if result.generation < self.generation:
            import msgspec

            result = msgspec.structs.replace(result, generation=self.generation)
            result = _Lagging(result)
        return original(self, rank, result)

    patch(master.Master, "_judge_and_commit", judge_and_commit)


class _Lagging:
    """The RESULT as judged (generation made current), committed as it came."""

    def __init__(self, result):
        self._result = result

    def __getattr__(self, name):
        return getattr(self._result, name)


def _idle_master_exits(patch):
    """F320: a master whose own frontier is empty ends the campaign without the COMMIT
    round of the quiescence protocol."""
    original = master.Master._stop_reason

    def stop_reason(self, now):
        if self.federation is not None and self.dispatch.exhausted:
            return "frontier exhausted"
        return original(self, now)

    patch(master.Master, "_stop_reason", stop_reason)


MUTATIONS = {
    "cache-before-send": _cache_before_send,
    "active-popped-before-begin-commit": _active_popped_before_commit,
    "committing-stolen-by-age": _committing_stolen_by_age,
    "older-generation-accepted": _older_generation_accepted,
    "idle-master-exits": _idle_master_exits,
}


@contextlib.contextmanager
def apply(name: str):
    saved = []

    def patch(owner, attribute, value):
        saved.append((owner, attribute, owner.__dict__[attribute]))
        setattr(owner, attribute, value)

    MUTATIONS[name](patch)
    try:
        yield
    finally:
        for owner, attribute, value in reversed(saved):
            setattr(owner, attribute, value)
