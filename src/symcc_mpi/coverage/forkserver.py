"""The coverage probe: the AFL build of the target run under AFL's forkserver protocol, one
forkserver kept per probe across every input it measures.

An `afl-showmap` process per batch costs its own start, the target's start and a map file
per input; on targets whose pruned SymCC runs take ~25 ms that was a third of a worker. Here
the AFL build is started once, stopped in its forkserver (AFL++'s runtime,
instrumentation/afl-compiler-rt.o.c), and asked for one fork per input: a probe costs a fork
of the target and a scan of its map, a third of a millisecond on the bundled parsers.

The protocol (AFL++ 4.04c, src/afl-forkserver.c and the runtime's __afl_start_forkserver):
- the target reads commands from fd 198 and writes answers on fd 199 (FORKSRV_FD); its map
  is the System V shared memory segment named by `__AFL_SHM_ID`, at least as large as the
  map size it reports (`AFL_DUMP_MAP_SIZE=1` makes it print that size and exit);
- it says hello with a 4-byte word of options (FS_OPT_*). Only if that word offers an
  automatic dictionary or shared-memory test cases does it wait for a reply, and a reply
  that takes neither counts as the first run request: we take the dictionary (and discard
  it); shared-memory test cases are never offered, `__AFL_SHM_FUZZ_ID` being unset;
- per input: we write 4 bytes (1 if we killed the previous child), it forks and writes the
  child's pid, then the child's wait status once it ends. A child that outlives the timeout
  is killed (a hang); one that ends on a signal crashed (as afl-showmap counts crashes).

The map is classified as afl-fuzz does (count_class_binary: hit counts 1, 2, 3, 4-7, 8-15,
16-31, 32-127, 128+ as one bit each). Not as afl-showmap 4.04c prints it: its human classes
(count_class_human, broken in 4.00c, fixed in 4.08c) leave out every count from 5 to 7, 9 to
15, 17 to 31, 33 to 127 and 129 to 255, so an edge hit five times was not covered at all
(measured: a loop run 5, 6, 7 or 9 times drops out of its map, 4 or 8 times does not). Map
index 0 counts as afl-showmap counts it: cleared when the runtime's "I ran" marker 1 is all
it holds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import signal
import struct
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from symcc_mpi.coverage.edges import BUCKET_BITS, AflTargetError, FileCoverage, Status, TriageError
from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.processes import limited
from symcc_mpi.processes.scratch import default_root
from symcc_mpi.processes.wordpipe import PipeClosed, read_word, write_word

FORKSRV_FD = 198
MAP_SIZE = 1 << 16  # AFL's MAP_SIZE: the smallest map the runtime accepts
_MIN_TIMEOUT_MS = 20  # as afl-showmap: less is below what a fork reliably takes
HELLO_WITHIN = 30.0  # seconds a target may take to reach its forkserver
FS_OPT_ENABLED = 0x80000001
FS_OPT_SHDMEM_FUZZ = 0x01000000
FS_OPT_AUTODICT = 0x10000000
FS_OPT_ERROR = 0xF800008F
FS_ERROR_MESSAGES = {  # the runtime's send_forkserver_error codes (types.h)
    1: "its map is larger than AFL_MAP_SIZE allows", 2: "its fixed map address is not free",
    4: "it could not open the shared memory", 8: "it could not attach the shared memory",
    16: "it could not map the shared memory", 32: "it has an old cmplog instrumentation"}
IPC_PRIVATE, IPC_CREAT, IPC_EXCL, IPC_RMID = 0, 0o1000, 0o2000, 0

# count_class_binary of afl-fuzz, as the bits of edges.BUCKET_BITS.
_CLASS = bytes(0 if n == 0 else BUCKET_BITS[0] if n == 1 else BUCKET_BITS[1] if n == 2
               else BUCKET_BITS[2] if n == 3 else BUCKET_BITS[3] if n < 8
               else BUCKET_BITS[4] if n < 16 else BUCKET_BITS[5] if n < 32
               else BUCKET_BITS[6] if n < 128 else BUCKET_BITS[7] for n in range(256))
_HIT = bytes([0] + [1] * 255)

# Variables that would change how the AFL build runs or what it reports: the debug ones let
# the target write where nobody reads, AFL_DEBUG_GDB stops it, AFL_NO_FORKSRV has no
# forkserver start, the shared-memory ids are ours to set.
_DROPPED_ENV = frozenset({"AFL_QUIET", "AFL_DEBUG", "AFL_DEBUG_CHILD", "AFL_DEBUG_CHILD_OUTPUT",
                          "AFL_DEBUG_GDB", "AFL_NO_FORKSRV", "__AFL_SHM_ID", "__AFL_SHM_FUZZ_ID",
                          "AFL_DUMP_MAP_SIZE"})
# What afl-fuzz and afl-showmap put in the target's environment (unless set already), so that
# a sanitizer's report ends the run the way they classify it; LD_BIND_NOW, so that the
# dynamic linker resolves symbols once, in the forkserver, not in every child.
_TARGET_ENV = {
    "ASAN_OPTIONS": "abort_on_error=1:detect_leaks=0:allocator_may_return_null=1:symbolize=0:"
    "detect_odr_violation=0:handle_segv=0:handle_sigbus=0:handle_abort=0:handle_sigfpe=0:"
    "handle_sigill=0",
    "UBSAN_OPTIONS": "halt_on_error=1:abort_on_error=1:malloc_context_size=0:"
    "allocator_may_return_null=1:symbolize=0:handle_segv=0:handle_sigbus=0:handle_abort=0:"
    "handle_sigfpe=0:handle_sigill=0",
    "LD_BIND_NOW": "1",
}


class ProbeStats(msgspec.Struct):
    """Counters of one probe: inputs probed, forkserver starts, crashes, hangs, seconds."""

    files: int = 0
    starts: int = 0
    crashes: int = 0
    hangs: int = 0
    seconds: float = 0.0


def _pinned(argv: Sequence[str]) -> list[str]:
    """`argv` for a run in another directory: each argument that names an existing path
    relative to this process's directory made absolute, so that it names the same one."""
    return [os.path.abspath(arg) if "@@" not in arg and not os.path.isabs(arg)
            and os.path.exists(arg) else arg for arg in argv]


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.shmget.argtypes = (ctypes.c_int, ctypes.c_size_t, ctypes.c_int)
_libc.shmat.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
_libc.shmat.restype = ctypes.c_void_p
_libc.shmdt.argtypes = (ctypes.c_void_p,)
_libc.shmctl.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_void_p)


class _SharedMap:
    """A System V shared memory segment, attached; removed (IPC_RMID) as soon as the
    forkserver holds it, so that nothing outlives the two processes."""

    def __init__(self, size: int):
        self.size = size
        self.id = _libc.shmget(IPC_PRIVATE, size, IPC_CREAT | IPC_EXCL | 0o600)
        if self.id < 0:
            raise TriageError(f"cannot create the coverage map: {os.strerror(ctypes.get_errno())}")
        address = _libc.shmat(self.id, None, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            self.remove()
            raise TriageError(f"cannot map the coverage map: {os.strerror(ctypes.get_errno())}")
        self.address = address

    def clear(self) -> None:
        ctypes.memset(self.address, 0, self.size)

    def read(self, length: int) -> bytes:
        return ctypes.string_at(self.address, length)

    def remove(self) -> None:
        if self.id >= 0:
            _libc.shmctl(self.id, IPC_RMID, None)
            self.id = -1

    def close(self) -> None:
        self.remove()
        if self.address is not None:
            _libc.shmdt(self.address)
            self.address = None


class ForkserverProbe:
    """Coverage and status of inputs on the AFL build `afl_target_argv` (`@@` for the input
    file, else stdin). `scratch_dir`: where its work directory goes (node-local, --scratch;
    by default scratch.default_root()); the target runs there, with TMPDIR there, relative
    paths in its command line made absolute first, unless `cwd` is given."""

    def __init__(self, afl_target_argv: Sequence[str], *, timeout: float,
                 memory_limit_mb: int | None = None, scratch_dir: Path | str | None = None,
                 cwd: Path | str | None = None, env: Mapping[str, str] | None = None):
        if not afl_target_argv:
            raise ValueError("empty AFL target command line")
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self._argv = list(afl_target_argv) if cwd is not None else _pinned(afl_target_argv)
        self._uses_file = any("@@" in arg for arg in self._argv)
        self.timeout_ms = max(_MIN_TIMEOUT_MS, math.ceil(timeout * 1000))
        self._memory_limit_mb = memory_limit_mb
        self._scratch_dir = Path(scratch_dir) if scratch_dir is not None else default_root()
        self._cwd = Path(cwd) if cwd is not None else None
        base = dict(os.environ if env is None else env)
        self._env = {k: v for k, v in base.items() if k not in _DROPPED_ENV}
        for key, value in _TARGET_ENV.items():
            self._env.setdefault(key, value)
        self._work: tempfile.TemporaryDirectory | None = None
        self._input_fd: int | None = None
        self._process: subprocess.Popen | None = None
        self._control: int | None = None
        self._status: int | None = None
        self._map: _SharedMap | None = None
        self._killed_last = False
        self.map_size: int | None = None
        self.stats = ProbeStats()

    # -- probing -------------------------------------------------------------------------

    def probe(self, files: Sequence[Path | str]) -> list[FileCoverage]:
        """Coverage and status of each file, in the order given."""
        return [self.probe_bytes(Path(path).read_bytes()) for path in files]

    def probe_bytes(self, data: bytes) -> FileCoverage:
        started = SYSTEM_CLOCK.monotonic()
        try:
            coverage = self._run(data)
        except PipeClosed:
            # The input may have killed the forkserver itself: once more on a fresh one,
            # and what that run says stands, a crash if it dies again.
            self._stop()
            try:
                coverage = self._run(data)
            except PipeClosed:
                self._stop()
                coverage = FileCoverage(Status.CRASH, b"", b"", self.map_size or 0)
        self.stats.files += 1
        self.stats.seconds += SYSTEM_CLOCK.monotonic() - started
        if coverage.status is Status.CRASH:
            self.stats.crashes += 1
        elif coverage.status is Status.HANG:
            self.stats.hangs += 1
        return coverage

    def _run(self, data: bytes) -> FileCoverage:
        if self._process is None:
            self._start()
        fd = self._input_fd
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.lseek(fd, 0, os.SEEK_SET)  # the child's stdin shares this offset
        self._map.clear()
        write_word(self._control, int(self._killed_last))
        self._killed_last = False
        pid = read_word(self._status, HELLO_WITHIN)
        if pid is None or not 0 < pid < 1 << 31:
            raise PipeClosed
        status = read_word(self._status, self.timeout_ms / 1000.0)
        timed_out = status is None
        if timed_out:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._killed_last = True
            status = read_word(self._status, HELLO_WITHIN)
            if status is None:
                raise PipeClosed
        return self._coverage(status, timed_out)

    def _coverage(self, status: int, timed_out: bool) -> FileCoverage:
        raw = self._map.read(self.map_size)
        if raw[0] == 1:  # the runtime's marker alone: afl-showmap does not count it
            raw = b"\x00" + raw[1:]
        classes = raw.translate(_CLASS)
        hit = classes.translate(_HIT)
        edges, find, index = [], hit.find, hit.find(1)
        while index >= 0:
            edges.append(index)
            index = find(1, index + 1)
        if timed_out:
            verdict = Status.HANG
        elif os.WIFSIGNALED(status):
            verdict = Status.CRASH
        else:
            verdict = Status.OK
        return FileCoverage(verdict, struct.pack(f"<{len(edges)}I", *edges),
                            classes.translate(None, b"\x00"), self.map_size)

    # -- the forkserver ------------------------------------------------------------------

    def _start(self) -> None:
        if self._work is None:
            self._work = tempfile.TemporaryDirectory(prefix="symcc-mpi-probe-",
                                                     dir=self._scratch_dir)
        work = Path(self._work.name)
        input_path = work / "input"
        if self._input_fd is None:
            self._input_fd = os.open(input_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        argv = [arg.replace("@@", str(input_path), 1) for arg in self._argv]
        env = {**self._env, "TMPDIR": str(work)}
        if self.map_size is None:
            self.map_size = self._dumped_map_size(argv, env, work)
        if self.map_size > MAP_SIZE:
            env["AFL_MAP_SIZE"] = str(self.map_size)
        self._map = _SharedMap(max(self.map_size, MAP_SIZE))
        env["__AFL_SHM_ID"] = str(self._map.id)
        control_read, control_write = os.pipe()
        status_read, status_write = os.pipe()
        try:
            self._process = self._spawn(argv, env, work, control_read, status_write)
        finally:
            os.close(control_read)
            os.close(status_write)
        self._control, self._status = control_write, status_read
        self.stats.starts += 1
        try:
            self._handshake(argv[0])
        except BaseException:
            self._stop()
            raise
        self._map.remove()  # the forkserver holds it now

    def _spawn(self, argv, env, work: Path, control: int, status: int) -> subprocess.Popen:
        """The AFL build, in its own session, with its command pipe as fd 198 and its answer
        pipe as fd 199. They are put there in this process (Python's child setup closes what
        it does not keep after any preexec_fn): only while both are free."""
        for fd in (FORKSRV_FD, FORKSRV_FD + 1):
            try:
                os.fstat(fd)
            except OSError:
                continue
            raise TriageError(f"file descriptor {fd}, which the AFL forkserver needs, is in use")
        os.dup2(control, FORKSRV_FD, inheritable=False)
        os.dup2(status, FORKSRV_FD + 1, inheritable=False)
        try:
            return limited.start(
                argv, env=env, stdin=subprocess.DEVNULL if self._uses_file else self._input_fd,
                memory_limit_mb=self._memory_limit_mb, no_core=True, cwd=self._cwd or work,
                pass_fds=(FORKSRV_FD, FORKSRV_FD + 1))
        except OSError as error:
            raise AflTargetError(f"cannot start the AFL target {argv[0]}: "
                                 f"{error.strerror}") from None
        finally:
            os.close(FORKSRV_FD)
            os.close(FORKSRV_FD + 1)

    def _handshake(self, program: str) -> None:
        try:
            hello = read_word(self._status, HELLO_WITHIN)
        except PipeClosed:
            hello = None
        if hello is None:
            raise AflTargetError(f"the AFL target {program} never reached its forkserver "
                                 "(not built with afl-clang-fast, or it exits at start)")
        if hello & FS_OPT_ERROR == FS_OPT_ERROR:
            code = (hello & 0x00FFFF00) >> 8
            raise AflTargetError(f"the AFL target {program} cannot run under the probe: "
                                 f"{FS_ERROR_MESSAGES.get(code, f'error {code}')}")
        if hello & FS_OPT_ENABLED != FS_OPT_ENABLED:
            return
        if hello & FS_OPT_SHDMEM_FUZZ:  # never offered without __AFL_SHM_FUZZ_ID
            raise AflTargetError(f"the AFL target {program} offers shared-memory test cases "
                                 "the probe did not ask for")
        if hello & FS_OPT_AUTODICT:
            died = AflTargetError(f"the AFL target {program} died sending its dictionary")
            try:
                write_word(self._control, FS_OPT_ENABLED | FS_OPT_AUTODICT)
                length = read_word(self._status, HELLO_WITHIN)
            except PipeClosed:
                raise died from None
            while length:
                chunk = os.read(self._status, min(length, 1 << 16))
                if not chunk:
                    raise died
                length -= len(chunk)

    def _dumped_map_size(self, argv: list[str], env: dict, work: Path) -> int:
        try:
            ended, shown = limited.run(argv, {**env, "AFL_DUMP_MAP_SIZE": "1"}, stdin=None,
                                       timeout=HELLO_WITHIN, cwd=self._cwd or work,
                                       capture="stdout")
        except OSError as error:
            raise AflTargetError(f"cannot run the AFL target {argv[0]}: {error}") from None
        if ended.timed_out:
            raise AflTargetError(f"cannot run the AFL target {argv[0]}: it did not print its "
                                 f"map size within {HELLO_WITHIN:g} s (AFL_DUMP_MAP_SIZE=1)")
        lines = shown.split()
        size = int(lines[-1]) if lines and lines[-1].isdigit() else 0
        return size if 0 < size <= 1 << 28 else MAP_SIZE

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            limited.kill_group(process.pid)  # its children too, hung or not
            process.wait()
        for name in ("_control", "_status"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)
        if self._map is not None:
            self._map.close()
            self._map = None
        self._killed_last = False

    def close(self) -> None:
        """Stop the forkserver and remove what the probe made; safe to call twice."""
        self._stop()
        if self._input_fd is not None:
            os.close(self._input_fd)
            self._input_fd = None
        if self._work is not None:
            self._work.cleanup()
            self._work = None

    def __enter__(self) -> ForkserverProbe:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
