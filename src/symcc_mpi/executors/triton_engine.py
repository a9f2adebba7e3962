"""SymCC-style concolic exploration of one input with tritondse, plus the native reference run."""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import tempfile
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import tritondse
import tritondse.logging as tdse_logging
from tritondse import CompositeData, Config, Program, Seed, SeedFormat, SeedStatus, SymbolicExecutor
from tritondse.exception import AbortExecutionException
from tritondse.routines import SUPPORTED_ROUTINES
from tritondse.types import SmtSolver, SolverStatus

from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.executors.base import Outcome
from symcc_mpi.processes import limited

STDIN_NAME = "stdin"  # tritondse's name for the input file fed on fd 0
TMP_PREFIX = ".triton-tmp-"  # partially written outputs; a supervisor removes them after a kill

# Routines after which the real program dies: tritondse models them as a clean stop.
_CRASHING_ROUTINES = ("abort", "__assert_fail", "__stack_chk_fail")


@dataclass(frozen=True)
class EngineOptions:
    solver_timeout_ms: int = 1000  # per query
    max_queries: int = 2000  # per run; 0 = unlimited
    optimistic: bool = True  # like QSYM: if a flip is UNSAT with its prefix, solve the flip alone
    # Or "z3": through Triton a trivial Z3 query costs 15-30 ms, a Bitwuzla one 0.5 ms.
    solver: str = "bitwuzla"

    @classmethod
    def from_dict(cls, d: dict | None) -> EngineOptions:
        d = d or {}
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass
class NativeResult:
    exit_status: int | None  # exit code, or -signal
    wall_time: float

    @property
    def crashed(self) -> bool:
        return self.exit_status is not None and self.exit_status < 0


@dataclass
class EngineResult:
    stop: str  # "end" (normal end), "suspect" (engine saw a crash), "limit" (engine gave up)
    message: str = ""
    solver_time: float = 0.0
    emulation_time: float = 0.0
    queries: int = 0
    sat: int = 0
    generated: int = 0
    branches: int = 0
    instructions: int = 0
    # Branch targets (executors/base.py): jump addresses, on the path in the order first met,
    # and those whose flip went to the solver.
    path_targets: list[int] = field(default_factory=list)
    solved_targets: list[int] = field(default_factory=list)
    extra: dict = field(default_factory=dict)


class _LogCapture(logging.Handler):
    """Keeps tritondse's last warning/error: it is the only place it says why it stopped."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last: str = ""

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "imported but unsupported" not in msg:  # printed for every unused weak symbol
            self.last = msg


_capture: _LogCapture | None = None


def quiet_tritondse() -> _LogCapture:
    """Silences tritondse's logging (it would print to our stderr) and captures its last word."""
    global _capture
    if _capture is None:
        _capture = _LogCapture()
        for name in ("", "executor", "routines", "process_state", "memory", "coverage", "config"):
            log = tdse_logging.get(name)
            log.setLevel(logging.WARNING)
            log.handlers[:] = [_capture]
            log.propagate = False
        for log in list(tdse_logging._loggers.values()):
            log.handlers[:] = [_capture]
            log.propagate = False
    return _capture


def _stat_key(path: str) -> tuple:
    st = os.stat(path)
    return (os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns)


class _NoWorkspace:
    """SymbolicExecutor only stores its workspace; a real one would create directories."""

    def __bool__(self) -> bool:
        return True


_NO_WORKSPACE = _NoWorkspace()


class LoadedTarget:
    """A target binary parsed and mapped once; `executor()` may be called once per process.

    The mapped process state is mutated by the run, so the server keeps one template and
    uses it only in forked children, where the mutation stays private.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.program = Program(path)
        cfg = Config(seed_format=SeedFormat.COMPOSITE, program_argv=[path])
        self._template = SymbolicExecutor(
            cfg, Seed(CompositeData()), workspace=_NO_WORKSPACE, uid=1
        )
        self._template.load(self.program)

    def executor(self, config: Config, seed: Seed) -> SymbolicExecutor:
        se = SymbolicExecutor(config, seed, workspace=_NO_WORKSPACE, uid=1)
        # Same effect as se.load(program) minus re-mapping the binary (~10 ms per run).
        se.loader = self.program
        se.pstate = self._template.pstate
        se.rtn_table = dict(self._template.rtn_table)
        se._load_seed_process_state(se.pstate, seed)
        return se


class TargetCache:
    """Parsed targets by (path, inode, size, mtime), least recently used evicted."""

    def __init__(self, size: int = 4) -> None:
        self._size = size
        self._items: OrderedDict[tuple, LoadedTarget] = OrderedDict()

    def get(self, path: str) -> LoadedTarget:
        key = _stat_key(path)
        item = self._items.pop(key, None)
        if item is None:
            item = LoadedTarget(path)
        self._items[key] = item
        while len(self._items) > self._size:
            self._items.popitem(last=False)
        return item


def _bucket(n: int) -> int:
    """AFL/QSYM hit-count classes: a branch is re-flipped only when its count changes class."""
    for i, limit in enumerate((1, 2, 3, 7, 15, 31, 127)):
        if n <= limit:
            return i
    return 8


class _Explorer:
    """Flips every new branch of one concrete path as the emulation goes (SymCC does it online)."""

    def __init__(
        self,
        se: SymbolicExecutor,
        input_name: str,
        data: bytes,
        output_dir: Path,
        options: EngineOptions,
        on_query: Callable[[float, float | None], None] | None,
        targets: frozenset[int] | None = None,
    ) -> None:
        self.se = se
        self.targets = targets  # None: flip every new branch
        self.input_name = input_name
        self.data = data
        self.output_dir = output_dir
        self.options = options
        self.on_query = on_query
        self.result = EngineResult(stop="end")
        self.t0 = SYSTEM_CLOCK.monotonic()
        actx = se.pstate.actx
        self._prefix = [actx.equal(actx.bvtrue(), actx.bvtrue())]  # land() needs >= 2 operands
        self._consumed = 0
        self._hits: Counter = Counter()
        self._seen_keys: set = set()
        self._seen_outputs = {hashlib.sha256(data).digest()}
        self._on_path: dict[int, None] = {}  # an ordered set
        self._solved: dict[int, None] = {}
        self.unsupported: str | None = None
        self.crash_hint: str | None = None
        self.query_limit_hit = False
        self._install_hooks()
        se.callback_manager.register_on_branch_covered_callback(self._on_branch)

    def _install_hooks(self) -> None:
        se = self.se
        for addr, (name, fn) in list(se.rtn_table.items()):
            if name not in SUPPORTED_ROUTINES:
                se.rtn_table[addr] = (name, self._unsupported_stub)
            elif name in _CRASHING_ROUTINES:
                se.rtn_table[addr] = (name, self._crash_wrapper(name, fn))

    def _unsupported_stub(self, se: SymbolicExecutor, pstate) -> None:
        self.unsupported, _ = se.rtn_table[pstate.cpu.program_counter]
        raise AbortExecutionException("unsupported routine")

    def _crash_wrapper(self, name: str, fn: Callable) -> Callable:
        def wrapper(se: SymbolicExecutor, pstate):
            self.crash_hint = f"{name}() called"
            return fn(se, pstate)

        return wrapper

    def _on_branch(self, se: SymbolicExecutor, pstate, edge: tuple[int, int]) -> None:
        pcs = pstate.get_path_constraints()
        branch = pcs[-1]
        for pc in pcs[
            self._consumed : len(pcs) - 1
        ]:  # constraints routines pushed since the last branch
            self._prefix.append(pc.getTakenPredicate())
        self._consumed = len(pcs)
        self.result.branches += 1
        self._hits[edge] += 1
        key = (edge, _bucket(self._hits[edge]))
        alternatives = branch.getBranchConstraints()
        jump = alternatives[0]["srcAddr"]
        self._on_path[jump] = None
        if key not in self._seen_keys and (self.targets is None or jump in self.targets):
            self._seen_keys.add(key)
            for br in alternatives:
                if not br["isTaken"]:
                    self._solved[jump] = None
                    self._flip(br["constraint"])
        self._prefix.append(branch.getTakenPredicate())
        if self.query_limit_hit:
            se.abort()  # nothing more will be solved: finishing the emulation would be wasted time

    def _solve(self, constraint) -> tuple[SolverStatus, dict]:
        if self.on_query is not None:
            self.on_query(self.result.solver_time, SYSTEM_CLOCK.monotonic() - self.t0)
        t = SYSTEM_CLOCK.monotonic()
        status, model = self.se.pstate.solve(constraint, with_pp=False)
        self.result.solver_time += SYSTEM_CLOCK.monotonic() - t
        if self.on_query is not None:
            self.on_query(self.result.solver_time, None)
        self.result.queries += 1
        limit = self.options.max_queries
        if limit and self.result.queries >= limit:
            self.query_limit_hit = True
        return status, model

    def _flip(self, flipped) -> None:
        if self.query_limit_hit:
            return
        actx = self.se.pstate.actx
        status, model = self._solve(actx.land(self._prefix + [flipped]))
        optimistic = False
        if status == SolverStatus.UNSAT and self.options.optimistic and not self.query_limit_hit:
            status, model = self._solve(flipped)
            optimistic = True
        if status == SolverStatus.SAT:
            self.result.sat += 1
            self._emit(model, optimistic)

    def _emit(self, model: dict, optimistic: bool) -> None:
        content = bytearray(self.data)
        for i, var in enumerate(self.se.symbolic_seed.files.get(self.input_name, ())):
            if var is not None and i < len(content) and var.getId() in model:
                content[i] = model[var.getId()].getValue() & 0xFF
        digest = hashlib.sha256(content).digest()
        if digest in self._seen_outputs:
            return
        self._seen_outputs.add(digest)
        # QSYM's names: a 6-digit counter from 0, "-optimistic" for a flip solved without prefix.
        name = f"{self.result.generated:06d}" + ("-optimistic" if optimistic else "")
        self.result.generated += 1
        if optimistic:
            self.result.extra["optimistic"] = self.result.extra.get("optimistic", 0) + 1
        tmp = self.output_dir / f"{TMP_PREFIX}{name}"
        tmp.write_bytes(content)
        # Renamed whole: a killed run never leaves a half-written file under a real name.
        os.replace(tmp, self.output_dir / name)

    def finish(self, capture: _LogCapture) -> EngineResult:
        se, res = self.se, self.result
        res.instructions = se.trace_offset
        res.path_targets = list(self._on_path)
        res.solved_targets = list(self._solved)
        res.emulation_time = SYSTEM_CLOCK.monotonic() - self.t0 - res.solver_time
        if self.unsupported:
            res.stop, res.message = "limit", f"unsupported library function {self.unsupported}()"
        elif self.crash_hint:
            res.stop, res.message = "suspect", self.crash_hint
        elif se.seed.status == SeedStatus.CRASH:
            res.stop, res.message = "suspect", capture.last or "crash"
        elif se.seed.status == SeedStatus.FAIL:
            res.stop, res.message = "limit", capture.last or "execution interrupted"
        elif self.query_limit_hit:
            res.message = f"query limit {self.options.max_queries} reached"
        elif not (se.pstate.stop or not se.pstate.threads or _at_halt(se)):
            pc = se.pstate.cpu.program_counter
            res.stop, res.message = "limit", capture.last or f"emulation stopped at {pc:#x}"
        return res


def _at_halt(se: SymbolicExecutor) -> bool:
    """The normal end of a run: main returned into _start's `hlt`."""
    try:
        return se.pstate.is_halt_instruction()
    except Exception:
        return False


def explore(
    target: LoadedTarget,
    argv: list[str],
    input_name: str,
    data: bytes,
    output_dir: Path,
    options: EngineOptions = EngineOptions(),
    on_query: Callable[[float, float | None], None] | None = None,
    targets: frozenset[int] | None = None,
) -> EngineResult:
    """Runs `argv` under tritondse on `data` (file `input_name`, or STDIN_NAME) and writes
    one file per solved branch flip into `output_dir`; with `targets`, flips only the
    branches whose jump address is in it (none: a trace that reports the path's).

    `on_query(solving_seconds, total_seconds)` is called before each query and
    `on_query(solving_seconds, None)` after it (cumulative values, QSYM's [STAT] points)."""
    capture = quiet_tritondse()
    capture.last = ""
    config = Config(
        seed_format=SeedFormat.COMPOSITE,
        program_argv=list(argv),
        smt_timeout=options.solver_timeout_ms,
        smt_solver=SmtSolver[options.solver.upper()],
        # Off: tritondse's short tables (ctype) and unapplied relocations make it fault
        # where the real program does not; crashes are judged by the native run instead.
        memory_segmentation=False,
        skip_unsupported_import=False,
    )
    seed = Seed(CompositeData(files={input_name: data}))
    try:
        se = target.executor(config, seed)
    except Exception as e:  # noqa: BLE001 - anything from the loader is an engine limit
        return EngineResult(stop="limit", message=f"cannot load target: {e}")
    explorer = _Explorer(se, input_name, data, output_dir, options, on_query, targets)
    try:
        se.run()
    except Exception as e:  # noqa: BLE001 - tritondse raises from deep inside callbacks
        r = explorer.finish(capture)
        r.stop, r.message = "limit", f"tritondse failed: {type(e).__name__}: {e}"
        return r
    return explorer.finish(capture)


class NativeRun:
    """The real binary running once: it, not the emulator, says whether the input crashes."""

    def __init__(
        self,
        argv: list[str],
        stdin_data: bytes | None,
        *,
        env: dict | None = None,
        memory_limit_mb: int | None = None,
    ) -> None:
        stdin = subprocess.DEVNULL
        if stdin_data is not None:
            # A file rather than a pipe: the target may run alongside us and read whenever it likes.
            stdin = tempfile.TemporaryFile()
            stdin.write(stdin_data)
            stdin.seek(0)
        self.t0 = SYSTEM_CLOCK.monotonic()
        try:
            # In the caller's process group: the server kills its child's group on a timeout,
            # this run included (and the shim's supervisor kills the shim's).
            self.proc: subprocess.Popen | None = limited.start(
                argv, env=env, stdin=stdin, memory_limit_mb=memory_limit_mb, own_group=False)
        except OSError:
            self.proc = None
        finally:
            if stdin_data is not None:
                stdin.close()

    def wait(self) -> NativeResult:
        status = self.proc.wait() if self.proc is not None else None
        return NativeResult(exit_status=status, wall_time=SYSTEM_CLOCK.monotonic() - self.t0)


def run_native(argv: list[str], stdin_data: bytes | None, **kwargs) -> NativeResult:
    return NativeRun(argv, stdin_data, **kwargs).wait()


def classify(
    native: NativeResult | None, engine: EngineResult | None
) -> tuple[Outcome, int | None, str]:
    """(outcome, exit status, message) of one run from the native run and the engine's stop."""
    if native is None or native.exit_status is None:
        return Outcome.ERROR, None, "the target could not be started"
    if native.crashed:
        return Outcome.CRASH, native.exit_status, ""
    if engine is None:
        return Outcome.ERROR, native.exit_status, "tritondse did not finish"
    if engine.stop == "limit":
        return Outcome.ERROR, native.exit_status, f"tritondse: {_one_line(engine.message)}"
    if engine.stop == "suspect":
        return (
            Outcome.ERROR,
            native.exit_status,
            f"tritondse: {_one_line(engine.message)} (the native run did not crash)",
        )
    return Outcome.OK, native.exit_status, ""


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def engine_summary(engine: EngineResult) -> dict:
    d = asdict(engine)
    d.update(d.pop("extra"))
    return d


def versions() -> dict:
    from importlib.metadata import version

    return {"tritondse": version("tritondse"), "triton": tritondse.TRITON_VERSION}
