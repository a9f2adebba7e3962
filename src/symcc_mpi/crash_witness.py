"""Whether a run the executor saw die is a crash of the target, or a failure of the executor.

A SymCC build dies with the target's bugs and with its runtime's own (QSYM's solver throwing
on an expression it cannot sort, an assertion in the runtime): on many real targets every run
aborts that way after writing its inputs. So a run that dies is a crash only if a run of the
target without the executor dies on the same input too, the witness: the AFL build when the
campaign has one, else the plain build the user names (--plain-target), else the SymCC
build run without symbolic input. Otherwise it is an executor failure with its reason,
and what the run wrote before it died is triaged and explored as any run's children.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

from .executors.base import ExecutionResult, Outcome
from .executors.process import run_once
from .triage import Status

REASON_LENGTH = 240  # characters of a failure's reason: what groups them in the summary


@dataclasses.dataclass(frozen=True)
class CrashWitness:
    name: str  # as a reason says it: "the AFL build"
    crashes: Callable[[bytes, Path], bool]  # (the input's bytes, a file holding them)

    def judge(self, result: ExecutionResult, data: bytes, input_path: Path,
              executor: str) -> ExecutionResult:
        """`result`, a CRASH of the executor's run, as it stands if the witness crashes on
        the input too, else as an ERROR saying why the executor's run died."""
        if self.crashes(data, input_path):
            return result
        return dataclasses.replace(result, outcome=Outcome.ERROR,
                                   message=failure_reason(result, executor, self.name))


def failure_reason(result: ExecutionResult, executor: str, witness: str) -> str:
    status = result.exit_status
    how = f"{_signal_name(-status)}" if status is not None and status < 0 \
        else f"exit status {status}"
    reason = f"{how} in the {executor} run, not in {witness}"
    if result.message:
        reason += f": {result.message}"
    return reason[:REASON_LENGTH]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def make_witness(config, executor_name: str, probe, scratch: Path) -> CrashWitness | None:
    """The witness of a worker's SymCC runs (see the module's doc). None for the others:
    Triton's runs are confirmed by the native run of its plain target that each one makes
    (executors/triton_engine.classify), noop's never die."""
    if executor_name != "symcc":
        return None
    if probe is not None:
        return CrashWitness("the AFL build",
                            lambda data, _: probe.probe_bytes(data).status is Status.CRASH)
    if config.plain_target:
        return CrashWitness("the plain build",
                            _native_run(config.plain_target, config, dict(os.environ)))
    replay = scratch / "replay"  # SymCC's runtime wants an output directory that exists
    replay.mkdir(exist_ok=True)
    env = dict(os.environ, SYMCC_NO_SYMBOLIC_INPUT="1", SYMCC_OUTPUT_DIR=str(replay))
    return CrashWitness("the SymCC build without symbolic input (SYMCC_NO_SYMBOLIC_INPUT=1)",
                        _native_run(config.target, config, env, emptied=replay))


def _native_run(target: tuple[str, ...], config, env: dict, *,
                emptied: Path | None = None) -> Callable[[bytes, Path], bool]:
    uses_file = "@@" in target

    def crashes(_: bytes, input_path: Path) -> bool:
        argv = [str(input_path) if arg == "@@" else arg for arg in target]
        try:
            ended, _ = run_once(argv, env, stdin=None if uses_file else input_path,
                                timeout=config.timeout, memory_limit_mb=config.memory_limit_mb)
        except OSError:
            return False  # the witness cannot run: the executor's word is not confirmed
        finally:
            if emptied is not None:
                shutil.rmtree(emptied, ignore_errors=True)
                emptied.mkdir(exist_ok=True)
        return ended.status < 0 and not ended.timed_out

    return crashes
