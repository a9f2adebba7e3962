"""A SymCC-binary look-alike: `python tests/triton_shim.py TARGET [ARGS...]`.

It behaves like TARGET compiled with SymCC (QSYM backend): the input is the file named by
SYMCC_INPUT_FILE when that path appears in ARGS, else its own stdin; new inputs land in
SYMCC_OUTPUT_DIR (default /tmp/output), named like QSYM's (000000, 000001-optimistic, ...);
QSYM's `[STAT] SMT: { "solving_time": N, "total_time": M }` (before each query) and
`[STAT] SMT: { "solving_time": N }` (after it) lines go to stderr, N and M cumulative
microseconds, so the last line carries the run's total solving time; and
it ends like the target did natively: same exit code, or death by the same signal.
Used to test the SymCC subprocess backend with a real concolic engine behind it.
SYMCC_TRITON_SOLVER=z3 selects Z3 instead of Bitwuzla. If tritondse cannot be imported it
says so in one line and exits with status 127, like a binary that cannot start.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

from symcc_mpi.config import symcc_run
from symcc_mpi.processes.limited import no_core_dumps

USAGE = "usage: python tests/triton_shim.py TARGET [ARGS...]"


def _stat_line(solving: float, total: float | None) -> None:
    """QSYM's lines: before a query with total_time, after it without (both cumulative µs)."""
    extra = "" if total is None else f', "total_time": {int(total * 1e6)}'
    sys.stderr.write(f'[STAT] SMT: {{ "solving_time": {int(solving * 1e6)}{extra} }}\n')


def _die_like(status: int) -> None:
    """Ends the process the way the target ended: exit code, or the same fatal signal."""
    sys.stdout.flush()
    sys.stderr.flush()
    if status < 0:
        sig = -status
        signal.signal(sig, signal.SIG_DFL)
        try:
            no_core_dumps()  # no core dump of a Python process for the target's crash
        except (ValueError, OSError):
            pass
        os.kill(os.getpid(), sig)
        os._exit(
            128 + sig
        )  # a signal that does not kill (e.g. SIGCHLD) falls back to the shell convention
    # os._exit: skip interpreter teardown (lief's bindings print leak warnings at exit).
    os._exit(status & 0xFF)


def main(args: list[str] | None = None) -> None:
    args = sys.argv[1:] if args is None else args
    if not args or args[0] in ("-h", "--help"):
        sys.stderr.write(USAGE + "\n")
        _die_like(2 if not args else 0)
    target = shutil.which(args[0]) if os.sep not in args[0] else args[0]
    if not target or not os.access(target, os.X_OK):
        sys.stderr.write(f"triton_shim: target not found or not executable: {args[0]}\n")
        _die_like(127)
    argv = [target, *args[1:]]

    run = symcc_run()
    input_file = run.input_file
    if input_file and any(input_file in a for a in args[1:]):
        input_name = input_file
        data = Path(input_file).read_bytes()
        stdin_data = None
    else:
        data = sys.stdin.buffer.read()
        stdin_data = data
    out_dir = run.output_dir
    out_dir.mkdir(parents=True, exist_ok=True)

    try:
        from symcc_mpi.executors import (
            triton_engine as eng,  # ~2 s: the price a one-shot process pays
        )
    except Exception as e:  # noqa: BLE001 - one line, like a binary that cannot start
        sys.stderr.write(f"triton_shim: tritondse is not usable: {type(e).__name__}: {e}\n")
        _die_like(127)

    if stdin_data is not None:
        input_name = eng.STDIN_NAME
    # The real run goes alongside the emulation; the supervisor kills our group on timeout.
    native_run = eng.NativeRun(argv, stdin_data, env=dict(os.environ))
    try:
        result = eng.explore(
            eng.LoadedTarget(target),
            argv,
            input_name,
            data,
            out_dir,
            eng.EngineOptions.from_dict(
                {"solver": run.solver}
            ),
            on_query=_stat_line,
        )
        if result.stop != "end":
            sys.stderr.write(f"triton_shim: tritondse: {result.message}\n")
    except Exception as e:  # noqa: BLE001 - the target's own fate must still be reported
        sys.stderr.write(f"triton_shim: tritondse failed: {type(e).__name__}: {e}\n")
    native = native_run.wait()
    if native.exit_status is None:
        sys.stderr.write(f"triton_shim: cannot execute {target}\n")
        _die_like(127)
    _die_like(native.exit_status)


if __name__ == "__main__":
    main()
