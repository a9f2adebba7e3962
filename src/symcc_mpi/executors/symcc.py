"""Runs a SymCC-built target as a subprocess under SymCC's environment contract."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import resource
import shutil
import signal
import struct
import subprocess
import tempfile
import time
from pathlib import Path

from ..regular import list_regular
from .base import ExecutionResult, Outcome

log = logging.getLogger("symcc_mpi.executors.symcc")

_SMT_STAT = re.compile(rb"\[STAT\] SMT:\s*(\{.*?\})")
_QUERY_STAT = b'"total_time"'  # QSYM prints it once before each solver check
# What we set per run: inherited values would make two runs share one map file.
_PRUNING_ENV = ("SYMCC_AFL_COVERAGE_MAP", "SYMCC_ENABLE_LINEARIZATION")
COUNTERS_SOURCE = Path(__file__).with_name("symcc_counters.c")
_COUNTERS_MAGIC = 0x73796D63634D5049
_COUNTERS = struct.Struct("<4Q")  # magic, branches, solved branches, checks


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


def counters_library(cache: Path | None = None) -> Path | None:
    """The branch-counting preload library, compiled once per machine; None if no compiler.

    It interposes `_sym_push_path_constraint` (called by the target) and `Z3_solver_check`
    (called by SymCC's runtime), so it works with any SymCC build linked the usual way.
    """
    source = COUNTERS_SOURCE.read_bytes()
    cache = cache or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "symcc-mpi"
    library = cache / f"symcc-counters-{hashlib.sha256(source).hexdigest()[:12]}.so"
    if library.is_file():
        return library
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler: solver queries skipped by pruning will not be counted")
        return None
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as scratch:
            built = Path(scratch) / library.name
            subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(built),
                            str(COUNTERS_SOURCE), "-ldl"], check=True, capture_output=True,
                           timeout=120)
            os.replace(built, library)  # concurrent workers: the last rename wins, same bytes
    except (OSError, subprocess.SubprocessError) as error:
        log.warning("cannot build the branch counter (%s): solver queries skipped by pruning "
                    "will not be counted", error)
        return None
    return library


class SymccExecutor:
    name = "symcc"
    targetable = False

    def __init__(self, target: tuple[str, ...] | list[str], *, timeout: float,
                 memory_limit_mb: int | None = None, coverage_map: Path | None = None,
                 linearize: bool = False, counters: Path | None = None,
                 scratch: Path | None = None):
        """`coverage_map`: QSYM's pruning map file for every run (node-local: QSYM rewrites
        it whole at each interesting branch); `counters`: the library of `counters_library`,
        whose counts land in a file under `scratch`."""
        self.target = tuple(target)
        self.timeout = timeout
        self.memory_limit_mb = memory_limit_mb
        self.coverage_map = coverage_map
        self.linearize = linearize
        self.counters = counters
        self.counters_file = (scratch or Path(tempfile.gettempdir())) / \
            f"symcc-counters-{os.getpid()}" if counters else None
        self._running: int | None = None  # the process group of the run in progress

    def _environment(self, input_path: Path, output_dir: Path, uses_file: bool) -> dict:
        env = dict(os.environ, SYMCC_OUTPUT_DIR=str(output_dir))
        for name in _PRUNING_ENV:
            env.pop(name, None)
        if uses_file:
            env["SYMCC_INPUT_FILE"] = str(input_path)
        else:
            env.pop("SYMCC_INPUT_FILE", None)
        if self.coverage_map is not None:
            env["SYMCC_AFL_COVERAGE_MAP"] = str(self.coverage_map)
        if self.linearize:
            env["SYMCC_ENABLE_LINEARIZATION"] = "1"
        if self.counters_file is not None:
            self.counters_file.write_bytes(bytes(_COUNTERS.size))
            env["SYMCC_MPI_COUNTERS"] = str(self.counters_file)
            env["LD_PRELOAD"] = " ".join(filter(None, (str(self.counters),
                                                      env.get("LD_PRELOAD"))))
        return env

    def run(self, input_path: Path, output_dir: Path,
            targets: frozenset[int] | None = None) -> ExecutionResult:
        uses_file = "@@" in self.target
        argv = [str(input_path) if arg == "@@" else arg for arg in self.target]
        env = self._environment(input_path, output_dir, uses_file)
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
        self._running = process.pid
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
        self._running = None
        _kill_group(process.pid)  # descendants the target left behind
        # A dot-file is a test case still being written when the run was killed.
        listing = list_regular(output_dir, skip_hidden=True)
        return ExecutionResult(outcome, status, wall, solver_seconds(stderr), listing.files,
                               solver_queries=stderr.count(_QUERY_STAT),
                               queries_skipped=self._queries_skipped(),
                               skipped=tuple(sorted(listing.skipped.items())))

    def _queries_skipped(self) -> int | None:
        if self.counters_file is None:
            return None
        try:
            magic, branches, solved, _ = _COUNTERS.unpack(self.counters_file.read_bytes())
        except (OSError, struct.error):
            return None
        return branches - solved if magic == _COUNTERS_MAGIC else None

    def _child_setup(self) -> None:
        os.setsid()  # its own process group, so a timeout kills every descendant
        if self.memory_limit_mb:
            limit = self.memory_limit_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    def cancel(self) -> None:
        running = self._running
        if running is not None:
            _kill_group(running)

    def close(self) -> None:
        if self.counters_file is not None:
            self.counters_file.unlink(missing_ok=True)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
