"""Typed campaign configuration, the up-front checks of what a user gave us, and every
environment variable symcc-mpi reads."""

from __future__ import annotations

import math
import os
import shlex
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXECUTORS = ("triton", "symcc", "noop")
PRUNING_MODES = ("shared", "local", "off")  # QSYM map sharing (SymCC executor only)
FAULT_TOLERANCE_MODES = ("on", "off", "auto")


class UsageError(Exception):
    """A mistake in what the user asked for: reported as one line, exit status 2."""


@dataclass(frozen=True)
class CampaignConfig:
    target: tuple[str, ...]  # argv with `@@` standing for the input file
    seeds: Path | None  # None: a resumed campaign, or a hybrid one fed by the fuzzers
    out: Path
    workers: int = 2
    masters: int = 1  # groups of ranks, each a master and its workers, sharing OUT (F320)
    executor: str = "triton"
    afl_target: tuple[str, ...] | None = None
    # Confirms a crash or hang of a SymCC run when there is no AFL build (witness.py)
    plain_target: tuple[str, ...] | None = None
    timeout: float = 10.0  # per execution, seconds
    memory_limit_mb: int | None = None
    wall_timeout: float | None = None  # whole campaign, seconds
    max_idle: float | None = None  # stop after this long without a new finding
    resume: bool = False
    pruning: str = "shared"
    live: bool = True  # show the live view (rank 0, on a terminal)
    # Survive the death of ranks (ulfm/): "on", "off", or "auto" (on where the launch allows)
    fault_tolerance: str = "auto"
    # A hybrid campaign beside AFL++ (afl_sync.py): the fuzzers' output directory; the
    # campaign is its instance `out` (AFL_OUT/NAME)
    afl_sync: Path | None = None
    # Split one input's solving across free workers when the frontier is thin (splitting.py)
    split: bool = False
    # Node-local directory for each rank's temporary files (scratch.py); None: each node's
    # temporary directory. Not in `to_json`: not the campaign's identity, a resume may move it.
    scratch: Path | None = None
    # How workers hand their packs of children to their master (worker.py): "files" in
    # OUT/.staging, "mpi" in messages, "auto" files where a worker sees OUT. Not in `to_json`.
    results_via: str = "auto"

    @property
    def hybrid(self) -> bool:
        return self.afl_sync is not None

    @property
    def budgeted(self) -> bool:
        """A budget ends the campaign (tiers/): until then it works past its frontier."""
        return self.wall_timeout is not None or self.max_idle is not None

    @property
    def prunes(self) -> bool:
        """Whether runs use QSYM's coverage map and linearization (SymCC's backend only)."""
        return self.executor == "symcc" and self.pruning != "off"

    def to_json(self) -> dict:
        return {
            "target": list(self.target),
            "seeds": str(self.seeds) if self.seeds else None,
            "out": str(self.out),
            "workers": self.workers,
            "masters": self.masters,
            "executor": self.executor,
            "afl_target": list(self.afl_target) if self.afl_target else None,
            "plain_target": list(self.plain_target) if self.plain_target else None,
            "timeout": self.timeout,
            "memory_limit_mb": self.memory_limit_mb,
            "wall_timeout": self.wall_timeout,
            "max_idle": self.max_idle,
            "resume": self.resume,
            "pruning": self.pruning,
            "fault_tolerance": self.fault_tolerance,
            "afl_sync": str(self.afl_sync) if self.afl_sync else None,
            "split": self.split,
        }


def parse_command(text: str, what: str) -> tuple[str, ...]:
    """Split a target command line and check its program exists and is executable."""
    try:
        argv = shlex.split(text)
    except ValueError as error:
        raise UsageError(f"{what} {text!r}: {error}") from None
    if not argv or argv[0] == "@@":
        raise UsageError(f"{what} {text!r} names no program to run")
    program = argv[0]
    if "/" not in program:
        found = shutil.which(program)
        if found is None:
            raise UsageError(f"{what}: program {program!r} not found on PATH")
        program = found
    path = Path(program)
    if not path.exists():
        raise UsageError(f"{what}: program {program} does not exist")
    if not path.is_file() or not os.access(path, os.X_OK):
        raise UsageError(f"{what}: program {program} is not an executable file")
    # abspath, not resolve: a venv's python is a symlink that must stay the venv's.
    return (os.path.abspath(path), *argv[1:])


def check_seeds(seeds: Path) -> list[Path]:
    if not seeds.exists():
        raise UsageError(f"seed directory {seeds} does not exist")
    if not seeds.is_dir():
        raise UsageError(f"seed directory {seeds} is not a directory")
    files = sorted(p for p in seeds.iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise UsageError(f"seed directory {seeds} holds no input files")
    unreadable = [p for p in files if not os.access(p, os.R_OK)]
    if unreadable:
        raise UsageError(f"seed file {unreadable[0]} is not readable")
    return files


def check_numbers(config: CampaignConfig) -> None:
    if config.workers < 1:
        raise UsageError(f"--workers must be at least 1 (got {config.workers})")
    if config.masters < 1:
        raise UsageError(f"--masters must be at least 1 (got {config.masters})")
    if config.workers < config.masters:
        raise UsageError(f"--masters {config.masters} needs at least one worker each "
                         f"(--workers {config.workers})")
    if not config.timeout > 0:
        raise UsageError(f"--timeout must be positive (got {config.timeout})")
    for name, value in (("--wall-timeout", config.wall_timeout), ("--max-idle", config.max_idle)):
        if value is not None and not value > 0:
            raise UsageError(f"{name} must be positive (got {value})")
    if config.pruning not in PRUNING_MODES:
        raise UsageError(f"unknown pruning mode {config.pruning!r} (choose from "
                         f"{', '.join(PRUNING_MODES)})")
    if config.hybrid:
        if config.masters != 1:
            raise UsageError("--afl-sync runs with one master (--masters 1)")
        if not config.afl_target:
            raise UsageError("--afl-sync needs --afl-target CMD: the AFL build the fuzzers "
                             "run, to keep only what adds coverage to the whole fleet")
    if config.executor not in EXECUTORS:
        choices = ", ".join(EXECUTORS)
        raise UsageError(f"unknown executor {config.executor!r} (choose from {choices})")


# == The environment ========================================================================
# Every variable symcc-mpi reads is read here, each concern by one typed function; `env`
# stands in for os.environ in tests. Writing variables for a child process is not reading:
# the call sites that do it use the names below.

LAUNCHED_ENV = "SYMCC_MPI_LAUNCHED"  # "1" in the ranks our own launcher starts
COMMAND_TIME_ENV = "SYMCC_MPI_COMMAND_TIME"  # when the user's command started (time.time)
RUN_ID_ENV = "SYMCC_MPI_RUN_ID"  # the run a stop request is for (corpus.stop_request_verdict)
# Set by mpiexec/mpirun (Open MPI, MPICH, Intel MPI) and by srun --mpi=pmix.
MPI_RANK_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE")
SLURM_NODES_ENV = "SLURM_JOB_NUM_NODES"
OMPI_FT_ENABLE_ENV = "OMPI_MCA_mpi_ft_enable"  # mpiexec --with-ft ulfm sets it
OMPI_PML_ENV = "OMPI_MCA_pml"
LOG_LEVEL_ENV = "SYMCC_MPI_LOG"
FAULTS_ENV = "SYMCC_MPI_FAULTS"  # the fault plan (roles/faults.py), for tests
# As AFL++'s AFL_SKIP_BIN_CHECK: the target is a wrapper (a script, `env ...`) that runs a
# build of the right kind, which the executors' check cannot see through.
SKIP_BIN_CHECK_ENV = "SYMCC_MPI_SKIP_BIN_CHECK"
TEMPORARY_DIRECTORY_VARIABLES = ("TMPDIR", "TEMP", "TMP")
CACHE_HOME_ENV = "XDG_CACHE_HOME"
COMPILER_ENV = "CC"
ASIDE_MAX_INPUTS_ENV = "SYMCC_ASIDE_MAX_INPUTS"
ASIDE_MAX_MB_ENV = "SYMCC_ASIDE_MAX_MB"
DEFAULT_ASIDE_MAX_INPUTS = 100_000
DEFAULT_ASIDE_MAX_MB = 256
WATCHDOG_ENV = "SYMCC_DISPATCH_WATCHDOG_SEC"
PROTOCOL_RETRIES_ENV = "SYMCC_DISPATCH_PROTOCOL_RETRIES"
WORK_LEASE_TTL_ENV = "SYMCC_STANDALONE_WORK_LEASE_TTL"
WORK_LOCK_ACQUIRE_TIMEOUT_ENV = "SYMCC_STANDALONE_WORK_LOCK_ACQUIRE_TIMEOUT"
TARGET_LEASE_TTL_ENV = "SYMCC_TARGET_LEASE_TTL"  # seconds; default: the work leases' TTL
# SymCC's runtime reads these in a run (we set them); the Triton shim, which stands in for a
# SymCC build, reads them too.
SYMCC_INPUT_FILE_ENV = "SYMCC_INPUT_FILE"
SYMCC_OUTPUT_DIR_ENV = "SYMCC_OUTPUT_DIR"
SYMCC_NO_SYMBOLIC_INPUT_ENV = "SYMCC_NO_SYMBOLIC_INPUT"
TRITON_SOLVER_ENV = "SYMCC_TRITON_SOLVER"  # the Triton shim's solver: bitwuzla or z3


def _environ(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


@dataclass(frozen=True)
class LaunchEnvironment:
    """How this process was started."""

    under_mpi: bool  # a rank of an MPI job (mpiexec, mpirun, srun --mpi=pmix)
    by_us: bool  # ... that symcc-mpi's own launcher started
    run_id: str | None  # the launcher's name for this run
    command_time: float | None  # when the user's command started, by the launcher's clock
    slurm_nodes: int  # nodes of the Slurm allocation (1 outside Slurm)


def launch_environment(env: Mapping[str, str] | None = None) -> LaunchEnvironment:
    env = _environ(env)
    try:
        command_time = float(env[COMMAND_TIME_ENV])
    except (KeyError, ValueError):
        command_time = None
    try:
        nodes = max(1, int(env.get(SLURM_NODES_ENV, "1")))
    except ValueError:
        nodes = 1
    return LaunchEnvironment(under_mpi=any(name in env for name in MPI_RANK_VARIABLES),
                             by_us=env.get(LAUNCHED_ENV) == "1",
                             run_id=env.get(RUN_ID_ENV) or None,
                             command_time=command_time, slurm_nodes=nodes)


@dataclass(frozen=True)
class UlfmLaunch:
    """What mpiexec's environment says about ULFM (Open MPI's MCA variables)."""

    fault_tolerant: bool  # --with-ft ulfm
    pml: str  # the point-to-point layer; ULFM needs ob1


def ulfm_launch(env: Mapping[str, str] | None = None) -> UlfmLaunch:
    env = _environ(env)
    return UlfmLaunch(fault_tolerant=env.get(OMPI_FT_ENABLE_ENV, "").lower()
                      in ("1", "true", "yes"),
                      pml=env.get(OMPI_PML_ENV, ""))


def log_level(env: Mapping[str, str] | None = None) -> str:
    return _environ(env).get(LOG_LEVEL_ENV, "INFO").upper()


def fault_plan(env: Mapping[str, str] | None = None) -> str:
    """The fault plan's text (its grammar is roles/faults.py's); "" for none."""
    return _environ(env).get(FAULTS_ENV, "")


def skip_bin_check(env: Mapping[str, str] | None = None) -> bool:
    return _environ(env).get(SKIP_BIN_CHECK_ENV) == "1"


def temporary_directory_set(env: Mapping[str, str] | None = None) -> bool:
    """Whether the user (or the scheduler) named this node's temporary directory."""
    env = _environ(env)
    return any(env.get(name) for name in TEMPORARY_DIRECTORY_VARIABLES)


@dataclass(frozen=True)
class BuildTools:
    """Where to build and cache the SymCC preload library."""

    cache_home: Path  # $XDG_CACHE_HOME, else ~/.cache
    compiler: str | None  # $CC, if set


def build_tools(env: Mapping[str, str] | None = None) -> BuildTools:
    env = _environ(env)
    return BuildTools(cache_home=Path(env.get(CACHE_HOME_ENV) or Path.home() / ".cache"),
                      compiler=env.get(COMPILER_ENV) or None)


@dataclass(frozen=True)
class AsideBounds:
    """The aside pool's bounds (scheduling/tiers/pool.py)."""

    max_inputs: int = DEFAULT_ASIDE_MAX_INPUTS
    max_bytes: int = DEFAULT_ASIDE_MAX_MB << 20


def aside_bounds(env: Mapping[str, str] | None = None) -> AsideBounds:
    """A value that is not a positive integer is refused in one line (UsageError)."""
    env = _environ(env)
    values = []
    for name, default in ((ASIDE_MAX_INPUTS_ENV, DEFAULT_ASIDE_MAX_INPUTS),
                          (ASIDE_MAX_MB_ENV, DEFAULT_ASIDE_MAX_MB)):
        text = env.get(name, str(default))
        if not text.isdigit() or int(text) < 1:
            raise UsageError(f"{name}={text!r}: a positive integer, please")
        values.append(int(text))
    return AsideBounds(values[0], values[1] << 20)


def watchdog_seconds(env: Mapping[str, str] | None = None, *, default: float,
                     cap: float) -> tuple[float, str | None]:
    """The dispatch watchdog's seconds (0: none), and what was ignored or adjusted (None if
    nothing)."""
    text = _environ(env).get(WATCHDOG_ENV)
    if text is None or not text.strip():
        return default, None
    try:
        value = float(text.strip())
    except ValueError:
        return default, f"{WATCHDOG_ENV}={text!r} is not a number: default {default:g} s"
    if not math.isfinite(value):
        return default, f"{WATCHDOG_ENV}={text!r} is not finite: default {default:g} s"
    if value < 0:
        return 0.0, f"{WATCHDOG_ENV}={text!r} is negative: watchdog disabled"
    if value > cap:
        return cap, f"{WATCHDOG_ENV}={text!r} is above {cap:g}: capped"
    return value, None


def protocol_retries(env: Mapping[str, str] | None = None, *,
                     default: int) -> tuple[int, str | None]:
    """The dispatch protocol's retries, and what was ignored or adjusted (None if nothing)."""
    text = _environ(env).get(PROTOCOL_RETRIES_ENV)
    if text is None or not text.strip():
        return default, None
    try:
        value = int(text.strip())
    except ValueError:
        return default, (f"{PROTOCOL_RETRIES_ENV}={text!r} is not an integer: "
                         f"default {default}")
    if value < 0:
        return 0, f"{PROTOCOL_RETRIES_ENV}={text!r} is negative: 0 (defer at once)"
    return value, None


@dataclass(frozen=True)
class WorkLeaseSettings:
    """The work lease table's knobs as set (None: unset, blank or refused: the default)."""

    ttl: float | None
    lock_timeout: float | None
    rejected: tuple[str, ...]  # NAME='value' of each refused setting, for the log


def work_lease_settings(env: Mapping[str, str] | None = None) -> WorkLeaseSettings:
    """TTL and lock timeout: a finite number of seconds > 0. Anything else is refused
    (listed in `rejected`)."""
    env = _environ(env)
    rejected: list[str] = []

    def pick(name: str, parse: Callable[[str], Any]) -> Any:
        raw = env.get(name, "").strip()
        if not raw:
            return None
        value = parse(raw)
        if value is None:
            rejected.append(f"{name}={raw!r}")
        return value

    return WorkLeaseSettings(ttl=pick(WORK_LEASE_TTL_ENV, _positive_seconds),
                             lock_timeout=pick(WORK_LOCK_ACQUIRE_TIMEOUT_ENV,
                                               _positive_seconds),
                             rejected=tuple(rejected))


def target_lease_ttl(env: Mapping[str, str] | None = None) -> tuple[float | None, str]:
    """The target leases' TTL as set (None: unset or refused), and the refused setting to
    warn about ("" if none)."""
    raw = _environ(env).get(TARGET_LEASE_TTL_ENV, "").strip()
    if not raw:
        return None, ""
    value = _positive_seconds(raw)
    return (value, "") if value is not None else (None, f"{TARGET_LEASE_TTL_ENV}={raw!r}")


@dataclass(frozen=True)
class SymccRun:
    """What a SymCC build (or the Triton shim standing in for one) is told by its caller."""

    input_file: str | None  # the input's path, when the target reads a file
    output_dir: Path  # where generated inputs go
    solver: str  # the Triton shim's


def symcc_run(env: Mapping[str, str] | None = None) -> SymccRun:
    env = _environ(env)
    return SymccRun(input_file=env.get(SYMCC_INPUT_FILE_ENV) or None,
                    output_dir=Path(env.get(SYMCC_OUTPUT_DIR_ENV, "/tmp/output")),
                    solver=env.get(TRITON_SOLVER_ENV, "bitwuzla"))


def _positive_seconds(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None
