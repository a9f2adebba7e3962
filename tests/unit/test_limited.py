"""The limited-subprocess helper (processes/limited.py): what every run of a target goes
through: its end as a status, its group killed on a timeout, its limits, its output."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time

from symcc_mpi.processes import limited
from symcc_mpi.processes.limited import Ended


def test_an_exit_code_and_a_signal_death(tmp_path):
    assert limited.run(["sh", "-c", "exit 3"], None, stdin=None, timeout=30)[0] == Ended(3, False)
    ended, _ = limited.run(["sh", "-c", "kill -SEGV $$"], None, stdin=None, timeout=30)
    assert ended == Ended(-signal.SIGSEGV, False)


def test_stdin_and_the_captured_stream(tmp_path):
    (tmp_path / "input").write_bytes(b"from the file")
    command = ["sh", "-c", "cat; echo to-stderr >&2"]
    assert limited.run(command, None, stdin=tmp_path / "input", timeout=30)[1] == b"to-stderr\n"
    _, out = limited.run(command, None, stdin=tmp_path / "input", timeout=30, capture="stdout")
    assert out == b"from the file"
    assert limited.run(["cat"], None, stdin=None, timeout=30, capture="stdout")[1] == b""


def test_a_timeout_kills_the_group_and_says_so(tmp_path):
    calls = []
    started = time.monotonic()
    ended, _ = limited.run(["sh", "-c", "sleep 120 & sleep 120"], None, stdin=None,
                           timeout=0.5, started=calls.append)
    assert ended.timed_out and ended.status == -signal.SIGKILL
    assert time.monotonic() - started < 60  # the background sleep held no pipe open
    assert len(calls) == 2 and calls[0] > 0 and calls[1] is None
    assert group_gone_within(calls[0], 30), "a process of the timed-out group survived"


def group_gone_within(pgid: int, seconds: float) -> bool:
    """Whether the group has no process left within `seconds` (killed ones are reaped by
    init, or whichever subreaper adopted them, a moment later)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def test_wait_or_kill_and_exit_status():
    process = limited.start(["sleep", "120"], env=None)
    assert limited.wait_or_kill(process, 0.2) == Ended(-signal.SIGKILL, True)
    assert limited.wait_or_kill(limited.start(["true"], env=None), 30) == Ended(0, False)
    assert limited.exit_status(0x0300) == 3 and limited.exit_status(signal.SIGABRT) == -6


def test_limits_and_groups_in_the_child():
    probe = ("import os, resource; print(resource.getrlimit(resource.RLIMIT_AS)[0], "
             "resource.getrlimit(resource.RLIMIT_CORE)[0], os.getpgid(0) == os.getpid())")
    process = limited.start([sys.executable, "-c", probe], env=None, stdout=subprocess.PIPE,
                            memory_limit_mb=1024, no_core=True)
    out, _ = process.communicate(timeout=60)
    assert out.split() == [str(1024 << 20).encode(), b"0", b"True"]
    process = limited.start([sys.executable, "-c", probe], env=None, stdout=subprocess.PIPE,
                            memory_limit_mb=0, own_group=False)
    out, _ = process.communicate(timeout=60)
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    assert out.split()[0] == str(soft).encode() and out.split()[2] == b"False"
