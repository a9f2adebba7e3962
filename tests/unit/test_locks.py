"""Bounded lock-directory locks: deadline, fail closed, age reported not acted on, dead holders."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from symcc_mpi.durable import locks
from symcc_mpi.durable.clock import ManualClock
from symcc_mpi.durable.locks import (
    HOLDER_FILE,
    DirectoryLock,
    LockError,
    LockTimeout,
    break_if_dead,
    sweep_debris,
)

FORK = multiprocessing.get_context("fork")


def _lock(path: Path, clock: ManualClock, timeout: float = 0.5, **kw) -> DirectoryLock:
    return DirectoryLock(path, timeout=timeout, clock=clock, sleep=clock.advance, **kw)


def _inode(path: Path) -> tuple[int, int]:
    st = os.stat(path / HOLDER_FILE)
    return st.st_dev, st.st_ino


def _rewrite_holder(path: Path, **changes) -> None:
    raw = json.loads((path / HOLDER_FILE).read_bytes())
    raw.update(changes)
    (path / HOLDER_FILE).write_text(json.dumps(raw))


def _die_holding(path: Path) -> None:
    """Fork a child that takes the lock and is SIGKILLed while holding it."""
    def child():
        DirectoryLock(path, timeout=1).acquire()
        os.kill(os.getpid(), signal.SIGKILL)

    process = FORK.Process(target=child)
    process.start()
    process.join(10)
    assert process.exitcode == -signal.SIGKILL
    assert path.is_dir()


def test_acquire_release_and_holder_file(tmp_path):
    clock = ManualClock()
    path = tmp_path / "a.lock"
    with _lock(path, clock, label="master-0") as lock:
        assert lock.held and path.is_dir()
        holder = json.loads((path / HOLDER_FILE).read_bytes())
        assert holder["pid"] == os.getpid()
        assert holder["label"] == "master-0"
        assert holder["acquired"] == clock.time()
    assert not lock.held and not path.exists()
    lock.release()  # a second release is a no-op
    assert os.listdir(tmp_path) == []  # no staging or tomb left behind


def test_timeout_fails_closed_and_reports_age(tmp_path):
    clock = ManualClock()
    path = tmp_path / "a.lock"
    holder = _lock(path, clock)
    holder.acquire()
    before = _inode(path)
    clock.advance(3600)  # an hour old by the wall clock: F321, still not breakable
    waiter = _lock(path, clock, timeout=0.25)
    with pytest.raises(LockTimeout) as raised:
        waiter.acquire()
    error = raised.value
    assert isinstance(error, TimeoutError)
    assert error.path == path and str(path) in str(error)
    assert error.waited >= 0.25
    assert error.age == pytest.approx(3600.25)
    assert error.holder is not None and error.holder.pid == os.getpid()
    assert _inode(path) == before and holder.held
    assert sorted(os.listdir(tmp_path)) == ["a.lock"]  # the waiter's staging is gone
    holder.release()
    with _lock(path, clock):
        pass


def test_zero_timeout_tries_once(tmp_path):
    clock = ManualClock()
    path = tmp_path / "a.lock"
    naps = []
    with _lock(path, clock):
        with pytest.raises(LockTimeout):
            DirectoryLock(path, timeout=0, clock=clock, sleep=naps.append).acquire()
    assert naps == []


def test_wait_ends_when_the_holder_releases(tmp_path):
    clock = ManualClock()
    path = tmp_path / "a.lock"
    holder = _lock(path, clock)
    holder.acquire()
    naps = []

    def sleep(seconds):
        naps.append(seconds)
        clock.advance(seconds)
        if len(naps) == 3:
            holder.release()

    waiter = DirectoryLock(path, timeout=5, clock=clock, sleep=sleep)
    waiter.acquire()
    assert waiter.held and waiter.waited == pytest.approx(sum(naps))
    assert naps == sorted(naps)  # backoff grows
    waiter.release()


def test_dead_holder_on_this_kernel_is_cleared(tmp_path):
    path = tmp_path / "a.lock"
    _die_holding(path)
    lock = DirectoryLock(path, timeout=0)
    with lock:
        assert lock.cleared == 1
    assert sorted(os.listdir(tmp_path)) == []


def _die_releasing(path: Path) -> None:
    """Fork a child that takes the lock and is SIGKILLed inside its release, after emptying
    the lock directory and before removing it."""
    def child():
        lock = DirectoryLock(path, timeout=1)
        lock.acquire()
        os.unlink(path / HOLDER_FILE)  # release's first step
        os.kill(os.getpid(), signal.SIGKILL)

    process = FORK.Process(target=child)
    process.start()
    process.join(10)
    assert process.exitcode == -signal.SIGKILL
    assert path.is_dir() and os.listdir(path) == []


def test_an_empty_lock_left_by_a_releaser_killed_mid_release_is_cleared(tmp_path):
    path = tmp_path / "a.lock"
    _die_releasing(path)
    assert break_if_dead(path) and not path.exists()
    _die_releasing(path)
    with DirectoryLock(path, timeout=0):  # free all along: the rename replaces it
        assert (path / HOLDER_FILE).is_file()
    assert os.listdir(tmp_path) == []


def test_holder_on_another_host_is_never_cleared(tmp_path):
    clock = ManualClock()
    path = tmp_path / "a.lock"
    _die_holding(path)  # its flock is free, but a remote flock may be invisible from here
    _rewrite_holder(path, host="elsewhere", boot_id="another-kernel")
    assert not break_if_dead(path)
    with pytest.raises(LockTimeout) as raised:
        _lock(path, clock, timeout=0.05).acquire()
    assert raised.value.holder.host == "elsewhere"
    assert path.is_dir()


def test_holder_from_before_a_reboot_of_this_host_is_cleared(tmp_path):
    path = tmp_path / "a.lock"
    _die_holding(path)
    _rewrite_holder(path, boot_id="an-earlier-boot")
    assert break_if_dead(path)
    assert not path.exists()


def test_holder_without_flock_is_never_cleared(tmp_path):
    path = tmp_path / "a.lock"
    _die_holding(path)
    _rewrite_holder(path, flocked=False)
    assert not break_if_dead(path)
    assert path.is_dir()


def test_live_holder_in_this_process_is_not_cleared(tmp_path):
    path = tmp_path / "a.lock"
    with DirectoryLock(path, timeout=0):
        assert not break_if_dead(path)
        assert (path / HOLDER_FILE).is_file()


def test_an_emptied_lock_directory_is_free(tmp_path):
    # A holder killed between unlinking its holder file and removing the directory.
    path = tmp_path / "a.lock"
    path.mkdir()
    with DirectoryLock(path, timeout=0) as lock:
        assert lock.cleared == 0 and (path / HOLDER_FILE).is_file()
    assert not path.exists()


def test_foreign_lock_without_holder_reports_age_from_mtime(tmp_path):
    clock = ManualClock(start=0.0)
    path = tmp_path / "a.lock"
    path.mkdir()
    (path / "junk").write_text("x")  # an old-style lock: nothing proves its holder is gone
    clock.now = path.stat().st_mtime + 42
    with pytest.raises(LockTimeout) as raised:
        _lock(path, clock, timeout=0.01).acquire()
    assert raised.value.holder is None
    assert raised.value.age == pytest.approx(42, abs=0.1)
    assert path.is_dir()


def test_release_refuses_a_lock_that_is_not_its_own(tmp_path):
    path = tmp_path / "a.lock"
    lock = DirectoryLock(path, timeout=0)
    lock.acquire()
    os.rename(path, tmp_path / "moved")
    other = DirectoryLock(path, timeout=0)
    other.acquire()
    with pytest.raises(LockError):
        lock.release()
    assert other.held and path.is_dir()
    other.release()


def test_sweep_debris_removes_only_dead_processes_leftovers(tmp_path):
    def child():
        os.mkdir(locks._sibling(tmp_path / "a.lock", locks._ACQUIRING))
        os.mkdir(locks._sibling(tmp_path / "b.lock", locks._RELEASED))
        os.kill(os.getpid(), signal.SIGKILL)

    process = FORK.Process(target=child)
    process.start()
    process.join(10)
    mine = locks._sibling(tmp_path / "c.lock", locks._ACQUIRING)
    os.mkdir(mine)
    (tmp_path / "x.lock").mkdir()
    assert len(os.listdir(tmp_path)) == 4
    assert sweep_debris(tmp_path) == 2
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(mine), "x.lock"])


def test_bad_timeout_is_rejected(tmp_path):
    with pytest.raises(ValueError):
        DirectoryLock(tmp_path / "a.lock", timeout=-1)
    with pytest.raises(ValueError):
        DirectoryLock(tmp_path / "a.lock", timeout=float("nan"))


def _count_under_lock(path: Path, counter: Path, rounds: int, start) -> None:
    start.wait()
    for _ in range(rounds):
        with DirectoryLock(path, timeout=10):
            value = int(counter.read_text())
            counter.write_text(str(value + 1))


def test_mutual_exclusion_across_processes(tmp_path):
    path, counter = tmp_path / "a.lock", tmp_path / "counter"
    counter.write_text("0")
    start = FORK.Barrier(4)
    processes = [FORK.Process(target=_count_under_lock, args=(path, counter, 150, start))
                 for _ in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    assert counter.read_text() == "600"
    assert sorted(os.listdir(tmp_path)) == ["counter"]


def _die_or_count(path: Path, counter: Path, rounds: int, start, die: bool) -> None:
    died = counter.with_name("died")
    start.wait()
    for i in range(rounds):
        lock = DirectoryLock(path, timeout=10)
        lock.acquire()
        value = int(counter.read_text())
        counter.write_text(str(value + 1))
        if die and i == rounds // 2:
            died.touch()
            os.kill(os.getpid(), signal.SIGKILL)  # dies holding the lock
        lock.release()
    # A loaded machine may run both waiters to the end before the holder dies: then one more
    # acquisition each, once it died, makes sure that a waiter meets the dead holder's lock.
    # No deadline here (one that passed would skip the meeting the test is about): a holder
    # that never dies fails the test at its joins.
    while not died.exists():
        time.sleep(0.01)
    with DirectoryLock(path, timeout=10):
        pass


def test_waiters_recover_from_a_holder_killed_mid_section(tmp_path):
    path, counter = tmp_path / "a.lock", tmp_path / "counter"
    counter.write_text("0")
    start = FORK.Barrier(3)
    processes = [FORK.Process(target=_die_or_count, args=(path, counter, 100, start, i == 0))
                 for i in range(3)]
    for process in processes:
        process.start()
    try:
        for process in processes:
            process.join(60)
    finally:
        for process in processes:
            if process.is_alive():  # the test failed: leave nothing behind
                process.kill()
                process.join()
    assert [p.exitcode for p in processes] == [-signal.SIGKILL, 0, 0]
    assert counter.read_text() == str(51 + 200)
    assert sorted(os.listdir(tmp_path)) == ["counter", "died"]
