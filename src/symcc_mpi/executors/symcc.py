"""Runs a SymCC-built target under SymCC's environment contract: forked from a forkserver
where it can be, else as a process of its own each run."""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from symcc_mpi.config import SYMCC_INPUT_FILE_ENV, SYMCC_OUTPUT_DIR_ENV, build_tools
from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.durable.regular import list_regular
from symcc_mpi.executors.base import ExecutionResult, Outcome
from symcc_mpi.executors.symcc_forkserver import ForkserverDied, SymccForkserver
from symcc_mpi.processes import limited
from symcc_mpi.processes.limited import Ended, kill_group
from symcc_mpi.processes.wordpipe import PipeClosed

log = logging.getLogger("symcc_mpi.executors.symcc")

_SMT_STAT = re.compile(rb"\[STAT\] SMT:\s*(\{.*?\})")
_QUERY_STAT = b'"total_time"'  # QSYM prints it once before each solver check
# What we set per run: inherited values would make two runs share one map file.
_PRUNING_ENV = ("SYMCC_AFL_COVERAGE_MAP", "SYMCC_ENABLE_LINEARIZATION")
PRELOAD_SOURCE = Path(__file__).with_name("symcc_preload.c")
_COUNTERS_MAGIC = 0x73796D63634D5049
# The counters file, as symcc_preload.c lays it out: magic, branches, solved branches,
# checks, whether targets are recorded, path length; then a seen bit and a solved bit per
# QSYM map index, then the path's targets (uint32, first met first).
_COUNTERS_HEADER = struct.Struct("<6Q")
QSYM_MAP_SIZE = 65536  # QSYM's kMapSize: one trace half, then one context half, in its map
_BITSET_SIZE = QSYM_MAP_SIZE // 8
_SOLVED_OFFSET = _COUNTERS_HEADER.size + _BITSET_SIZE
_PATH_OFFSET = _SOLVED_OFFSET + _BITSET_SIZE
_COUNTERS_SIZE = _PATH_OFFSET + 4 * QSYM_MAP_SIZE


@dataclass(frozen=True)
class BranchCounts:
    """What the preload library counted in one run."""

    queries_skipped: int | None  # None: not known
    path_targets: tuple[int, ...] | None  # None: this runtime has no QSYM branch map
    solved_targets: tuple[int, ...]


def decode_counters(data: bytes) -> BranchCounts | None:
    """The counters file's content; None when the library never opened it (or it is torn)."""
    if len(data) != _COUNTERS_SIZE:
        return None
    magic, branches, solved, _, records_targets, length = _COUNTERS_HEADER.unpack_from(data)
    if magic != _COUNTERS_MAGIC or length > QSYM_MAP_SIZE:
        return None
    if not records_targets:
        return BranchCounts(branches - solved, None, ())
    path = struct.unpack_from(f"<{length}I", data, _PATH_OFFSET)
    if not all(1 <= target <= QSYM_MAP_SIZE for target in path):
        return None
    solved_bits = data[_SOLVED_OFFSET:_PATH_OFFSET]
    solved_targets = tuple(target for target in path
                           if solved_bits[(target - 1) // 8] >> ((target - 1) % 8) & 1)
    return BranchCounts(branches - solved, path, solved_targets)


_NOT_COUNTED = BranchCounts(None, None, ())


def targeted_map(targets: frozenset[int]) -> bytes:
    """A QSYM coverage map under which only the branches of `targets` are solved.

    Trace half: every index counts as covered (0xFF) but the targets' (0x00: new at the first
    hit); context half: every context seen (0xFF), so that isInterestingContext never fires.
    """
    trace = bytearray(b"\xff" * QSYM_MAP_SIZE)
    for target in targets:
        if not 1 <= target <= QSYM_MAP_SIZE:
            raise ValueError(f"not a SymCC branch target: {target}")
        trace[target - 1] = 0
    return bytes(trace) + b"\xff" * QSYM_MAP_SIZE


# How every message that needs SymCC says where to get it (README: Getting SymCC).
HOW_TO_GET_SYMCC = "`make symcc` builds one, SYMCC_SRC=DIR naming its source; README: Getting SymCC"
# What every SymCC build calls, by name: its instrumentation's constructor runs it first.
SYMCC_RUNTIME_SYMBOL = b"_sym_initialize"
ELF_MAGIC = b"\x7fELF"


def is_symcc_build(program: Path) -> bool | None:
    """Whether `program` was compiled with SymCC: an ELF file that names SymCC's runtime
    entry `_sym_initialize` (in its dynamic symbols, or its symbol table when the runtime
    is linked in). None: not an ELF file (a script), so it cannot be told."""
    with open(program, "rb") as file:
        if file.read(4) != ELF_MAGIC:
            return None
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as content:
            return content.find(b"\0" + SYMCC_RUNTIME_SYMBOL + b"\0") >= 0


_NOT_THE_RUNTIME = (b"[STAT]", b"[INFO]")  # QSYM's running commentary, not a failure


def last_words(stderr: bytes, limit: int = 200) -> str:
    """The line a run that died wrote last, QSYM's statistics skipped; an uncaught C++
    exception's `what():` line is joined to the `terminate called ...` line before it."""
    lines = [line.strip() for line in stderr.splitlines()]
    lines = [line for line in lines if line and not line.startswith(_NOT_THE_RUNTIME)]
    if not lines:
        return ""
    last = lines[-1]
    if last.startswith(b"what():") and len(lines) > 1:
        last = lines[-2] + b": " + last[len(b"what():"):].strip()
    return last.decode("utf-8", "replace")[:limit]


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


def preload_library(cache: Path | None = None) -> Path | None:
    """The library preloaded into every SymCC run (symcc_preload.c: the forkserver and the
    branch counters), compiled once per machine; None if there is no compiler.

    It interposes `Z3_mk_context_rc`, `_sym_push_path_constraint`, `Z3_solver_check` and
    QSYM's `AflTraceMap::isInterestingBranch` (called by SymCC's runtime or the target through
    their PLT), so it works with any SymCC build linked the usual way.
    """
    source = PRELOAD_SOURCE.read_bytes()
    tools = build_tools()
    cache = cache or tools.cache_home / "symcc-mpi"
    library = cache / f"symcc-preload-{hashlib.sha256(source).hexdigest()[:12]}.so"
    if library.is_file():
        return library
    compiler = tools.compiler or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler: every SymCC run is exec'd (no forkserver) and solver "
                    "queries skipped by pruning will not be counted")
        return None
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as scratch:
            built = Path(scratch) / library.name
            subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(built),
                            str(PRELOAD_SOURCE), "-ldl"], check=True, capture_output=True,
                           timeout=120)
            os.replace(built, library)  # concurrent workers: the last rename wins, same bytes
    except (OSError, subprocess.SubprocessError) as error:
        log.warning("cannot build %s (%s): every SymCC run is exec'd (no forkserver) and "
                    "solver queries skipped by pruning will not be counted",
                    PRELOAD_SOURCE.name, error)
        return None
    return library


class SymccExecutor:
    """Runs a SymCC build. With the preload library (`preload_library`), whole runs are
    forked from a forkserver (symcc_forkserver.py) and runs can be targeted.

    A targeted run hands QSYM a map of its own (`targeted_map`) instead of `coverage_map`,
    an unpruned one no map and no linearization; both are exec'd: their environment is not
    the forkserver's.
    """

    name = "symcc"
    targetable = False

    def __init__(self, target: tuple[str, ...] | list[str], *, timeout: float,
                 memory_limit_mb: int | None = None, coverage_map: Path | None = None,
                 linearize: bool = False, preload: Path | None = None,
                 scratch: Path | None = None):
        """`coverage_map`: QSYM's pruning map file for every run (node-local: QSYM rewrites
        it whole at each interesting branch); `preload`: the library of `preload_library`,
        whose counts (and the path's branch targets) land in a file under `scratch`, as do
        the map of a targeted run and a forked run's stderr. Given a `scratch`, the target's
        TMPDIR is there too: what it, SymCC's runtime or the solver leave in temporary files
        stays node-local."""
        self.target = tuple(target)
        self.timeout = timeout
        self.memory_limit_mb = memory_limit_mb
        self.coverage_map = coverage_map
        self.linearize = linearize
        self.preload = preload
        self.targetable = preload is not None
        self.tmpdir = scratch
        scratch = scratch or Path(tempfile.gettempdir())
        self.counters_file = scratch / f"symcc-counters-{os.getpid()}" if preload else None
        self.targets_map = scratch / f"symcc-targets-{os.getpid()}.map" if preload else None
        self.stderr_file = scratch / f"symcc-stderr-{os.getpid()}" if preload else None
        self._counters_fd: int | None = None
        self._forks = preload is not None  # until a target shows it has no forkserver
        self._forkserver: SymccForkserver | None = None
        self._forkserver_key: tuple | None = None
        self._running: int | None = None  # the process group of an exec'd run in progress
        # A crashing target dumps no core: set here, in the worker, so that every run
        # inherits it (the target runs in a session of its own: a timeout kills the group).
        limited.no_core_dumps()

    def _environment(self, input_path: Path, output_dir: Path, uses_file: bool,
                     targets: frozenset[int] | None, pruned: bool) -> dict:
        env = dict(os.environ, **{SYMCC_OUTPUT_DIR_ENV: str(output_dir)})
        if self.tmpdir is not None:
            env["TMPDIR"] = str(self.tmpdir)
        for name in _PRUNING_ENV:
            env.pop(name, None)
        if uses_file:
            env[SYMCC_INPUT_FILE_ENV] = str(input_path)
        else:
            env.pop(SYMCC_INPUT_FILE_ENV, None)
        if targets is not None:
            # Fresh each run: QSYM rewrites the map as it solves.
            self.targets_map.write_bytes(targeted_map(targets))
            env["SYMCC_AFL_COVERAGE_MAP"] = str(self.targets_map)
        elif pruned and self.coverage_map is not None:
            env["SYMCC_AFL_COVERAGE_MAP"] = str(self.coverage_map)
        if self.linearize and (pruned or targets is not None):
            env["SYMCC_ENABLE_LINEARIZATION"] = "1"
        if self.preload is not None:
            env["SYMCC_MPI_COUNTERS"] = str(self.counters_file)
            env["LD_PRELOAD"] = " ".join(filter(None, (str(self.preload),
                                                      env.get("LD_PRELOAD"))))
        return env

    def run(self, input_path: Path, output_dir: Path,
            targets: frozenset[int] | None = None, *, pruned: bool = True) -> ExecutionResult:
        if targets is not None and not self.targetable:
            raise ValueError("targets given to a SymCC executor without its preload library")
        uses_file = "@@" in self.target
        argv = [str(input_path) if arg == "@@" else arg for arg in self.target]
        env = self._environment(input_path, output_dir, uses_file, targets, pruned)
        self._blank_counters()
        started = SYSTEM_CLOCK.monotonic()
        try:
            if targets is None and pruned and self._forks:
                ended, stderr = self._forked(argv, env, input_path, output_dir, uses_file)
            else:
                ended, stderr = self._exec(argv, env, input_path, uses_file)
        except OSError as error:
            return ExecutionResult(Outcome.ERROR, None, SYSTEM_CLOCK.monotonic() - started,
                                   message=f"cannot start {argv[0]}: "
                                           f"{error.strerror or error}")
        except ForkserverDied:
            return ExecutionResult(Outcome.ERROR, None, SYSTEM_CLOCK.monotonic() - started,
                                   message=f"the forkserver of {argv[0]} died during the run")
        wall = SYSTEM_CLOCK.monotonic() - started
        if ended.timed_out:
            outcome = Outcome.TIMEOUT
        elif ended.status < 0 and self.memory_limit_mb and b"out of memory" in stderr.lower():
            outcome = Outcome.OOM
        elif ended.status < 0:
            outcome = Outcome.CRASH
        else:
            outcome = Outcome.OK
        # A dot-file is a test case still being written when the run was killed.
        listing = list_regular(output_dir, skip_hidden=True)
        counts = self._branch_counts() or _NOT_COUNTED
        return ExecutionResult(outcome, ended.status, wall, solver_seconds(stderr),
                               listing.files,
                               message=last_words(stderr) if outcome is Outcome.CRASH else "",
                               solver_queries=stderr.count(_QUERY_STAT),
                               queries_skipped=counts.queries_skipped,
                               path_targets=counts.path_targets,
                               solved_targets=counts.solved_targets,
                               skipped=tuple(sorted(listing.skipped.items())))

    def _exec(self, argv: list[str], env: dict, input_path: Path,
              uses_file: bool) -> tuple[Ended, bytes]:
        return limited.run(argv, env, stdin=None if uses_file else input_path,
                           timeout=self.timeout, memory_limit_mb=self.memory_limit_mb,
                           started=self._note_running)

    def _note_running(self, pid: int | None) -> None:
        self._running = pid

    def _forked(self, argv: list[str], env: dict, input_path: Path, output_dir: Path,
                uses_file: bool) -> tuple[Ended, bytes]:
        """The run, forked from the forkserver of this input path and output directory
        (started if need be: a target without one has then had its run exec'd)."""
        key = (input_path, output_dir)
        if self._forkserver_key != key:
            self._stop_forkserver()
        if self._forkserver is not None:
            try:
                return self._forkserver.run(self.timeout), self._stderr()
            except PipeClosed:  # it ended since its last run, before this fork: nothing ran
                self._stop_forkserver()
        forkserver = self._forkserver = SymccForkserver(
            argv, env, stdin=None if uses_file else input_path, stderr=self.stderr_file,
            memory_limit_mb=self.memory_limit_mb)
        ended = forkserver.start(self.timeout)
        if ended is not None:
            self._forkserver = None
            self._forks = False
            log.info("%s has no SymCC forkserver (no Z3 context made by SymCC's runtime "
                     "before main): every run is exec'd", argv[0])
            return ended, self._stderr()
        self._forkserver_key = key
        try:
            return forkserver.run(self.timeout), self._stderr()
        except PipeClosed:
            self._stop_forkserver()
            raise OSError("the SymCC forkserver ended before its first run") from None

    def _stderr(self) -> bytes:
        try:
            return self.stderr_file.read_bytes()
        except OSError:
            return b""

    def _blank_counters(self) -> None:
        """Mark the counters file unwritten (its magic zeroed): the library writes it anew at
        the start of the run, and a run it never reached reads as not counted."""
        if self.counters_file is None:
            return
        if self._counters_fd is None:
            self._counters_fd = os.open(self.counters_file,
                                        os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            os.ftruncate(self._counters_fd, _COUNTERS_SIZE)  # sparse: most of it stays unused
        os.pwrite(self._counters_fd, bytes(_COUNTERS_HEADER.size), 0)

    def _branch_counts(self) -> BranchCounts | None:
        if self._counters_fd is None:
            return None
        try:
            return decode_counters(os.pread(self._counters_fd, _COUNTERS_SIZE, 0))
        except OSError:
            return None

    def cancel(self) -> None:
        running, forkserver = self._running, self._forkserver
        if running is not None:
            kill_group(running)
        if forkserver is not None:
            forkserver.cancel()

    def _stop_forkserver(self) -> None:
        forkserver, self._forkserver = self._forkserver, None
        self._forkserver_key = None
        if forkserver is not None:
            forkserver.close()

    def close(self) -> None:
        self._stop_forkserver()
        if self._counters_fd is not None:
            os.close(self._counters_fd)
            self._counters_fd = None
        for path in (self.counters_file, self.targets_map, self.stderr_file):
            if path is not None:
                path.unlink(missing_ok=True)
