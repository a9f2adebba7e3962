"""One run of a target as a process of its own: in a session of its own (a timeout kills the
whole group), under an address-space limit, its input on stdin or as a file."""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from symcc_mpi.executors.symcc_forkserver import Ended, kill_group, limit_memory


def run_once(argv: Sequence[str], env: Mapping[str, str] | None, *, stdin: Path | None,
             timeout: float, memory_limit_mb: int | None = None,
             started: Callable[[int | None], None] | None = None) -> tuple[Ended, bytes]:
    """Run `argv` to its end, or kill its group after `timeout`; its end and its stderr.
    `stdin`: the file to read on stdin (None: /dev/null). `started(pid)` is called once it
    runs, and `started(None)` once it has ended (what `cancel` of a caller kills).
    OSError: it could not be started."""
    stdin_file = subprocess.DEVNULL if stdin is None else open(stdin, "rb")
    try:
        # No preexec_fn unless a limit needs one: with it Python forks instead of vforking,
        # which costs ~2 ms of every run. The core limit is inherited.
        process = subprocess.Popen(
            list(argv), stdin=stdin_file, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env=env, start_new_session=True, close_fds=True,
            preexec_fn=functools.partial(limit_memory, memory_limit_mb)
            if memory_limit_mb else None,
        )
    finally:
        if stdin_file is not subprocess.DEVNULL:
            stdin_file.close()
    if started is not None:
        started(process.pid)
    timed_out = False
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(process.pid)
        _, stderr = process.communicate()
    finally:
        if started is not None:
            started(None)
    kill_group(process.pid)  # descendants the target left behind
    return Ended(process.returncode, timed_out), stderr
