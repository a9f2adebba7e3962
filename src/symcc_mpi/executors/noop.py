"""An executor that runs nothing: for measuring the dispatch machinery alone."""

from __future__ import annotations

from pathlib import Path

from symcc_mpi.executors.base import ExecutionResult, Outcome


class NoopExecutor:
    name = "noop"
    targetable = False

    def run(self, input_path: Path, output_dir: Path,
            targets: frozenset[int] | None = None, *, pruned: bool = True) -> ExecutionResult:
        return ExecutionResult(Outcome.OK, 0, 0.0)

    def cancel(self) -> None:
        pass

    def close(self) -> None:
        pass
