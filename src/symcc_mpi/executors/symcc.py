"""Runs a SymCC-built target as a subprocess under SymCC's environment contract."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import time
from pathlib import Path

from .base import ExecutionResult, Outcome

_SMT_STAT = re.compile(rb"\[STAT\] SMT:\s*(\{.*?\})")


def solver_seconds(stderr: bytes) -> float:
    """Solver time from SymCC/QSYM's `[STAT] SMT: { "solving_time": N }` lines.

    QSYM prints a running total in microseconds around each query, so the figure of the
    run is the largest value seen, not their sum.
    """
    total = 0
    for match in _SMT_STAT.finditer(stderr):
        try:
            total = max(total, int(json.loads(match.group(1)).get("solving_time", 0)))
        except (ValueError, TypeError, AttributeError):
            continue
    return total / 1e6


class SymccExecutor:
    name = "symcc"

    def __init__(self, target: tuple[str, ...] | list[str], *, timeout: float,
                 memory_limit_mb: int | None = None):
        self.target = tuple(target)
        self.timeout = timeout
        self.memory_limit_mb = memory_limit_mb

    def run(self, input_path: Path, output_dir: Path) -> ExecutionResult:
        uses_file = "@@" in self.target
        argv = [str(input_path) if arg == "@@" else arg for arg in self.target]
        env = dict(os.environ, SYMCC_OUTPUT_DIR=str(output_dir))
        if uses_file:
            env["SYMCC_INPUT_FILE"] = str(input_path)
        else:
            env.pop("SYMCC_INPUT_FILE", None)
        started = time.monotonic()
        stdin = subprocess.DEVNULL if uses_file else open(input_path, "rb")
        try:
            process = subprocess.Popen(
                argv, stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                env=env, preexec_fn=self._child_setup, close_fds=True,
            )
        except OSError as error:
            return ExecutionResult(Outcome.ERROR, None, time.monotonic() - started,
                                   message=f"cannot start {argv[0]}: {error.strerror}")
        finally:
            if stdin is not subprocess.DEVNULL:
                stdin.close()
        timed_out = False
        try:
            _, stderr = process.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(process.pid)
            _, stderr = process.communicate()
        wall = time.monotonic() - started
        status = process.returncode
        if timed_out:
            outcome = Outcome.TIMEOUT
        elif status < 0 and self.memory_limit_mb and b"out of memory" in stderr.lower():
            outcome = Outcome.OOM
        elif status < 0:
            outcome = Outcome.CRASH
        else:
            outcome = Outcome.OK
        _kill_group(process.pid)  # descendants the target left behind
        # A dot-file is a test case still being written when the run was killed.
        generated = tuple(sorted(p for p in output_dir.iterdir()
                                 if p.is_file() and not p.name.startswith(".")))
        return ExecutionResult(outcome, status, wall, solver_seconds(stderr), generated)

    def _child_setup(self) -> None:
        os.setsid()  # its own process group, so a timeout kills every descendant
        if self.memory_limit_mb:
            limit = self.memory_limit_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    def close(self) -> None:
        pass


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
