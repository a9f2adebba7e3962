"""The work-lease table under real processes: concurrent masters, SIGKILL inside a log write
and while holding a shard's lock, SIGKILL at random moments."""

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

from symcc_mpi.durable.clock import ManualClock
from symcc_mpi.durable.locks import LockTimeout
from symcc_mpi.federation.leases import FencedWorkLeaseTable
from symcc_mpi.federation.shards import InvalidRecord
from symcc_mpi.federation.work_leases import WorkLease, decode_lease

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
    """Anything in a table but its description and its shards' logs, and any log that does
    not end in a whole line."""
    logs = root / "logs"
    found = [str(path) for path in root.rglob("*")
             if path not in (root / "table.json", logs)
             and not (path.parent == logs and path.suffix == ".log" and path.is_file())]
    return found + [f"{log}: torn tail" for log in logs.glob("*.log")
                    if (data := log.read_bytes()) and not data.endswith(b"\n")]


def _log_lines(root: Path) -> tuple[list[WorkLease], int]:
    """Every whole line of the table's logs, decoded, and how many did not decode."""
    records, corrupt = [], 0
    for log in sorted((root / "logs").glob("*.log")):
        data = log.read_bytes()
        for line in data[: data.rfind(b"\n") + 1].splitlines():
            try:
                records.append(decode_lease(line))
            except InvalidRecord:
                corrupt += 1
    return records, corrupt


def _torn_logs(root: Path) -> int:
    return sum(1 for log in (root / "logs").glob("*.log")
               if (data := log.read_bytes()) and not data.endswith(b"\n"))


def _touch_every_shard(table: FencedWorkLeaseTable) -> None:
    """A lock round of each shard that changes nothing (it cuts a torn tail, if any)."""
    wanted, n = set(range(table.shards)), 0
    while wanted:
        digest = digest_of(f"touch-{n}")
        n += 1
        if table.shard_of(digest) in wanted:
            wanted.discard(table.shard_of(digest))
            assert not table.abandon(digest, "no-such-token")


# --- several masters, one directory -------------------------------------------------------------


def _work_master(root: Path, m: int, ids: list[str], out: Path, start) -> None:
    table = FencedWorkLeaseTable(root, f"m{m}", ttl=60, lock_timeout=5, shards=4)
    order = ids if m % 2 == 0 else ids[::-1]
    start.wait()
    won = []
    if m < 2:  # one input at a time
        for i in order:
            lease = table.claim(i, origin="generated")
            if lease is not None:
                assert table.begin_commit(i, lease.token)
                assert table.complete(i, lease.token)
                won.append(i)
    else:  # pipelined: the fences of the results in hand carry the claims of the next inputs
        held: dict[str, WorkLease] = {}
        for k in range(0, len(order) + 5, 5):
            fenced = table.fence({i: lease.token for i, lease in held.items()},
                                 claims=order[k:k + 5])
            assert fenced.committing == set(held)
            for i in sorted(fenced.committing):
                assert table.complete(i, held[i].token)
                won.append(i)
            held = fenced.claimed
        assert not held
    table.flush()  # else the last done lines are never written
    table.close()
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
    records = {r.digest: r for r in table.records()}
    assert set(records) == set(ids)
    for m, items in enumerate(won):
        for i in items:
            assert records[i].status == "done" and records[i].owner == f"m{m}"
            assert records[i].attempts == 1 and records[i].payload.origin == "generated"
    # Three lines an item (leased, committing, done) and nothing else: a refusal writes none.
    lines, corrupt = _log_lines(root)
    assert corrupt == 0 and len(lines) == 3 * len(ids)
    assert sorted(r.status for r in lines) == sorted(["leased", "committing", "done"] * len(ids))
    stats = table.statistics()
    assert (stats.corrupt_lines, stats.torn_tails) == (0, 0) and _litter(root) == []


# --- SIGKILL at chosen points inside a write ----------------------------------------------------


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _killing_writer(kill_at: int, point: str):
    """The log's writer, dying at its `kill_at`-th call: `before` writing anything, after a
    `partial` write (half the bytes: a newline-less tail), or after the `whole` write, before
    returning."""
    count = 0

    def write(fd: int, data: bytes) -> int:
        nonlocal count
        count += 1
        if count == kill_at:
            if point == "partial":
                os.write(fd, data[: len(data) // 2])
            elif point == "whole":
                os.write(fd, data)
            _die()
        return os.write(fd, data)

    return write


def _work_child(root: Path, item: str, kill_at: int, point: str) -> None:
    table = FencedWorkLeaseTable(root, "child", ttl=10, lock_timeout=5, shards=1,
                                 clock=ManualClock(T0), writer=_killing_writer(kill_at, point))
    lease = table.claim(item)  # write 1
    table.begin_commit(item, lease.token)  # write 2
    table.complete(item, lease.token)  # deferred: no write
    table.flush()  # write 3
    os._exit(3)  # not killed: the test fails on the exit code


def _others(root: Path) -> dict[str, WorkLease]:
    """Records of another master in the same log, one of each status."""
    setup = FencedWorkLeaseTable(root, "setup", ttl=10**7, lock_timeout=1, shards=1,
                                 clock=ManualClock(T0))
    ids = [digest_of(f"other-{k}") for k in range(3)]
    held = setup.claim_many(ids)
    assert setup.fence({i: held[i].token for i in ids[1:]}).committing == set(ids[1:])
    assert setup.complete(ids[2], held[ids[2]].token) and setup.flush() == 1
    records = {i: setup.read(i) for i in ids}
    assert [r.status for r in records.values()] == ["leased", "committing", "done"]
    setup.close()
    return records


POINTS = ["before", "partial", "whole"]


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("kill_at", [1, 2, 3])
def test_sigkill_inside_a_work_write_leaves_a_recoverable_record(tmp_path, kill_at, point):
    root, item = tmp_path / "work", digest_of("crash")
    others = _others(root)
    child = FORK.Process(target=_work_child, args=(root, item, kill_at, point))
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL

    log = root / "logs" / "0.log"
    assert log.read_bytes().endswith(b"\n") == (point != "partial")
    clock = ManualClock(T0)
    parent = FencedWorkLeaseTable(root, "parent", ttl=10, clock=clock, lock_timeout=1,
                                  sleep=clock.advance)
    landed = kill_at if point == "whole" else kill_at - 1
    record = parent.read(item)  # readable: the state before the write, or after the whole line
    assert (record.status if record else None) == [None, "leased", "committing", "done"][landed]
    if record is not None:
        assert record.owner == "child" and record.token and record.attempts == 1
    assert {i: parent.read(i) for i in others} == others  # nothing lost of other records
    assert (parent.statistics().torn_tails, parent.statistics().corrupt_lines) == (0, 0)

    table = parent
    if record is None:
        lease = parent.claim(item)  # at once: the kernel dropped the dead child's lock
        assert lease.attempts == 1
    elif record.status == "leased":
        assert parent.claim(item) is None  # still the child's until its TTL
        clock.advance(10)
        (lease,) = parent.recover_expired()
        assert (lease.digest, lease.steals, lease.attempts) == (item, 1, 2)
    elif record.status == "committing":
        clock.advance(3600)
        assert parent.recover_expired() == [] and parent.claim(item) is None  # never stolen
        # Only the dead holder's successor (its owner name) takes it over: leased anew.
        table = FencedWorkLeaseTable(root, "child", ttl=10, clock=clock, lock_timeout=1,
                                     sleep=clock.advance)
        (lease,) = table.adopt(lambda digest: False)
        assert (lease.digest, lease.status, lease.attempts) == (item, "leased", 2)
    else:
        lease = None
        assert parent.claim(item) is None
    # The torn tail is cut off by the first lock round after the kill.
    assert parent.statistics().torn_tails == (1 if point == "partial" else 0)
    assert log.read_bytes().endswith(b"\n")
    if lease is not None:
        assert table.begin_commit(item, lease.token) and table.complete(item, lease.token)
        assert table.flush() == 1
    check = FencedWorkLeaseTable(root, "check", ttl=10, lock_timeout=1)
    assert check.read(item).status == "done"
    assert {i: check.read(i) for i in others} == others
    assert check.statistics().corrupt_lines == 0
    assert _log_lines(root)[1] == 0 and _litter(root) == []


def _batch_child(root: Path, items: list[str]) -> None:
    table = FencedWorkLeaseTable(root, "child", ttl=10, lock_timeout=5, shards=1,
                                 clock=ManualClock(T0), writer=_killing_writer(1, "partial"))
    table.claim_many(items)  # one write of three lines, killed half-way
    os._exit(3)


def test_sigkill_inside_a_batch_keeps_its_whole_lines_and_cuts_the_torn_one(tmp_path):
    """Lines of a batch before the tear stand: each was decided under the lock on its own,
    and the dead writer acted on none of them."""
    root, items = tmp_path / "work", [digest_of(f"batch-{k}") for k in range(3)]
    others = _others(root)
    child = FORK.Process(target=_batch_child, args=(root, items))
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL
    clock = ManualClock(T0)
    parent = FencedWorkLeaseTable(root, "parent", ttl=10, clock=clock, lock_timeout=1,
                                  sleep=clock.advance)
    first = parent.read(items[0])
    assert first.owner == "child" and first.status == "leased"  # half of three lines
    assert parent.read(items[1]) is None and parent.read(items[2]) is None
    assert set(parent.claim_many(items)) == set(items[1:])  # cuts the torn second line
    assert parent.statistics().torn_tails == 1
    clock.advance(10)
    assert [lease.digest for lease in parent.recover_expired()] == [items[0]]
    assert {i: parent.read(i) for i in others} == others
    assert _log_lines(root)[1] == 0 and _litter(root) == []


# --- a lock holder killed while holding the lock ------------------------------------------------


def _stuck_in_write(root: Path, item: str, inside) -> None:
    def write(fd: int, data: bytes) -> int:
        os.write(fd, data[: len(data) // 2])
        inside.set()
        time.sleep(120)  # holding the shard's lock, until the parent kills it
        return 0

    table = FencedWorkLeaseTable(root, "stuck", ttl=10, lock_timeout=5, shards=1, writer=write)
    table.claim(item)
    os._exit(3)


def test_a_lock_holder_killed_inside_a_write_does_not_wedge_the_shard(tmp_path):
    root, item = tmp_path / "work", digest_of("stuck")
    FencedWorkLeaseTable(root, "setup", ttl=10, lock_timeout=1, shards=1).close()
    inside = FORK.Event()
    child = FORK.Process(target=_stuck_in_write, args=(root, item, inside))
    child.start()
    parent = FencedWorkLeaseTable(root, "parent", ttl=10, lock_timeout=1)
    try:
        assert inside.wait(30)
        # While its holder lives, the lock holds, and the wait for it is bounded.
        started = time.monotonic()
        with pytest.raises(LockTimeout):
            parent.claim(item)
        assert time.monotonic() - started >= 1
        assert parent.read(item) is None  # reading takes no lock, and skips the torn half
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)
    assert child.exitcode == -signal.SIGKILL
    # Its holder dead, the kernel has dropped the lock: no wait, no breaking, no timeout.
    started = time.monotonic()
    lease = parent.claim(item)
    assert time.monotonic() - started < 0.9
    assert lease is not None and lease.owner == "parent"
    stats = parent.statistics()
    assert (stats.lock_waits, stats.torn_tails, stats.writes) == (0, 1, 1)
    assert _log_lines(root) == ([lease], 0) and _litter(root) == []


# --- SIGKILL at random moments ------------------------------------------------------------------


def _slow_writer(fd: int, data: bytes) -> int:
    """A write in pieces, a little at a time: most random kills land inside one."""
    time.sleep(0.0003)
    return os.write(fd, data[:64])


def _busy_master(root: Path, round_: int) -> None:
    work = FencedWorkLeaseTable(root, f"busy-{round_}", ttl=0.3, lock_timeout=2, shards=4,
                                writer=_slow_writer)
    rng = random.Random(round_)
    held: dict[str, str] = {}
    for j in range(10_000):
        item = digest_of(f"{round_}-{j}")
        if rng.random() < 0.5:
            lease = work.claim(item)
            if lease and rng.random() < 0.8 and work.begin_commit(item, lease.token):
                work.complete(item, lease.token)
        else:  # the pipelined path: fence what is held, claim the next one with it
            fenced = work.fence(held, claims=[item])
            for digest in fenced.committing:
                work.complete(digest, held[digest])
            held = {d: lease.token for d, lease in fenced.claimed.items()}
        if rng.random() < 0.1:
            work.flush()
        if rng.random() < 0.1:
            work.heartbeat_many(held)


@pytest.mark.slow
def test_random_sigkills_leave_readable_consistent_tables(tmp_path):
    rng = random.Random(7)
    root = tmp_path / "work"
    FencedWorkLeaseTable(root, "setup", ttl=1, lock_timeout=1, shards=4).close()
    torn = 0
    for round_ in range(25):
        child = FORK.Process(target=_busy_master, args=(root, round_))
        child.start()
        time.sleep(rng.uniform(0.02, 0.15))
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        assert child.exitcode == -signal.SIGKILL  # it was killed, it had not failed

        # Readable and consistent as the dead master left it: whole lines only, a torn
        # tail at most, earlier rounds all done, this round's records all its own.
        tails = _torn_logs(root)
        assert tails <= 1  # the dead master was inside one write at most
        reader = FencedWorkLeaseTable(root, "reader", ttl=1, lock_timeout=1)
        mine = {digest_of(f"{round_}-{j}") for j in range(10_000)}
        for record in reader.records():
            if record.digest in mine:
                assert record.owner == f"busy-{round_}" and record.token
                assert (record.attempts, record.steals) == (1, 0)
            else:
                assert record.status == "done"
        assert reader.statistics().corrupt_lines == 0 and _log_lines(root)[1] == 0
        reader.close()

        # Long after every TTL, a rescuer takes over what is leased, and the dead master's
        # successor what is committing (never stolen); then everything gets done.
        later = ManualClock(time.time() + 3600)
        work = FencedWorkLeaseTable(root, "rescuer", ttl=0.3, clock=later, lock_timeout=2,
                                    sleep=later.advance)
        for lease in work.recover_expired():
            assert lease.steals == 1 and lease.digest in mine
            assert work.begin_commit(lease.digest, lease.token)
            assert work.complete(lease.digest, lease.token)
        _touch_every_shard(work)  # every torn tail is cut at the next lock round
        work.flush()
        done = {r.digest for r in work.records() if r.status == "done"}
        successor = FencedWorkLeaseTable(root, f"busy-{round_}", ttl=0.3, clock=later,
                                         lock_timeout=2, sleep=later.advance)
        adopted = {lease.digest: lease.token for lease in successor.adopt(done.__contains__)}
        assert successor.fence(adopted).committing == set(adopted)
        for digest, token in adopted.items():
            assert successor.complete(digest, token)
        assert successor.flush() == len(adopted)
        assert {r.status for r in work.records()} <= {"done"}
        assert work.statistics().torn_tails == tails and _torn_logs(root) == 0
        torn += tails
        assert _litter(root) == []
        work.close()
        successor.close()
    assert torn > 0  # some kills did land inside a write, holding its shard's lock
