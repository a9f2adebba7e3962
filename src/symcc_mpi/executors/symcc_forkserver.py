"""SymCC runs forked from one process of the target stopped right after SymCC's runtime made
its Z3 context (the forkserver of symcc_preload.c).

An exec'd run pays the exec, the dynamic linking of libsymcc-rt, libz3 and libstdc++, and a
fresh Z3 context before it reads its input: ~13 ms of a ~19 ms pruned run of the bundled json
parser, measured. A forked run starts past all of that. What the child does from there on is
what an exec'd run does: SymCC's runtime reads QSYM's map and the input only after the fork,
under the environment the forkserver started with (so one forkserver serves one input path,
output directory and map path).

A target that never reaches SymCC's Z3 context (not built with SymCC, or its runtime linked
statically) never says hello: it runs to its end as an ordinary process, and that is the
run's result. The executor then execs every later run.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.processes.limited import Ended, exit_status, kill_group, start, wait_or_kill
from symcc_mpi.processes.wordpipe import PipeClosed, read_word, write_word

HELLO = 0x53464D53  # "SMFS", symcc_preload.c's FORKSERVER_HELLO
ANSWER_WITHIN = 30.0  # seconds for a fork or a killed child's status, however busy the host


class ForkserverDied(Exception):
    """The forkserver ended while a child of it ran: that run's end is unknown."""


class SymccForkserver:
    """One forkserver: `argv` under `env`, the input on stdin from `stdin` if given, every
    run's stderr in `stderr`, each process under `memory_limit_mb` of address space."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], *, stdin: Path | None,
                 stderr: Path, memory_limit_mb: int | None):
        self.argv = list(argv)
        self.env = dict(env)
        self.stdin = stdin
        self.stderr = stderr
        self.memory_limit_mb = memory_limit_mb
        self._process: subprocess.Popen | None = None
        self._control: int | None = None
        self._status: int | None = None
        self._child: int | None = None  # the process group of the run in progress

    def start(self, timeout: float) -> Ended | None:
        """Start it and wait for its hello: None once it waits for requests. A target that
        ends without one ran as an ordinary process: its end is returned, within `timeout`
        (then it is killed). OSError: it could not be started."""
        control_read, control_write = os.pipe()
        status_read, status_write = os.pipe()
        env = {**self.env, "SYMCC_MPI_FORKSERVER": f"{control_read},{status_write}",
               "SYMCC_MPI_STDERR": str(self.stderr)}
        if self.stdin is not None:
            env["SYMCC_MPI_STDIN"] = str(self.stdin)
        try:
            with open(self.stderr, "wb") as stderr, \
                    open(self.stdin or os.devnull, "rb") as stdin:
                self._process = start(self.argv, env=env, stdin=stdin, stderr=stderr,
                                      memory_limit_mb=self.memory_limit_mb,
                                      pass_fds=(control_read, status_write))
        finally:
            os.close(control_read)
            os.close(status_write)
            if self._process is None:
                os.close(control_write)
                os.close(status_read)
        self._control, self._status = control_write, status_read
        deadline = SYSTEM_CLOCK.monotonic() + timeout
        try:
            if read_word(self._status, timeout) == HELLO:
                return None
        except PipeClosed:
            pass  # it ended, or closed the pipe: an ordinary run
        ended = wait_or_kill(self._process, deadline - SYSTEM_CLOCK.monotonic())
        self.close()
        return ended

    def run(self, timeout: float) -> Ended:
        """One child, to its end or killed (with its process group) after `timeout`.
        PipeClosed: the forkserver was gone before it forked (nothing ran);
        ForkserverDied: it died while the child ran."""
        write_word(self._control, 0)
        pid = read_word(self._status, ANSWER_WITHIN)
        if pid is None:
            raise PipeClosed
        if pid == 0:
            raise OSError("the SymCC forkserver could not fork")
        self._child = pid
        try:
            wait_status = read_word(self._status, timeout)
            timed_out = wait_status is None
            if timed_out:
                kill_group(pid)
                wait_status = read_word(self._status, ANSWER_WITHIN)
                if wait_status is None:
                    raise PipeClosed
        except PipeClosed:
            kill_group(pid)
            raise ForkserverDied from None
        finally:
            self._child = None
        kill_group(pid)  # what the run left behind
        return Ended(exit_status(wait_status), timed_out)

    def cancel(self) -> None:
        """From another thread: end the run in progress (or the start) now."""
        child, process = self._child, self._process
        if child is not None:
            kill_group(child)
        elif process is not None:
            kill_group(process.pid)

    def close(self) -> None:
        """Stop it (its run in progress too); safe to call twice."""
        for name in ("_control", "_status"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)  # the forkserver reads the end of its requests and exits
                setattr(self, name, None)
        process, self._process = self._process, None
        if process is not None:
            kill_group(process.pid)
            process.wait()
