"""The work-lease table under real processes: concurrent masters, SIGKILL mid-write."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

import pytest

from symcc_mpi.durable.atomic import temporary_for, write_durable
from symcc_mpi.durable.clock import ManualClock
from symcc_mpi.federation.leases import FencedWorkLeaseTable
from symcc_mpi.federation.work_leases import WorkLease

FORK = multiprocessing.get_context("fork")
T0 = 2_000_000_000.0  # the ManualClock start shared by a child and the parent that reopens


def digest_of(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def _run(target, args_for, n: int, timeout: float = 60) -> list[int | None]:
    start = FORK.Barrier(n)
    processes = [FORK.Process(target=target, args=(*args_for(i), start)) for i in range(n)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join()
    return [process.exitcode for process in processes]


def _litter(root: Path) -> list[str]:
    """Temporary files, staging directories or lock directories left anywhere in a table."""
    found = []
    for tree in ("records", "locks"):
        for directory, dirs, names in os.walk(root / tree):
            found += [os.path.join(directory, n) for n in names + dirs
                      if n.startswith(".tmp-") or n.endswith(".lock")]
    return found


# --- several masters, one directory -------------------------------------------------------------


def _records(table: FencedWorkLeaseTable) -> list[WorkLease]:
    names = (path.name[: -len(".json")] for path in (table.root / "records").glob("*/*.json"))
    return [record for record in map(table.read, names) if record is not None]


def _work_master(root: Path, m: int, ids: list[str], out: Path, start) -> None:
    table = FencedWorkLeaseTable(root, f"m{m}", ttl=60, lock_timeout=5)
    order = ids if m % 2 == 0 else ids[::-1]
    start.wait()
    won = []
    for i in order:
        lease = table.claim(i, origin="generated")
        if lease is not None:
            assert table.begin_commit(i, lease.token)
            assert table.complete(i, lease.token)
            won.append(i)
    out.write_text(json.dumps(won))


def test_masters_racing_for_the_same_work_each_item_has_one_winner(tmp_path):
    ids = [digest_of(f"race-{j}") for j in range(60)]
    root = tmp_path / "work"
    codes = _run(_work_master, lambda m: (root, m, ids, tmp_path / f"won-{m}"), 4)
    assert codes == [0, 0, 0, 0]
    won = [json.loads((tmp_path / f"won-{m}").read_text()) for m in range(4)]
    flat = [i for w in won for i in w]
    assert sorted(flat) == sorted(ids)  # exactly one winner per item
    table = FencedWorkLeaseTable(root, "check", ttl=60, lock_timeout=5)
    records = {r.digest: r for r in _records(table)}
    assert set(records) == set(ids)
    for m, items in enumerate(won):
        for i in items:
            assert records[i].status == "done" and records[i].owner == f"m{m}"
            assert records[i].attempts == 1 and records[i].payload.origin == "generated"
    assert table.statistics().quarantined == 0 and _litter(root) == []


# --- SIGKILL at chosen points inside a write ----------------------------------------------------


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _killing_writer(kill_at: int, point: str):
    """A durable writer that dies at its `kill_at`-th write, at `point` of that write.

    It names its temporary file as `write_durable` does, so the leftovers are the real ones.
    """
    count = 0

    def write(path: Path, data: bytes) -> None:
        nonlocal count
        count += 1
        if count != kill_at:
            write_durable(path, data)
            return
        temporary = temporary_for(path)
        with open(temporary, "wb") as handle:
            if point == "temp-partial":
                handle.write(data[: len(data) // 2])
                handle.flush()
                _die()
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if point == "temp-synced":
            _die()
        os.replace(temporary, path)
        _die()  # "replaced": the record is published, its directory not yet fsynced

    return write


def _work_child(root: Path, item: str, kill_at: int, point: str) -> None:
    table = FencedWorkLeaseTable(root, "child", ttl=10, lock_timeout=5, clock=ManualClock(T0),
                                 writer=_killing_writer(kill_at, point))
    lease = table.claim(item)
    table.begin_commit(item, lease.token)
    table.complete(item, lease.token)


POINTS = ["temp-partial", "temp-synced", "replaced"]


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("kill_at", [1, 2, 3])
def test_sigkill_inside_a_work_write_leaves_a_recoverable_record(tmp_path, kill_at, point):
    root, item = tmp_path / "work", digest_of("crash")
    child = FORK.Process(target=_work_child, args=(root, item, kill_at, point))
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL

    clock = ManualClock(T0)
    table = FencedWorkLeaseTable(root, "parent", ttl=10, clock=clock, lock_timeout=1)
    landed = kill_at if point == "replaced" else kill_at - 1
    record = table.read(item)  # readable: the old record or the new one, never a torn one
    assert (record.status if record else None) == [None, "leased", "committing", "done"][landed]

    if record is None:
        lease = table.claim(item)  # the dead child's lock is cleared, not waited out
    elif record.status == "leased":
        assert table.claim(item) is None  # still the child's until its TTL
        clock.advance(10)
        (lease,) = table.recover_expired()
        assert lease.steals == 1
    elif record.status == "committing":
        clock.advance(3600)
        assert table.recover_expired() == []  # past the fence: redone with its token
        lease = record
    else:
        lease = None
        assert table.claim(item) is None
    if lease is not None:
        assert table.begin_commit(item, lease.token) and table.complete(item, lease.token)
    table.recover_expired()  # a scan sweeps the dead writer's temporary file
    assert table.read(item).status == "done"
    assert table.statistics().dead_locks_cleared == 1
    assert table.statistics().quarantined == 0
    assert _litter(root) == []


# --- SIGKILL at random moments ------------------------------------------------------------------


def _busy_master(root: Path, round_: int) -> None:
    work = FencedWorkLeaseTable(root / "work", "busy", ttl=0.3, lock_timeout=2)
    rng = random.Random(round_)
    for j in range(10_000):
        item = digest_of(f"{round_}-{j}")
        lease = work.claim(item)
        if lease and rng.random() < 0.8 and work.begin_commit(item, lease.token):
            work.complete(item, lease.token)


@pytest.mark.slow
def test_random_sigkills_leave_recoverable_tables(tmp_path):
    rng = random.Random(7)
    cleared = 0
    for round_ in range(25):
        child = FORK.Process(target=_busy_master, args=(tmp_path, round_))
        child.start()
        time.sleep(rng.uniform(0.02, 0.15))
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        assert child.exitcode == -signal.SIGKILL  # it was killed, it had not failed

        later = ManualClock(time.time() + 3600)  # every lease of the dead master has expired
        work = FencedWorkLeaseTable(tmp_path / "work", "rescuer", ttl=0.3, clock=later,
                                    lock_timeout=2)
        for lease in work.recover_expired():  # the scan also sweeps dead writers' temporaries
            assert work.begin_commit(lease.digest, lease.token)
            assert work.complete(lease.digest, lease.token)
        for record in _records(work):
            if record.status == "committing":  # redone with its own token, never stolen
                assert work.complete(record.digest, record.token)
        assert {r.status for r in _records(work)} <= {"done"}
        assert work.statistics().quarantined == 0
        cleared += work.statistics().dead_locks_cleared
        assert _litter(tmp_path / "work") == []
    assert cleared > 0  # some kills did land inside an update, holding its lock
