"""Lease tables under real processes: concurrent masters, crossing groups, SIGKILL mid-write."""

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

from symcc_mpi.durable.atomic import write_durable
from symcc_mpi.durable.clock import ManualClock
from symcc_mpi.durable.leases import FencedTargetLeaseTable, FencedWorkLeaseTable

FORK = multiprocessing.get_context("fork")
T0 = 2_000_000_000.0  # the ManualClock start shared by a child and the parent that reopens


def work_id(name: str) -> str:
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
    ids = [work_id(f"race-{j}") for j in range(60)]
    root = tmp_path / "work"
    codes = _run(_work_master, lambda m: (root, m, ids, tmp_path / f"won-{m}"), 4)
    assert codes == [0, 0, 0, 0]
    won = [json.loads((tmp_path / f"won-{m}").read_text()) for m in range(4)]
    flat = [i for w in won for i in w]
    assert sorted(flat) == sorted(ids)  # exactly one winner per item
    table = FencedWorkLeaseTable(root, "check", fsync=False)
    records = {r.work_id: r for r in table.records()}
    assert set(records) == set(ids)
    for m, items in enumerate(won):
        for i in items:
            assert records[i].status == "done" and records[i].owner == f"m{m}"
            assert records[i].attempts == 1 and records[i].payload.origin == "generated"
    assert table.statistics().quarantined == 0 and _litter(root) == []


CROSSING = ([(i, i + 1) for i in range(1, 31)] + [(i + 1, i) for i in range(1, 31)]
            + [(i, i + 5, i + 10) for i in range(1, 21)] + [(11, 22), (22, 33), (33, 11)])


def _group_master(root: Path, m: int, out: Path, start) -> None:
    table = FencedTargetLeaseTable(root, f"m{m}", ttl=60, lock_timeout=5)
    groups = list(CROSSING)
    random.Random(m).shuffle(groups)
    start.wait()
    won = []
    for group in groups:
        claim = table.claim_group(group, worker=f"w{m}")
        if claim is not None:
            won.append([claim.token, list(claim.group)])
    out.write_text(json.dumps(won))


def test_crossing_groups_from_many_masters_never_deadlock_or_overlap(tmp_path):
    root = tmp_path / "targets"
    codes = _run(_group_master, lambda m: (root, m, tmp_path / f"won-{m}"), 4, timeout=30)
    assert codes == [0, 0, 0, 0]  # a deadlock would surface as LockTimeout, exit code 1
    won = [c for m in range(4) for c in json.loads((tmp_path / f"won-{m}").read_text())]
    owner_of: dict[int, str] = {}
    for token, group in won:
        for t in group:
            assert t not in owner_of, f"target {t} claimed twice"
            owner_of[t] = token
    table = FencedTargetLeaseTable(root, "check", fsync=False)
    on_disk = {r.target: r.token for r in table.records()}
    assert on_disk == owner_of  # nothing partial was left by a refused group
    assert _litter(root) == []


def _churn(root: Path, m: int, occupied: Path, seconds: float, out: Path, start) -> None:
    table = FencedTargetLeaseTable(root, f"m{m}", ttl=60, lock_timeout=5, fsync=False)
    rng = random.Random(m)
    groups = [(11, 22), (22, 33), (33, 11), (22, 11), (11, 22, 33), (44,), (33, 44)]
    start.wait()
    claims = violations = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        group = rng.choice(groups)
        claim = table.claim_group(group)
        if claim is None:
            continue
        claims += 1
        markers = []
        for t in group:
            try:
                fd = os.open(occupied / str(t), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                os.close(fd)
                markers.append(occupied / str(t))
            except FileExistsError:
                violations += 1
        time.sleep(0.001)
        for marker in markers:
            marker.unlink()
        assert table.release(group, claim.token) == len(group)
    out.write_text(json.dumps([claims, violations]))


def test_groups_are_held_exclusively_under_churn(tmp_path):
    root, occupied = tmp_path / "targets", tmp_path / "occupied"
    occupied.mkdir()
    codes = _run(_churn, lambda m: (root, m, occupied, 1.5, tmp_path / f"out-{m}"), 3)
    assert codes == [0, 0, 0]
    results = [json.loads((tmp_path / f"out-{m}").read_text()) for m in range(3)]
    assert all(claims > 0 for claims, _ in results)
    assert sum(v for _, v in results) == 0
    assert list(FencedTargetLeaseTable(root, "check", fsync=False).records()) == []


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
        temporary = path.with_name(f".tmp-{path.name}.{os.getpid()}")
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
    table = FencedWorkLeaseTable(root, "child", ttl=10, clock=ManualClock(T0),
                                 writer=_killing_writer(kill_at, point))
    lease = table.claim(item)
    table.begin_commit(item, lease.token)
    table.complete(item, lease.token)


POINTS = ["temp-partial", "temp-synced", "replaced"]


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("kill_at", [1, 2, 3])
def test_sigkill_inside_a_work_write_leaves_a_recoverable_record(tmp_path, kill_at, point):
    root, item = tmp_path / "work", work_id("crash")
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
    list(table.records())  # a scan sweeps the dead writer's temporary file
    assert table.read(item).status == "done"
    assert table.statistics().dead_locks_cleared == 1
    assert table.statistics().quarantined == 0
    assert _litter(root) == []


def _group_child(root: Path, group: list[int], kill_at: int, point: str) -> None:
    table = FencedTargetLeaseTable(root, "child", ttl=10, clock=ManualClock(T0),
                                   writer=_killing_writer(kill_at, point))
    table.claim_group(group)


@pytest.mark.parametrize("point", ["temp-partial", "replaced"])
@pytest.mark.parametrize("kill_at", [1, 2, 4])
def test_sigkill_inside_a_group_claim_blocks_at_most_until_ttl(tmp_path, kill_at, point):
    root, group = tmp_path / "targets", [101, 102, 103, 104]
    child = FORK.Process(target=_group_child, args=(root, group, kill_at, point))
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL

    clock = ManualClock(T0)
    table = FencedTargetLeaseTable(root, "parent", ttl=10, clock=clock, lock_timeout=1)
    records = [table.read(t) for t in group]  # every member readable
    written = kill_at if point == "replaced" else kill_at - 1
    partial = [r for r in records if r is not None]
    assert len(partial) == written and len({r.token for r in partial}) <= 1
    claim = table.claim_group([*group, 105])
    assert (claim is None) == (written > 0)  # a partial group blocks...
    if claim is None:
        clock.advance(10)
        claim = table.claim_group([*group, 105])  # ...until its TTL, no longer
        assert claim is not None and len(claim.taken_over) == written
    assert table.release(claim.group, claim.token) == 5
    list(table.records())
    assert table.statistics().dead_locks_cleared >= 1
    assert _litter(root) == []


# --- SIGKILL at random moments ------------------------------------------------------------------


def _busy_master(root: Path, round_: int) -> None:
    work = FencedWorkLeaseTable(root / "work", "busy", ttl=0.3, lock_timeout=2)
    targets = FencedTargetLeaseTable(root / "targets", "busy", ttl=0.3, lock_timeout=2)
    rng = random.Random(round_)
    for j in range(10_000):
        item = work_id(f"{round_}-{j}")
        lease = work.claim(item)
        if lease and rng.random() < 0.8 and work.begin_commit(item, lease.token):
            work.complete(item, lease.token)
        group = rng.sample(range(1, 13), rng.randint(1, 6))
        claim = targets.claim_group(group)
        if claim and rng.random() < 0.7:
            targets.release(group, claim.token)


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
        work = FencedWorkLeaseTable(tmp_path / "work", "rescuer", clock=later, lock_timeout=2)
        for lease in work.recover_expired():
            assert work.begin_commit(lease.work_id, lease.token)
            assert work.complete(lease.work_id, lease.token)
        for record in work.records():
            if record.status == "committing":  # F443: redo committing with its own token
                assert work.complete(record.work_id, record.token)
        assert {r.status for r in work.records()} <= {"done"}
        targets = FencedTargetLeaseTable(tmp_path / "targets", "rescuer", clock=later,
                                         lock_timeout=2)
        claim = targets.claim_group(range(1, 13))
        assert claim is not None and targets.release(claim.group, claim.token) == 12
        assert list(targets.records()) == []  # the scan also sweeps dead writers' temporaries
        for table in (work, targets):
            assert table.statistics().quarantined == 0
            cleared += table.statistics().dead_locks_cleared
        assert _litter(tmp_path / "work") == [] and _litter(tmp_path / "targets") == []
    assert cleared > 0  # some kills did land inside an update, holding its lock
