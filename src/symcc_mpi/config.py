"""Typed campaign configuration and the up-front checks of what a user gave us."""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

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
