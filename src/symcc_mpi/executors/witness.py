"""Whether a run the executor saw die or time out is the target's crash or hang, or a
failure of the executor.

A SymCC build dies with the target's bugs and with its runtime's own (QSYM's solver throwing
on an expression it cannot sort, an assertion in the runtime): on many real targets every run
aborts that way after writing its inputs. And a SymCC run that times out is most often
solving, not the target hanging. So a SymCC run that dies is a crash, and one that times out
a hang, only if a run of the target without SymCC does the same on that input: the witness,
the AFL build when the campaign has one, else the plain build the user names
(--plain-target), else the SymCC build run without symbolic input. Otherwise it is an
executor failure with its reason, and what the run wrote before it ended is triaged and
explored as any run's children.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

from symcc_mpi.config import SYMCC_NO_SYMBOLIC_INPUT_ENV, SYMCC_OUTPUT_DIR_ENV
from symcc_mpi.coverage.edges import Status
from symcc_mpi.executors.base import ExecutionResult, Outcome
from symcc_mpi.processes import limited

REASON_LENGTH = 240  # characters of a failure's reason: what groups them in the summary
# What the witness must do on the input for the executor's word to stand.
_CONFIRMS = {Outcome.CRASH: Status.CRASH, Outcome.TIMEOUT: Status.HANG}


@dataclasses.dataclass(frozen=True)
class Witness:
    name: str  # as a reason says it: "the AFL build"
    run: Callable[[bytes, Path], Status]  # (the input's bytes, a file holding them)

    def judge(self, result: ExecutionResult, data: bytes, input_path: Path, executor: str,
              timeout: float) -> ExecutionResult:
        """`result` as it stands if it is no crash or hang, or if the witness does the same
        on the input; else an ERROR saying how the executor's run ended."""
        expected = _CONFIRMS.get(result.outcome)
        if expected is None or self.run(data, input_path) is expected:
            return result
        return dataclasses.replace(
            result, outcome=Outcome.ERROR,
            message=failure_reason(result, executor, self.name, timeout))


def failure_reason(result: ExecutionResult, executor: str, witness: str,
                   timeout: float) -> str:
    status = result.exit_status
    if result.outcome is Outcome.TIMEOUT:
        how = f"timed out after {timeout:g} s"
    elif status is not None and status < 0:
        how = _signal_name(-status)
    else:
        how = f"exit status {status}"
    reason = f"{how} in the {executor} run, not in {witness}"
    if result.message and result.outcome is Outcome.CRASH:
        reason += f": {result.message}"
    return reason[:REASON_LENGTH]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def make_witness(config, executor_name: str, probe, scratch: Path) -> Witness | None:
    """The witness of a worker's SymCC runs (see the module's doc). None for the others:
    Triton's runs are judged by the native run of its plain target that each one makes
    (executors/triton_engine.classify), noop's never die."""
    if executor_name != "symcc":
        return None
    if probe is not None:
        return Witness("the AFL build", lambda data, _: probe.probe_bytes(data).status)
    if config.plain_target:
        return Witness("the plain build",
                       _native_run(config.plain_target, config, dict(os.environ)))
    replay = scratch / "replay"  # SymCC's runtime wants an output directory that exists
    replay.mkdir(exist_ok=True)
    env = dict(os.environ, **{SYMCC_NO_SYMBOLIC_INPUT_ENV: "1",
                              SYMCC_OUTPUT_DIR_ENV: str(replay)})
    return Witness("the SymCC build without symbolic input (SYMCC_NO_SYMBOLIC_INPUT=1)",
                   _native_run(config.target, config, env, emptied=replay))


def _native_run(target: tuple[str, ...], config, env: dict, *,
                emptied: Path | None = None) -> Callable[[bytes, Path], Status]:
    uses_file = "@@" in target

    def run(_: bytes, input_path: Path) -> Status:
        argv = [str(input_path) if arg == "@@" else arg for arg in target]
        try:
            ended, _ = limited.run(argv, env, stdin=None if uses_file else input_path,
                                   timeout=config.timeout,
                                   memory_limit_mb=config.memory_limit_mb)
        except OSError:
            return Status.OK  # the witness cannot run: the executor's word is not confirmed
        finally:
            if emptied is not None:
                shutil.rmtree(emptied, ignore_errors=True)
                emptied.mkdir(exist_ok=True)
        if ended.timed_out:
            return Status.HANG
        return Status.CRASH if ended.status < 0 else Status.OK

    return run
