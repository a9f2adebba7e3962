"""The executor contract every backend honours (SymCC's contract, DESIGN §3)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


class Outcome(enum.Enum):
    """What one execution of the target did."""

    OK = "ok"
    CRASH = "crash"  # the target died of a signal or a sanitizer report
    TIMEOUT = "timeout"  # killed by the per-run timeout (the whole process group)
    OOM = "oom"  # killed by the memory limit
    ERROR = "error"  # the executor itself failed (not a finding about the target)


@dataclass(frozen=True)
class ExecutionResult:
    outcome: Outcome
    exit_status: int | None  # exit code, or -signal, or None when never started
    wall_time: float  # seconds
    solver_time: float = 0.0  # seconds spent in constraint solving, when known
    generated: tuple[Path, ...] = ()  # every regular file the run left in its output directory
    # Entries of the output directory that are not regular files (symlink, FIFO, ...), by
    # kind: never read, only counted (regular.list_regular).
    skipped: tuple[tuple[str, int], ...] = ()
    # For ERROR: what went wrong, one line. For CRASH: the last line the run wrote (a crash
    # the target's own run does not confirm becomes an ERROR for that reason: witness.py).
    message: str = ""
    extra: dict = field(default_factory=dict)
    solver_queries: int = 0  # solver checks made
    queries_skipped: int | None = None  # symbolic branches not solved (pruned); None: unknown
    # Branch targets (see `Executor.targetable`): those on the input's path, in the order
    # first met, and those whose negation this run handed to the solver. None: not known.
    path_targets: tuple[int, ...] | None = None
    solved_targets: tuple[int, ...] = ()


class ExecutorError(Exception):
    """The executor cannot be used at all (not installed, target unusable)."""


class Executor(Protocol):
    """Runs the target on one input and collects the test cases it generated.

    `output_dir` is an empty private directory (SYMCC_OUTPUT_DIR); every regular file left
    in it after the run is a generated test case. Anything else there (a symlink, a FIFO, a
    device, a socket, a directory) is skipped unread and reported in `skipped`.
    """

    name: str
    # A branch target is a positive integer naming one branch as the executor sees it (Triton:
    # the conditional jump's address; SymCC: 1 + the index QSYM's AflTraceMap gives the branch
    # in its context). A targetable executor reports the targets on every run's path, and
    # `run(..., targets=S)` solves only the branches in S (an empty S: none, a trace). One
    # that is not gets `targets=None` only: whole inputs. `pruned=False` asks a whole run to
    # solve every branch whatever the campaign's pruning (SymCC: no QSYM map, no
    # linearization); an executor that does not prune solves every branch anyway.
    targetable: bool

    def run(self, input_path: Path, output_dir: Path,
            targets: frozenset[int] | None = None, *, pruned: bool = True) -> ExecutionResult:
        ...

    def cancel(self) -> None:
        """From another thread: end the run in progress now (its result will be ignored)."""

    def close(self) -> None: ...
