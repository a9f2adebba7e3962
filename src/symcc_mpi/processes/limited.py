"""Child processes under limits: each in a process group of its own, which one kill ends with
whatever it started, under an address-space limit, without core dumps, within a time limit.

Every run of a target goes through here: the SymCC executor's exec'd runs and its forkserver,
the witness, the coverage probe's AFL build, Triton's native runs.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

__all__ = ["Ended", "exit_status", "kill_group", "no_core_dumps", "run", "start", "wait_or_kill"]

# What Popen takes as a standard stream: a constant (DEVNULL, PIPE), a descriptor or a file.
Stream = int | IO | None


@dataclass(frozen=True)
class Ended:
    """How one run ended: its exit status (-N: killed by signal N) unless it timed out."""

    status: int
    timed_out: bool


def exit_status(wait_status: int) -> int:
    """An os.wait() status as Popen.returncode says it: the exit code, or -N for signal N."""
    if os.WIFSIGNALED(wait_status):
        return -os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


def kill_group(pgid: int) -> None:
    """SIGKILL to the process group `pgid`; nothing if it is gone already."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def no_core_dumps() -> None:
    """This process, and what it starts from now on, dumps no core when it crashes."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))


def _limit_memory(megabytes: int) -> None:
    limit = megabytes << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _child_setup(memory_limit_mb: int | None, no_core: bool) -> Callable[[], None] | None:
    """What runs in the child before exec, None when nothing needs to: with a preexec_fn
    Python forks instead of vforking, which costs ~2 ms of every run."""
    if not memory_limit_mb and not no_core:
        return None

    def setup() -> None:
        if no_core:
            no_core_dumps()
        if memory_limit_mb:
            _limit_memory(memory_limit_mb)

    return setup


def start(argv: Sequence[str], *, env: Mapping[str, str] | None, stdin: Stream = subprocess.DEVNULL,
          stdout: Stream = subprocess.DEVNULL, stderr: Stream = subprocess.DEVNULL,
          memory_limit_mb: int | None = None, no_core: bool = False, own_group: bool = True,
          cwd: Path | str | None = None, pass_fds: Sequence[int] = ()) -> subprocess.Popen:
    """`argv` started under `memory_limit_mb` of address space (None or 0: no limit), with no
    core dumps if `no_core`. `own_group`: in a session of its own, so that kill_group(pid)
    ends it and its descendants; else in the caller's group, which its owner kills whole
    (Triton's native run, in the server's child). OSError: it could not be started."""
    return subprocess.Popen(
        list(argv), stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd,
        start_new_session=own_group, close_fds=True, pass_fds=tuple(pass_fds),
        preexec_fn=_child_setup(memory_limit_mb, no_core))


def wait_or_kill(process: subprocess.Popen, timeout: float) -> Ended:
    """Wait for `process` (started in its own group) to end, killing its group after
    `timeout`; then kill the group anyway, for the descendants it left behind."""
    timed_out = False
    try:
        status = process.wait(max(timeout, 0.0))
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(process.pid)
        status = process.wait()
    kill_group(process.pid)
    return Ended(status, timed_out)


def run(argv: Sequence[str], env: Mapping[str, str] | None, *, stdin: Path | None,
        timeout: float, memory_limit_mb: int | None = None, cwd: Path | str | None = None,
        capture: Literal["stderr", "stdout"] = "stderr",
        started: Callable[[int | None], None] | None = None) -> tuple[Ended, bytes]:
    """Run `argv` in a group of its own to its end, or kill the group after `timeout`; its end
    and what it wrote on `capture` (the other stream goes to /dev/null). `stdin`: the file to
    read on stdin (None: /dev/null). `started(pid)` is called once it runs, `started(None)`
    once it has ended (what a caller's `cancel` kills). OSError: it could not be started."""
    stdin_file = subprocess.DEVNULL if stdin is None else open(stdin, "rb")
    try:
        process = start(argv, env=env, stdin=stdin_file,
                        stdout=subprocess.PIPE if capture == "stdout" else subprocess.DEVNULL,
                        stderr=subprocess.PIPE if capture == "stderr" else subprocess.DEVNULL,
                        memory_limit_mb=memory_limit_mb, cwd=cwd)
    finally:
        if stdin_file is not subprocess.DEVNULL:
            stdin_file.close()
    if started is not None:
        started(process.pid)
    timed_out = False
    try:
        output = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(process.pid)
        output = process.communicate()
    finally:
        if started is not None:
            started(None)
    kill_group(process.pid)  # descendants it left behind
    return Ended(process.returncode, timed_out), output[0 if capture == "stdout" else 1]
