"""TritonExecutor: the embedded concolic backend (tritondse behind SymCC's contract, DESIGN §3)."""

from __future__ import annotations

import importlib.util
import json
import os
import select
import shutil
import subprocess
import sys
from pathlib import Path

from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.durable.regular import list_regular
from symcc_mpi.executors.base import ExecutionResult, ExecutorError, Outcome

SERVER_MODULE = "symcc_mpi.executors.triton_server"
_SRC_ROOT = Path(__file__).resolve().parents[2]  # so the server finds us even when not installed
_REPLY_GRACE = 10.0  # seconds the server may take beyond the run timeout before we call it dead


def check_tritondse() -> None:
    """Raises ExecutorError when tritondse/Triton cannot be found (without importing them: 2 s)."""
    for module in ("tritondse", "triton"):
        if importlib.util.find_spec(module) is None:
            raise ExecutorError(
                f"tritondse is not installed: module {module!r} not found "
                f"(pip install tritondse triton-library 'bitstring<4')"
            )


def resolve_target(argv0: str) -> str:
    path = shutil.which(argv0) if os.sep not in argv0 else argv0
    if not path or not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise ExecutorError(f"target not found or not executable: {argv0}")
    return os.path.abspath(path)


class TritonExecutor:
    """Explores one input per run with tritondse; see triton_server for the isolation.

    The target is an ordinary x86-64 binary (plain `gcc -O0`). `@@` in its arguments is
    replaced by the input path (else the input goes to stdin). Each run also executes the
    real binary once: its fate decides CRASH; engine limits are reported as ERROR.
    """

    name = "triton"
    targetable = True

    def __init__(
        self,
        target_argv: list[str],
        *,
        timeout: float,
        memory_limit_mb: int | None = None,
        solver_timeout_ms: int = 1000,
        max_queries: int = 2000,
        optimistic: bool = True,
        solver: str = "bitwuzla",
        startup_timeout: float = 60.0,
        python: str | None = None,
        scratch: Path | None = None,
    ) -> None:
        """`scratch`: the worker's node-local directory, the server's (and so the target's)
        TMPDIR."""
        if not target_argv:
            raise ExecutorError("empty target command line")
        if timeout <= 0:
            raise ExecutorError("timeout must be positive")
        check_tritondse()
        self.target_argv = [resolve_target(target_argv[0]), *target_argv[1:]]
        self.timeout = float(timeout)
        self.memory_limit_mb = memory_limit_mb
        self.engine_options = {
            "solver_timeout_ms": int(solver_timeout_ms),
            "max_queries": int(max_queries),
            "optimistic": bool(optimistic),
            "solver": solver,
        }
        if solver not in ("bitwuzla", "z3"):
            raise ExecutorError(f"unknown solver {solver!r} (bitwuzla or z3)")
        self.startup_timeout = startup_timeout
        self.python = python or sys.executable
        self.stdin_mode = not any("@@" in a for a in target_argv[1:])
        self.tmpdir = scratch
        self._server: subprocess.Popen | None = None
        self._buf = b""
        self.server_starts = 0
        self.versions: dict = {}  # tritondse and Triton versions, known once the server runs

    # -- server lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Starts the server now (else the first run does); raises ExecutorError if unusable."""
        if self._server is not None and self._server.poll() is None:
            return
        self._discard_server()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_SRC_ROOT), env.get("PYTHONPATH")) if p)
        if self.tmpdir is not None:
            env["TMPDIR"] = str(self.tmpdir)
        try:
            # Popen execs at once (no Python runs between fork and exec): safe in an MPI rank.
            self._server = subprocess.Popen(
                [self.python, "-m", SERVER_MODULE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                close_fds=True,
            )
        except OSError as e:
            raise ExecutorError(f"cannot start the triton server: {e}") from None
        self.server_starts += 1
        hello = self._read_reply(SYSTEM_CLOCK.monotonic() + self.startup_timeout)
        if hello is None:
            self._discard_server()
            raise ExecutorError("the triton server did not start")
        if not hello.get("hello"):
            self._discard_server()
            raise ExecutorError(f"tritondse is not usable: {hello.get('error', 'unknown error')}")
        self.versions = hello.get("versions", {})

    def close(self) -> None:
        """Stops the server (a later run starts a new one)."""
        srv = self._server
        if srv is None:
            return
        try:
            srv.stdin.write(b'{"op": "shutdown"}\n')
            srv.stdin.close()
        except OSError:
            pass
        try:
            srv.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()
        self._discard_server()

    def cancel(self) -> None:
        server = self._server
        if server is not None:
            server.kill()  # the run's read sees the end of its output: a dead server

    def __enter__(self) -> TritonExecutor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _discard_server(self) -> None:
        srv, self._server, self._buf = self._server, None, b""
        if srv is None:
            return
        if srv.poll() is None:
            srv.kill()
            srv.wait()
        for f in (srv.stdin, srv.stdout):
            try:
                f.close()
            except OSError:
                pass

    def _read_reply(self, deadline: float) -> dict | None:
        """One JSON line from the server, or None if it died or stayed silent until deadline."""
        fd = self._server.stdout.fileno()
        while b"\n" not in self._buf:
            remaining = deadline - SYSTEM_CLOCK.monotonic()
            if remaining <= 0:
                return None
            r, _, _ = select.select([fd], [], [], remaining)
            if not r:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            return json.loads(line)
        except ValueError:
            return None

    # -- runs -------------------------------------------------------------------------

    def command_for(self, input_path: Path) -> list[str]:
        path = str(input_path)
        return [self.target_argv[0], *(a.replace("@@", path) for a in self.target_argv[1:])]

    def run(self, input_path: Path, output_dir: Path,
            targets: frozenset[int] | None = None, *, pruned: bool = True) -> ExecutionResult:
        input_path = Path(os.path.abspath(input_path))
        output_dir = Path(os.path.abspath(output_dir))
        self.start()
        request = {
            "op": "run",
            "argv": self.command_for(input_path),
            "input": str(input_path),
            "input_name": "stdin" if self.stdin_mode else str(input_path),
            "output_dir": str(output_dir),
            "timeout": self.timeout,
            "memory_limit_mb": self.memory_limit_mb,
            "engine": self.engine_options,
            "targets": None if targets is None else sorted(targets),
        }
        t0 = SYSTEM_CLOCK.monotonic()
        reply = None
        try:
            self._server.stdin.write((json.dumps(request) + "\n").encode())
            self._server.stdin.flush()
            reply = self._read_reply(t0 + self.timeout + _REPLY_GRACE)
        except OSError:
            pass
        listing = list_regular(output_dir)
        skipped = tuple(sorted(listing.skipped.items()))
        if reply is None or "outcome" not in reply:
            # Dead or wedged: the next run starts a fresh server.
            self._discard_server()
            return ExecutionResult(
                outcome=Outcome.ERROR,
                exit_status=None,
                wall_time=SYSTEM_CLOCK.monotonic() - t0,
                generated=listing.files,
                skipped=skipped,
                message="the triton server died during the run",
            )
        return ExecutionResult(
            outcome=Outcome(reply["outcome"]),
            exit_status=reply.get("exit_status"),
            wall_time=float(reply.get("wall_time", SYSTEM_CLOCK.monotonic() - t0)),
            solver_time=float(reply.get("solver_time", 0.0)),
            generated=listing.files,
            skipped=skipped,
            message=reply.get("message", ""),
            extra=reply.get("extra", {}),
            path_targets=_targets(reply.get("path_targets")),
            solved_targets=_targets(reply.get("solved_targets")) or (),
        )


def _targets(listed) -> tuple[int, ...] | None:
    """The server's list of branch targets, or None when it sent none (a run cut short)."""
    if not isinstance(listed, list):
        return None
    return tuple(t for t in listed if isinstance(t, int) and t > 0)
