"""Private Triton server: imports tritondse once, then explores each request in a forked child.

Protocol (one JSON object per line): the server first writes a hello line
(`{"hello": true, "versions": {...}}` or `{"hello": false, "error": "..."}`), then answers
each request line on stdin with one reply line on stdout.

    {"op": "run", "argv": [...], "input": "/abs/in", "input_name": "/abs/in" | "stdin",
     "output_dir": "/abs/out", "timeout": 10.0, "memory_limit_mb": null, "engine": {...}}
    -> {"outcome": "ok", "exit_status": 0, "wall_time": 0.1, "solver_time": 0.05,
        "message": "", "extra": {...}}
    {"op": "ping"} -> {"pong": true, "pid": N}
    {"op": "shutdown"} -> (exits)

Run as `python -m symcc_mpi.executors.triton_server`; it never imports MPI, so forking it is safe.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import select
import signal
import sys
from pathlib import Path

from symcc_mpi.config import SYMCC_INPUT_FILE_ENV
from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.processes.limited import kill_group

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_POLL = 0.05  # seconds between memory checks and parent-liveness checks while a child runs


def _page_rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def _prctl(option: int, arg: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _reap_orphans() -> None:
    """Collects targets whose parent (a killed child) died before them: we are their subreaper."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


class Server:
    def __init__(self, rfd: int, wfd: int) -> None:
        self.rfd = rfd
        self.wfd = wfd
        self._buf = b""
        self._eof = False
        from symcc_mpi.executors import triton_engine  # the expensive import, paid once

        self.engine = triton_engine
        self.targets = triton_engine.TargetCache()
        triton_engine.quiet_tritondse()

    def send(self, obj: dict) -> None:
        _write_line(self.wfd, obj)

    def _readline(self) -> bytes | None:
        while b"\n" not in self._buf:
            chunk = os.read(self.rfd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _stdin_closed(self) -> bool:
        """True once our client has gone (EOF on the request pipe), read without consuming lines."""
        if self._eof:
            return True
        r, _, _ = select.select([self.rfd], [], [], 0)
        if r:
            chunk = os.read(self.rfd, 65536)
            if not chunk:
                self._eof = True
            self._buf += chunk
        return self._eof

    def serve(self) -> None:
        while True:
            line = self._readline()
            if line is None:
                return
            try:
                req = json.loads(line)
            except ValueError:
                self.send({"outcome": "error", "message": "malformed request"})
                continue
            op = req.get("op")
            if op == "shutdown":
                return
            if op == "ping":
                self.send({"pong": True, "pid": os.getpid()})
            elif op == "run":
                self.send(self.run(req))
            else:
                self.send({"outcome": "error", "message": f"unknown op {op!r}"})
            if self._eof:
                return

    def run(self, req: dict) -> dict:
        t0 = SYSTEM_CLOCK.monotonic()
        _reap_orphans()
        try:
            target = self.targets.get(req["argv"][0])
        except Exception as e:  # noqa: BLE001 - lief/tritondse raise many kinds
            return {
                "outcome": "error",
                "exit_status": None,
                "wall_time": 0.0,
                "message": f"tritondse cannot load {req['argv'][0]}: {e}",
            }
        out_dir = Path(req["output_dir"])
        rfd, wfd = os.pipe()
        gc.freeze()  # the child's collections must not touch (and so copy) the server's heap
        pid = os.fork()
        if pid == 0:
            os.close(rfd)
            self._child(target, req, wfd)  # never returns
        os.close(wfd)
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass  # the child already did it, or already exited
        return self._wait(pid, rfd, req, out_dir, t0)

    def _child(self, target, req: dict, wfd: int) -> None:
        status = 0
        try:
            os.setpgid(0, 0)  # the server kills this whole group (native run included) on timeout
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.close(self.rfd)
            os.close(self.wfd)
            self._explore(target, req, wfd)
        except BaseException as e:  # noqa: BLE001 - report anything, never unwind into the server loop
            try:
                _write_line(wfd, {"error": f"{type(e).__name__}: {e}"})
            except OSError:
                pass
            status = 1
        finally:
            os._exit(status)

    def _explore(self, target, req: dict, wfd: int) -> None:
        eng = self.engine
        argv = req["argv"]
        input_name = req["input_name"]
        data = Path(req["input"]).read_bytes()
        env = dict(os.environ)
        env.pop(SYMCC_INPUT_FILE_ENV, None)
        if input_name != eng.STDIN_NAME:
            env[SYMCC_INPUT_FILE_ENV] = req["input"]
        # The native result goes first so that a timeout in the emulator cannot hide a crash.
        native = eng.run_native(
            argv,
            data if input_name == eng.STDIN_NAME else None,
            env=env,
            memory_limit_mb=req.get("memory_limit_mb"),
        )
        _write_line(wfd, {"native": native.exit_status, "native_wall": native.wall_time})
        result = eng.explore(
            target,
            argv,
            input_name,
            data,
            Path(req["output_dir"]),
            eng.EngineOptions.from_dict(req.get("engine")),
            targets=None if req.get("targets") is None else frozenset(req["targets"]),
        )
        _write_line(wfd, {"engine": eng.engine_summary(result)})

    def _wait(self, pid: int, rfd: int, req: dict, out_dir: Path, t0: float) -> dict:
        deadline = t0 + float(req["timeout"])
        limit = req.get("memory_limit_mb")
        base_rss = _page_rss(os.getpid())
        buf = b""
        killed: str | None = None
        while True:
            remaining = deadline - SYSTEM_CLOCK.monotonic()
            if remaining <= 0:
                killed = "timeout"
                break
            r, _, _ = select.select([rfd], [], [], min(remaining, _POLL))
            if r:
                chunk = os.read(rfd, 65536)
                if not chunk:
                    break  # the child closed its end: it is exiting
                buf += chunk
                continue
            if limit and _page_rss(pid) - base_rss > limit * 1024 * 1024:
                killed = "oom"
                break
            if self._stdin_closed():
                killed = "client gone"
                break
        if killed:
            kill_group(pid)
        _, wstatus = os.waitpid(pid, 0)
        _reap_orphans()
        if killed:
            kill_group(pid)  # stragglers that outlived the child
            buf += _drain(rfd)
            for tmp in out_dir.glob(self.engine.TMP_PREFIX + "*"):
                tmp.unlink(missing_ok=True)
        os.close(rfd)
        wall = SYSTEM_CLOCK.monotonic() - t0
        return self._reply(buf, wstatus, killed, wall)

    def _reply(self, buf: bytes, wstatus: int, killed: str | None, wall: float) -> dict:
        eng = self.engine
        msgs: dict = {}
        for line in buf.splitlines():
            try:
                msgs.update(json.loads(line))
            except ValueError:
                pass
        native = None
        if "native" in msgs:
            native = eng.NativeResult(
                exit_status=msgs["native"], wall_time=msgs.get("native_wall", 0.0)
            )
        engine = None
        if "engine" in msgs:
            e = msgs["engine"]
            engine = eng.EngineResult(stop=e.get("stop", "limit"), message=e.get("message", ""))
        extra = dict(msgs.get("engine", {}))
        extra.pop("message", None)
        extra.pop("stop", None)
        if native is not None:
            extra["native_exit_status"] = native.exit_status
            extra["native_wall_time"] = native.wall_time
        if engine is not None:
            extra["engine_stop"] = engine.stop
        solver_time = float(extra.pop("solver_time", 0.0))
        reply = {"wall_time": wall, "solver_time": solver_time, "extra": extra}
        if "path_targets" in extra:
            reply["path_targets"] = extra.pop("path_targets")
            reply["solved_targets"] = extra.pop("solved_targets", [])

        if native is not None and native.crashed:
            # A crash found natively stands even if the emulation was then cut short.
            reply.update(outcome="crash", exit_status=native.exit_status, message="")
            if killed:
                extra["engine_killed"] = killed
        elif killed == "timeout":
            reply.update(outcome="timeout", exit_status=-signal.SIGKILL, message="")
        elif killed == "oom":
            reply.update(outcome="oom", exit_status=-signal.SIGKILL, message="")
        elif killed:
            reply.update(outcome="error", exit_status=None, message=killed)
        elif "error" in msgs:
            reply.update(
                outcome="error",
                exit_status=native.exit_status if native else None,
                message=f"triton child failed: {msgs['error']}",
            )
        elif engine is None:
            how = (
                f"signal {os.WTERMSIG(wstatus)}"
                if os.WIFSIGNALED(wstatus)
                else f"exit status {os.WEXITSTATUS(wstatus)}"
            )
            reply.update(
                outcome="error",
                exit_status=native.exit_status if native else None,
                message=f"triton child died ({how}) before finishing",
            )
        else:
            outcome, status, message = eng.classify(native, engine)
            reply.update(outcome=outcome.value, exit_status=status, message=message)
        return reply


def _write_line(fd: int, obj: dict) -> None:
    data = (json.dumps(obj) + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


def _drain(fd: int) -> bytes:
    out = b""
    while True:
        r, _, _ = select.select([fd], [], [], 0)
        if not r:
            return out
        chunk = os.read(fd, 65536)
        if not chunk:
            return out
        out += chunk


def main() -> int:
    # The protocol owns the original stdin/stdout; fds 0/1 become harmless so that nothing
    # printed by a library (or inherited by a child) can corrupt or hold the pipes.
    rfd, wfd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C for the job ends us through EOF instead
    _prctl(
        _PR_SET_CHILD_SUBREAPER, 1
    )  # so that targets orphaned by a kill come back to us to be reaped
    try:
        server = Server(rfd, wfd)
    except Exception as e:  # noqa: BLE001 - any import failure is reported as one line
        _write_line(wfd, {"hello": False, "error": f"{type(e).__name__}: {e}"})
        return 1
    try:
        server.send({"hello": True, "pid": os.getpid(), "versions": server.engine.versions()})
        server.serve()
    except BrokenPipeError:
        pass  # our client has gone: nothing left to answer
    # Skip interpreter teardown: lief's bindings print pages of leak warnings at exit.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
