"""The target-group lease table under real processes: masters racing for overlapping groups,
and a master killed between two member writes."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

from symcc_mpi.durable.atomic import write_durable
from symcc_mpi.durable.clock import ManualClock
from symcc_mpi.federation.target_leases import FencedTargetLeaseTable, target_id

FORK = multiprocessing.get_context("fork")
TARGETS = range(1, 7)
MASTERS = 4
SECONDS = 2.0


def _master(root: Path, m: int, out: Path, start) -> None:
    """Claim, hold briefly and release random overlapping groups until time is up; log each
    held interval as (target, token, t_claimed, t_released) on the shared monotonic clock."""
    table = FencedTargetLeaseTable(root, owner=f"m{m}", ttl=3600, lock_timeout=5)
    rng = random.Random(m)
    held, refused = [], 0
    start.wait()
    deadline = time.monotonic() + SECONDS
    while time.monotonic() < deadline:
        group = rng.sample(TARGETS, rng.randint(1, 3))
        token = table.claim_group(group, worker=m)
        if token is None:
            refused += 1
            continue
        claimed = time.monotonic_ns()
        time.sleep(rng.uniform(0, 0.002))
        released = time.monotonic_ns()
        assert table.release(token, group) == len(group)
        held += [(target, token, claimed, released) for target in group]
    out.write_text(json.dumps({"held": held, "refused": refused}))


def test_no_two_tokens_hold_one_target_at_once(tmp_path):
    root = tmp_path / "targets"
    start = FORK.Barrier(MASTERS)
    outs = [tmp_path / f"master-{m}.json" for m in range(MASTERS)]
    processes = [FORK.Process(target=_master, args=(root, m, outs[m], start))
                 for m in range(MASTERS)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(30)
        if process.is_alive():
            process.kill()
            process.join()
    assert [process.exitcode for process in processes] == [0] * MASTERS

    logs = [json.loads(out.read_text()) for out in outs]
    assert all(log["held"] and log["refused"] for log in logs)  # every master won and lost
    by_target: dict[int, list[tuple[int, int, str]]] = {}
    for log in logs:
        for target, token, claimed, released in log["held"]:
            by_target.setdefault(target, []).append((claimed, released, token))
    for target, intervals in by_target.items():
        intervals.sort()
        for (_, end, token), (begin, _, next_token) in itertools.pairwise(intervals):
            assert token != next_token and end < begin, (target, token, next_token)

    table = FencedTargetLeaseTable(root, owner="check", ttl=3600)
    assert table.statistics().leased == table.statistics().expired == 0
    assert os.listdir(root / "locks") == []
    assert not [name for _, _, names in os.walk(root / "records") for name in names]


# --- SIGKILL between two member writes ----------------------------------------------------------

T0 = 2_000_000_000.0  # the ManualClock start shared by the child and the parent that reopens


def _dies_at_second_write(root: Path, group: list[int]) -> None:
    written = 0

    def write(path: Path, data: bytes) -> None:
        nonlocal written
        if written == 1:
            os.kill(os.getpid(), signal.SIGKILL)  # holding every member's lock
        write_durable(path, data)
        written += 1

    table = FencedTargetLeaseTable(root, owner="child", ttl=10, lock_timeout=5,
                                   clock=ManualClock(T0), write=write)
    table.claim_group(group, worker=0)


def test_a_master_killed_mid_claim_leaves_a_conservative_partial_group_that_ttl_ends(tmp_path):
    root, group = tmp_path / "targets", [11, 22, 33]
    child = FORK.Process(target=_dies_at_second_write, args=(root, group))
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL
    assert len(os.listdir(root / "locks")) == 3  # the dead child's locks are still there

    clock = ManualClock(T0)
    table = FencedTargetLeaseTable(root, owner="parent", ttl=10, lock_timeout=1, clock=clock,
                                   sleep=clock.advance)
    assert os.listdir(root / "locks") == []  # reopening cleared them: their holder is dead
    first, *rest = sorted(group, key=target_id)
    assert table.read(first).owner == "child"  # F311 §4: published, though never returned
    assert [table.read(target) for target in rest] == [None, None]
    assert table.claim_group(rest, worker=1) is not None  # the rest was never held
    assert table.claim_group([first], worker=1) is None  # the orphan blocks until its TTL
    clock.advance(10)
    token = table.claim_group([first], worker=1)
    assert table.read(first).token == token and table.read(first).steals == 1
