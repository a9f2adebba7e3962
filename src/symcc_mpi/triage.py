"""Coverage oracle: batch afl-showmap probes on workers, AFL-style bitmap merging on the master."""

from __future__ import annotations

import array
import contextlib
import enum
import math
import mmap
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import BinaryIO

import msgspec

__all__ = [
    "AflTargetError",
    "BUCKET_BITS",
    "CoverageMap",
    "CoverageProbe",
    "CoverageStats",
    "FileCoverage",
    "MAX_MAP_SIZE",
    "Novelty",
    "ProbeStats",
    "Status",
    "TriageError",
    "bucket_bit",
    "check_afl_target",
    "parse_showmap_text",
]


class TriageError(RuntimeError):
    """A coverage probe could not be carried out; the message is one line."""


class AflTargetError(TriageError):
    """The AFL build of the target cannot be used (missing, not instrumented...)."""


class Status(str, enum.Enum):
    """How one run of the AFL build ended (values as in protocol.StagedFile.status)."""

    OK = "ok"
    CRASH = "crash"
    HANG = "hang"


class Novelty(enum.IntEnum):
    """What a merged summary added: AFL's has_new_bits() return values 0, 1, 2."""

    NONE = 0
    NEW_COUNT = 1
    NEW_EDGE = 2


# AFL's hit-count classes as bits (count_class_binary): 1, 2, 3, 4-7, 8-15, 16-31, 32-127, 128+.
BUCKET_BITS = (1, 2, 4, 8, 16, 32, 64, 128)
# AFL++ caps map sizes at 2^28 (MAP_SIZE_POW2 <= 28); anything larger is a corrupt summary.
MAX_MAP_SIZE = 1 << 28
DEFAULT_MAP_SIZE = 1 << 16
# afl-showmap refuses -t below 20 ms ("Dangerously low value of -t").
_MIN_TIMEOUT_MS = 20

if array.array("I").itemsize != 4:  # pragma: no cover - no supported platform hits this
    raise ImportError("symcc_mpi.triage needs a 4-byte array('I')")
_LITTLE = sys.byteorder == "little"


def bucket_bit(hits: int) -> int:
    """AFL's hit-count class bit for a raw hit count (0 for no hit)."""
    if hits <= 0:
        return 0
    if hits <= 3:
        return BUCKET_BITS[hits - 1]
    for bit, upper in ((8, 7), (16, 15), (32, 31), (64, 127)):
        if hits <= upper:
            return bit
    return 128


def _pack_u32(values: Iterable[int]) -> bytes:
    arr = array.array("I", values)
    if not _LITTLE:  # pragma: no cover - big-endian hosts
        arr.byteswap()
    return arr.tobytes()


def _u32_view(data: bytes) -> Sequence[int]:
    """The wire's little-endian u32 array as a sequence of ints, zero-copy where possible."""
    if _LITTLE:
        return memoryview(data).cast("I")
    arr = array.array("I")  # pragma: no cover - big-endian hosts
    arr.frombytes(data)  # pragma: no cover
    arr.byteswap()  # pragma: no cover
    return arr  # pragma: no cover


class FileCoverage(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Edge summary of one input: what a worker sends to its master (msgspec-serialisable).

    `edges` holds the AFL map indices hit, as little-endian u32 in ascending order;
    `buckets[k]` is the hit-count class bit (one of BUCKET_BITS) of `edges[k]`.
    """

    status: Status
    edges: bytes = b""
    buckets: bytes = b""
    map_size: int = 0

    @classmethod
    def from_pairs(
        cls, pairs: Iterable[tuple[int, int]], status: Status = Status.OK, map_size: int = 0
    ) -> FileCoverage:
        """Build a summary from (map index, bucket bit) pairs."""
        ordered = sorted(dict(pairs).items())
        return cls(
            status=status,
            edges=_pack_u32(i for i, _ in ordered),
            buckets=bytes(b for _, b in ordered),
            map_size=map_size,
        )

    @classmethod
    def unpack(cls, data: bytes) -> FileCoverage:
        """Decode and validate what pack() produced (raises ValueError if malformed)."""
        try:
            cov = _DECODER.decode(data)
        except msgspec.DecodeError as exc:
            raise ValueError(f"coverage summary: {exc}") from None
        cov.validate()
        return cov

    def pack(self) -> bytes:
        """The summary as compact msgpack bytes, for a protocol message."""
        return _ENCODER.encode(self)

    @property
    def edge_count(self) -> int:
        return len(self.buckets)

    @property
    def top_index(self) -> int:
        """The highest map index hit, -1 if none."""
        return max(_u32_view(self.edges)) if self.edges else -1

    def pairs(self) -> list[tuple[int, int]]:
        """The (map index, bucket bit) pairs, in ascending index order."""
        return list(zip(_u32_view(self.edges), self.buckets, strict=True))

    def validate(self) -> None:
        """Raise ValueError unless the summary is well formed (it comes from another process)."""
        if len(self.edges) != 4 * len(self.buckets):
            raise ValueError(
                f"coverage summary: {len(self.edges)} index bytes for {len(self.buckets)} buckets"
            )
        if self.buckets.translate(None, _VALID_BUCKETS):
            raise ValueError("coverage summary: a bucket is not a single AFL hit-count class bit")
        if not 0 <= self.map_size <= MAX_MAP_SIZE:
            raise ValueError(f"coverage summary: map size {self.map_size} out of range")
        if self.top_index >= MAX_MAP_SIZE:
            raise ValueError("coverage summary: a map index out of range")


_VALID_BUCKETS = bytes(BUCKET_BITS)
_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(FileCoverage)


# --------------------------------------------------------------------------- parsing


_DIGIT_VALUE = bytes.maketrans(b"0123456789", bytes(range(10)))
_CLASS_TO_BIT = bytes.maketrans(b"12345678", bytes(BUCKET_BITS))
_LINE = 9  # afl-showmap writes "%06u:%u\n": 6 digits, ':', one class digit, '\n'


# Per-line masks: bytes 0, 2, 4 (digit pairs) and bytes 0-1 (a 16-bit value).
_PAIRS_LANE = b"\xff\x00\xff\x00\xff\x00\x00\x00\x00"
_LOW16_LANE = b"\xff\xff\x00\x00\x00\x00\x00\x00\x00"


class _SwarMasks:
    """Periodic bit masks for the fixed-width decoder, grown by doubling and cut by shifting."""

    lines = 0
    pairs = 0
    low16 = 0

    @classmethod
    def get(cls, n: int) -> tuple[int, int]:
        if n > cls.lines:
            cls.lines = max(n, 2 * cls.lines, 64)
            cls.pairs = int.from_bytes(_PAIRS_LANE * cls.lines, "little")
            cls.low16 = int.from_bytes(_LOW16_LANE * cls.lines, "little")
        # The pattern repeats every line, so dropping whole lines off the top keeps it aligned.
        shift = 8 * _LINE * (cls.lines - n)
        return cls.pairs >> shift, cls.low16 >> shift


def _parse_fixed_width(text: bytes) -> tuple[bytes, bytes] | None:
    """Decode maps whose indices all fit in 6 digits, with big-int lane arithmetic.

    Python has no vector ops, so per-line int() calls dominate a naive parser (~0.2 µs
    per edge). Here every line is one 72-bit lane of a single big integer: digit pairs,
    then the six digits, are combined with a handful of whole-buffer multiplies, shifts
    and masks, which run at C speed. Returns None when the text is not in that shape.
    """
    n, rem = divmod(len(text), _LINE)
    if rem or not n:
        return None
    if text[6::_LINE] != b":" * n or text[8::_LINE] != b"\n" * n:
        return None
    if text.translate(None, b"0123456789:\n") or text[7::_LINE].translate(None, b"12345678"):
        return None
    pairs_mask, low16 = _SwarMasks.get(n)
    # Byte k of a line holds digit k (most significant first), so lane values read backwards.
    d = int.from_bytes(text.translate(_DIGIT_VALUE), "little")
    p = (d * 10 + (d >> 8)) & pairs_mask  # bytes 0, 2, 4: two-digit values
    v = (p & low16) * 10000 + ((p >> 16) & low16) * 100 + ((p >> 32) & low16)
    lanes = v.to_bytes(_LINE * n, "little")
    edges = bytearray(4 * n)  # values < 10^6 fit in the low three bytes of each u32
    edges[0::4] = lanes[0::_LINE]
    edges[1::4] = lanes[1::_LINE]
    edges[2::4] = lanes[2::_LINE]
    return bytes(edges), text[7::_LINE].translate(_CLASS_TO_BIT)


def parse_showmap_text(text: bytes) -> tuple[bytes, bytes]:
    """Parse afl-showmap's default output ("%06u:%u" lines, human classes 1..8).

    Returns (edges, buckets) in FileCoverage's wire layout.
    """
    fast = _parse_fixed_width(text)
    if fast is not None:
        return fast
    indices: list[int] = []
    buckets = bytearray()
    for line in text.split(b"\n"):
        if not line:
            continue
        index, sep, cls = line.partition(b":")
        if not sep or not index.isdigit() or cls not in _HUMAN_CLASSES:
            raise TriageError(f"unexpected afl-showmap output line: {line[:60]!r}")
        indices.append(int(index))
        buckets.append(_HUMAN_CLASSES[cls])
    return _pack_u32(indices), bytes(buckets)


_HUMAN_CLASSES = {str(k + 1).encode(): bit for k, bit in enumerate(BUCKET_BITS)}


# --------------------------------------------------------------------------- target checks


def _resolve_program(program: str) -> Path | None:
    if os.sep in program:
        return Path(program)
    found = shutil.which(program)
    return Path(found) if found else None


def _find_showmap(showmap: str) -> Path:
    path = _resolve_program(showmap)
    if path is None or not os.access(path, os.X_OK):
        raise TriageError(f"{showmap} not found: install AFL++ (Debian package afl++)")
    return path


def check_afl_target(argv: Sequence[str], *, showmap: str = "afl-showmap") -> Path:
    """Check that `argv` names a usable AFL-instrumented program; return its resolved path.

    Raises AflTargetError with a one-line message otherwise.
    """
    if not argv:
        raise AflTargetError("empty AFL target command line")
    _find_showmap(showmap)
    path = _resolve_program(argv[0])
    if path is None or not path.exists():
        raise AflTargetError(f"AFL target not found: {argv[0]}")
    if not path.is_file() or not os.access(path, os.X_OK):
        raise AflTargetError(f"AFL target is not an executable file: {path}")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 4 or f.read(4) != b"\x7fELF":
            raise AflTargetError(f"AFL target is not an ELF executable: {path}")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as image:
            # afl-fuzz's own test: the runtime reads its shared map id from this variable.
            instrumented = image.find(b"__AFL_SHM_ID\x00") >= 0
    if not instrumented:
        raise AflTargetError(
            f"AFL target is not AFL-instrumented (no __AFL_SHM_ID): {path}; "
            "build it with afl-clang-fast"
        )
    return path


# --------------------------------------------------------------------------- worker side


# Variables that would change what afl-showmap prints or how it runs the target: the
# debug ones let the target's own output into the stream we parse, AFL_DEBUG_GDB stops
# the process, the cmin ones drop maps of crashing inputs.
_DROPPED_ENV = frozenset(
    {
        "AFL_QUIET",
        "AFL_DEBUG",
        "AFL_DEBUG_CHILD",
        "AFL_DEBUG_CHILD_OUTPUT",
        "AFL_DEBUG_GDB",
        "AFL_CMIN_CRASHES_ONLY",
        "AFL_CMIN_ALLOW_ANY",
        "AFL_NO_FORKSRV",
        "AFL_PRINT_FILENAMES",
        "__AFL_SHM_ID",
        "__AFL_SHM_FUZZ_ID",
    }
)
# What afl-showmap puts in the child's environment (unless already set), so that a native
# run classifies sanitizer reports the same way.
_SANITIZER_ENV = {
    "ASAN_OPTIONS": "abort_on_error=1:detect_leaks=0:allocator_may_return_null=1:symbolize=0:"
    "detect_odr_violation=0:handle_segv=0:handle_sigbus=0:handle_abort=0:handle_sigfpe=0:"
    "handle_sigill=0",
    "UBSAN_OPTIONS": "halt_on_error=1:abort_on_error=1:malloc_context_size=0:"
    "allocator_may_return_null=1:symbolize=0:handle_segv=0:handle_sigbus=0:handle_abort=0:"
    "handle_sigfpe=0:handle_sigill=0",
}

_ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]")
_ABORT = re.compile(r"(?:PROGRAM ABORT|SYSTEM ERROR) :\s*(.*)")
_MAP_SIZE = re.compile(r"Target map size: (\d+)")
_PROCESSED = re.compile(r"Processed (\d+) input files")


class ProbeStats(msgspec.Struct):
    """Counters of one CoverageProbe (for the worker's stats)."""

    files: int = 0
    batches: int = 0
    single_runs: int = 0
    crashes: int = 0
    hangs: int = 0
    seconds: float = 0.0


@dataclass
class _BatchOutcome:
    statuses: dict[str, Status]
    completed: bool
    error: str


def _parse_batch_stdout(raw: bytes) -> tuple[_BatchOutcome, int | None]:
    """Read afl-showmap's per-file status stream (AFL_PRINT_FILENAMES and no -q).

    In batch mode the target's stdout/stderr go to /dev/null, so every line here comes
    from afl-showmap itself: "Processing DIR/NAME" before each run, then
    "+++ Program killed by signal N +++" or "+++ Program timed off +++" if it ended so.
    """
    text = _ANSI.sub(b"", raw).decode("utf-8", "replace")
    statuses: dict[str, Status] = {}
    current: str | None = None
    map_size: int | None = None
    completed = False
    error = ""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("Processing "):
            current = line[len("Processing ") :].rsplit("/", 1)[-1]
            statuses[current] = Status.OK
        elif line.startswith("+++ Program timed off"):
            if current is not None:
                statuses[current] = Status.HANG
        elif line.startswith("+++ Program killed by signal"):
            if current is not None:
                statuses[current] = Status.CRASH
        elif m := _MAP_SIZE.search(line):
            map_size = int(m.group(1))
        elif _PROCESSED.search(line):
            completed = True
        elif (m := _ABORT.search(line)) and not error:
            error = m.group(1).strip()
    return _BatchOutcome(statuses=statuses, completed=completed, error=error), map_size


class CoverageProbe:
    """Runs afl-showmap over batches of files and returns one FileCoverage per file.

    One afl-showmap process per batch (`-i DIR -o DIR`, forkserver): its cost is one
    fork per input plus a fixed start-up. Per-file crash/hang status comes from the
    status lines afl-showmap prints in batch mode when AFL_PRINT_FILENAMES is set.
    Zero-size inputs (which batch mode skips) and an input that kills afl-showmap itself
    are probed alone; their status then comes from a native run of the AFL build,
    because single-file afl-showmap reports a timeout as "killed by signal 9".

    Every file a probe writes lives in a temporary directory under `scratch_dir` (node-local,
    --scratch): afl-showmap's batch mode writes each input it runs to `.afl-showmap-temp-PID`
    in its working directory (AFL++ 4.04c has no option to move it: `-A` is refused), so
    unless `cwd` is given the AFL build runs there, with TMPDIR there too, and arguments that
    name a path relative to our own directory are made absolute first (`_pinned`). Otherwise
    it would write into the directory the campaign was started from, on a cluster a shared
    one, once per probed input.
    """

    def __init__(
        self,
        afl_target_argv: Sequence[str],
        *,
        timeout: float,
        memory_limit_mb: int | None = None,
        showmap: str = "afl-showmap",
        scratch_dir: Path | str | None = None,
        cwd: Path | str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if not afl_target_argv:
            raise ValueError("empty AFL target command line")
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self._argv = list(afl_target_argv) if cwd is not None else _pinned(afl_target_argv)
        self._uses_file = any("@@" in a for a in self._argv)
        self._timeout_ms = max(_MIN_TIMEOUT_MS, math.ceil(timeout * 1000))
        self._memory_limit_mb = memory_limit_mb
        self._showmap = str(_find_showmap(showmap))
        self._scratch_dir = Path(scratch_dir) if scratch_dir is not None else _default_scratch()
        self._cwd = Path(cwd) if cwd is not None else None
        base = dict(os.environ if env is None else env)
        self._env = {k: v for k, v in base.items() if k not in _DROPPED_ENV}
        self._env["AFL_PRINT_FILENAMES"] = "1"
        self._native_env = {k: v for k, v in base.items() if not k.startswith("__AFL_")}
        for key, value in _SANITIZER_ENV.items():
            self._native_env.setdefault(key, value)
        self.map_size: int | None = None
        self.stats = ProbeStats()

    @property
    def timeout_ms(self) -> int:
        return self._timeout_ms

    def probe(self, files: Sequence[Path | str]) -> list[FileCoverage]:
        """Coverage and status of each file, in the order given."""
        started = time.monotonic()
        paths = [Path(os.path.abspath(f)) for f in files]  # the AFL build runs in `work`
        results: list[FileCoverage | None] = [None] * len(paths)
        with tempfile.TemporaryDirectory(prefix="symcc-mpi-showmap-", dir=self._scratch_dir) as tmp:
            work = Path(os.path.abspath(tmp))
            in_dir, out_dir = work / "in", work / "out"
            in_dir.mkdir()
            pending: dict[str, int] = {}
            empty: list[int] = []
            for i, path in enumerate(paths):
                if path.stat().st_size == 0:
                    empty.append(i)  # batch mode skips zero-size files
                    continue
                name = f"f{i:07d}"
                _link_or_copy(path, in_dir / name)
                pending[name] = i
            while pending:
                self._run_batch(in_dir, out_dir, paths, pending, results, work)
            for i in empty:
                results[i] = self._probe_single(paths[i], work)
        self.stats.files += len(paths)
        self.stats.seconds += time.monotonic() - started
        for cov in results:
            assert cov is not None
            if cov.status == Status.CRASH:
                self.stats.crashes += 1
            elif cov.status == Status.HANG:
                self.stats.hangs += 1
        return results  # type: ignore[return-value]

    # -- batch mode

    def _limits(self) -> list[str]:
        mem = "none" if self._memory_limit_mb is None else str(self._memory_limit_mb)
        return ["-t", str(self._timeout_ms), "-m", mem]

    def _run_batch(
        self,
        in_dir: Path,
        out_dir: Path,
        paths: list[Path],
        pending: dict[str, int],
        results: list[FileCoverage | None],
        work: Path,
    ) -> None:
        """One afl-showmap run over what is left in `in_dir`; settles at least one file."""
        if out_dir.exists():
            shutil.rmtree(out_dir)
        cmd = [self._showmap, "-i", _showmap_path(in_dir), "-o", _showmap_path(out_dir)]
        cmd += [*self._limits(), "--"]
        cmd += self._argv
        # A generous ceiling: every file may run into the timeout, plus start-up.
        budget = 30.0 + len(pending) * (self._timeout_ms / 1000.0 + 0.5)
        _, raw = self._run_showmap(cmd, budget, subprocess.DEVNULL, work)
        self.stats.batches += 1
        outcome, map_size = _parse_batch_stdout(raw)
        if map_size is not None:
            self.map_size = map_size
        elif self.map_size is None:
            self.map_size = int(self._env.get("AFL_MAP_SIZE", DEFAULT_MAP_SIZE))
        if outcome.completed and not outcome.statuses and pending:
            raise TriageError(
                "afl-showmap printed no per-file status: it needs AFL_PRINT_FILENAMES "
                "(AFL++ >= 3.13c)"
            )
        settled: list[str] = []
        in_flight: str | None = None
        for name, status in outcome.statuses.items():
            if name not in pending:
                continue
            map_file = out_dir / name
            if not map_file.exists():
                if outcome.completed:
                    raise TriageError(f"afl-showmap wrote no map for input {name}")
                in_flight = name  # afl-showmap died while running this one
                continue
            edges, buckets = parse_showmap_text(map_file.read_bytes())
            results[pending.pop(name)] = FileCoverage(status, edges, buckets, self.map_size)
            settled.append(name)
        if outcome.completed:
            if pending:
                raise TriageError(f"afl-showmap skipped {len(pending)} input(s)")
            return
        if in_flight is not None:
            index = pending.pop(in_flight)
            results[index] = self._probe_single(paths[index], work)
            settled.append(in_flight)
        if not settled:
            raise TriageError(f"afl-showmap failed: {outcome.error or 'no output'}")
        for name in settled:  # the next run takes only what is left
            (in_dir / name).unlink()

    def _run_showmap(
        self, cmd: list[str], budget: float, stdin: int | BinaryIO, work: Path
    ) -> tuple[int, bytes]:
        proc = subprocess.Popen(
            cmd,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**self._env, "TMPDIR": str(work)},
            cwd=self._cwd or work,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=budget)
        except subprocess.TimeoutExpired:
            _stop(proc)
            raise TriageError(f"afl-showmap did not finish within {budget:.0f} s") from None
        return proc.returncode, out

    # -- single inputs

    def _probe_single(self, path: Path, work: Path) -> FileCoverage:
        """Probe one input alone: map from single-mode afl-showmap, status from a native run."""
        self.stats.single_runs += 1
        argv = [a.replace("@@", str(path)) for a in self._argv]
        map_file = work / "single.map"
        map_file.unlink(missing_ok=True)
        cmd = [self._showmap, "-q", "-o", _showmap_path(map_file), *self._limits(), "--", *argv]
        with _stdin_for(path, self._uses_file) as stdin:
            rc, raw = self._run_showmap(cmd, 30.0 + self._timeout_ms / 1000.0, stdin, work)
        if rc not in (0, 1, 2) or not map_file.exists():
            outcome, _ = _parse_batch_stdout(raw)
            raise TriageError(f"afl-showmap failed on {path.name}: {outcome.error or 'no map'}")
        edges, buckets = parse_showmap_text(map_file.read_bytes())
        status = self._native_status(argv, path, work)
        return FileCoverage(status, edges, buckets, self.map_size or 0)

    def _native_status(self, argv: list[str], path: Path, work: Path) -> Status:
        limit = self._memory_limit_mb

        def limits() -> None:  # runs in the child, before exec
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if limit is not None:
                resource.setrlimit(resource.RLIMIT_AS, (limit << 20, limit << 20))

        with _stdin_for(path, self._uses_file) as stdin:
            proc = subprocess.Popen(
                argv,
                stdin=stdin,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={**self._native_env, "TMPDIR": str(work)},
                cwd=self._cwd or work,  # where afl-showmap runs it (class docstring)
                start_new_session=True,
                preexec_fn=limits,
            )
            try:
                rc = proc.wait(timeout=self._timeout_ms / 1000.0)
            except subprocess.TimeoutExpired:
                _stop(proc, grace=0.0)
                return Status.HANG
        return Status.CRASH if rc < 0 else Status.OK


@contextlib.contextmanager
def _stdin_for(path: Path, uses_file: bool) -> Iterator[int | BinaryIO]:
    """The input on stdin for stdin targets, /dev/null for @@ targets."""
    if uses_file:
        yield subprocess.DEVNULL
        return
    with open(path, "rb") as handle:
        yield handle


def _default_scratch() -> Path | None:
    # Every probed input costs afl-showmap a few file creations; on the ext4 disk of the
    # project's VMs that is 1.1-1.9 ms per input, on tmpfs 0.3-0.5 ms.
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else None


def _pinned(argv: Sequence[str]) -> list[str]:
    """`argv` for a run in another directory: each argument that names an existing path
    relative to this process's directory made absolute, so that it names the same one."""
    return [os.path.abspath(arg) if "@@" not in arg and not os.path.isabs(arg)
            and os.path.exists(arg) else arg for arg in argv]


def _showmap_path(path: Path) -> str:
    # afl-showmap opens any output path starting with "/dev/" as a device (no O_CREAT),
    # which breaks maps written under /dev/shm; "//dev/..." names the same file.
    text = str(path)
    return "/" + text if text.startswith("/dev/") else text


def _link_or_copy(src: Path, dst: Path) -> None:
    # A hard link costs no data copy; batch mode skips symlinks (it wants DT_REG entries).
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _stop(proc: subprocess.Popen, grace: float = 2.0) -> None:
    """End a child started in its own session. SIGTERM first lets afl-showmap reap its
    forkserver (which lives in a session of its own); SIGKILL then takes the group."""
    if grace > 0:
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is None:
        _signal_group(proc, signal.SIGKILL)
    try:
        proc.communicate(timeout=5.0)
    except (subprocess.TimeoutExpired, ValueError):
        pass


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


# --------------------------------------------------------------------------- master side


class CoverageStats(msgspec.Struct, frozen=True):
    """A CoverageMap's figures, for fuzzer_stats and the JSON stats."""

    map_size: int
    edges_covered: int
    bitmap_cvg: float
    merged: int
    interesting: int
    new_edge_finds: int
    duplicate_summaries: int
    crash_runs: int
    unique_crashes: int
    hang_runs: int
    unique_hangs: int


class _FaultMap:
    """AFL's virgin_crash / virgin_tmout logic on simplified (hit / not hit) traces.

    AFL keeps a crash when its simplified trace sets a new bit: it hits an edge that no
    earlier crash hit, or it misses an edge that every earlier crash hit.
    """

    __slots__ = ("hit", "always", "runs", "unique")

    def __init__(self, size: int) -> None:
        self.hit = bytearray(size)
        self.always: set[int] | None = None
        self.runs = 0
        self.unique = 0

    def merge(self, idx: Sequence[int]) -> Novelty:
        self.runs += 1
        _ensure_size(self.hit, idx)
        got = _gather(self.hit, idx)
        novelty = Novelty.NONE
        if b"\x00" in got:
            novelty = Novelty.NEW_EDGE
            for i in idx:
                self.hit[i] = 1
        if self.always is None:
            self.always = set(idx)
            novelty = Novelty.NEW_EDGE  # AFL: the first crash always sets new bits
        elif not self.always.issubset(idx):
            self.always.intersection_update(idx)
            novelty = novelty or Novelty.NEW_COUNT
        if novelty:
            self.unique += 1
        return novelty


_NONZERO = re.compile(rb"[^\x00]")


def _gather(table: bytearray, idx: Sequence[int]) -> bytes:
    n = len(idx)
    if n > 1:
        return bytes(itemgetter(*idx)(table))
    return bytes([table[idx[0]]]) if n else b""


def _ensure_size(table: bytearray, idx: Sequence[int]) -> None:
    if not idx:
        return
    top = max(idx)
    if top >= len(table):
        if top >= MAX_MAP_SIZE:
            raise ValueError(f"coverage summary: map index {top} out of range")
        table.extend(bytes(top + 1 - len(table)))


class CoverageMap:
    """The master's global coverage: AFL's virgin bits, as symcc_fuzzing_helper merges them.

    A normal run is interesting when it hits an edge never hit before or puts an edge
    in a hit-count class not seen before for it. Crashes and hangs are kept apart (as
    AFL does) and only decide whether the crash or hang is unique.
    """

    def __init__(self, map_size: int = 0, *, dedup_capacity: int = 1 << 16) -> None:
        if not 0 <= map_size <= MAX_MAP_SIZE:
            raise ValueError(f"map size {map_size} out of range")
        self._seen = bytearray(map_size)
        self._crashes = _FaultMap(map_size)
        self._hangs = _FaultMap(map_size)
        self._declared_size = map_size
        self._edges_covered = 0
        self._merged = 0
        self._interesting = 0
        self._new_edge_finds = 0
        self._duplicates = 0
        # Digests of summaries already merged: concolic children of one seed often follow
        # exactly the same path, and a digest lookup is several times cheaper than the check.
        self._digests: set[tuple[int, int]] = set()
        self._dedup_capacity = dedup_capacity

    # -- merging

    def merge(self, cov: FileCoverage) -> bool:
        """Merge one summary; True if it is interesting (new coverage, unique crash/hang)."""
        return self.merge_novelty(cov) is not Novelty.NONE

    def merge_packed(self, data: bytes) -> bool:
        """merge() of a FileCoverage.pack() result (raises ValueError if malformed)."""
        return self.merge_novelty(FileCoverage.unpack(data)) is not Novelty.NONE

    def adds_coverage(self, cov: FileCoverage) -> bool:
        """Whether merging `cov`, a normal run's summary, would add anything; changes nothing.

        The map only gains bits, so a summary that adds nothing now never will.
        """
        idx = _u32_view(cov.edges)
        if not idx or (hash(cov.edges), hash(cov.buckets)) in self._digests:
            return False
        if max(idx) >= len(self._seen):
            return True  # an edge beyond everything seen so far
        got = _gather(self._seen, idx)
        return bool(int.from_bytes(cov.buckets, "little") & ~int.from_bytes(got, "little"))

    def merge_novelty(self, cov: FileCoverage) -> Novelty:
        """Merge one summary and say what it added (Novelty.NONE if nothing)."""
        cov.validate()
        self._merged += 1
        if cov.map_size > self._declared_size:
            self._declared_size = cov.map_size
        idx = _u32_view(cov.edges)
        if cov.status == Status.CRASH:
            return self._crashes.merge(idx)
        if cov.status == Status.HANG:
            return self._hangs.merge(idx)
        if not idx:
            return Novelty.NONE
        # Python's SipHash of each field: 64 bits at least tell two summaries apart, ~4x
        # cheaper than blake2b; a collision could only drop one input as a duplicate.
        key = (hash(cov.edges), hash(cov.buckets))
        if key in self._digests:
            self._duplicates += 1
            return Novelty.NONE
        seen = self._seen
        try:
            got = _gather(seen, idx)
        except IndexError:
            _ensure_size(seen, idx)
            got = _gather(seen, idx)
        novelty = Novelty.NONE
        # Byte lanes line up, so one big-int AND tests every edge's new bits at once.
        fresh = int.from_bytes(cov.buckets, "little") & ~int.from_bytes(got, "little")
        if fresh:
            novelty = Novelty.NEW_COUNT
            lanes = fresh.to_bytes(len(got), "little")
            for m in _NONZERO.finditer(lanes):  # visits only the edges with new bits
                k = m.start()
                i = idx[k]
                old = seen[i]
                if not old:
                    novelty = Novelty.NEW_EDGE
                    self._edges_covered += 1
                seen[i] = old | lanes[k]
            self._interesting += 1
            if novelty is Novelty.NEW_EDGE:
                self._new_edge_finds += 1
        if len(self._digests) >= self._dedup_capacity:
            self._digests.clear()
        self._digests.add(key)
        return novelty

    # -- figures

    @property
    def map_size(self) -> int:
        return max(self._declared_size, len(self._seen))

    @property
    def edges_covered(self) -> int:
        return self._edges_covered

    @property
    def bitmap_cvg(self) -> float:
        """Percent of the map covered, as AFL's fuzzer_stats `bitmap_cvg`."""
        size = self.map_size
        return 100.0 * self._edges_covered / size if size else 0.0

    def statistics(self) -> CoverageStats:
        return CoverageStats(
            map_size=self.map_size,
            edges_covered=self._edges_covered,
            bitmap_cvg=self.bitmap_cvg,
            merged=self._merged,
            interesting=self._interesting,
            new_edge_finds=self._new_edge_finds,
            duplicate_summaries=self._duplicates,
            crash_runs=self._crashes.runs,
            unique_crashes=self._crashes.unique,
            hang_runs=self._hangs.runs,
            unique_hangs=self._hangs.unique,
        )

    # -- persistence (for resume)

    def to_bytes(self) -> bytes:
        """Serialise the map (not the duplicate cache) so a resumed master keeps its coverage."""
        return msgspec.msgpack.encode(
            _MapState(
                version=1,
                declared_size=self._declared_size,
                seen=bytes(self._seen),
                faults=[_fault_state(self._crashes), _fault_state(self._hangs)],
                counters=[
                    self._merged,
                    self._interesting,
                    self._new_edge_finds,
                    self._duplicates,
                ],
            )
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> CoverageMap:
        state = msgspec.msgpack.decode(data, type=_MapState)
        if state.version != 1 or len(state.faults) != 2 or len(state.counters) != 4:
            raise ValueError("unsupported coverage map state")
        cmap = cls(0)
        cmap._seen = bytearray(state.seen)
        if len(cmap._seen) > MAX_MAP_SIZE:
            raise ValueError("coverage map state: map too large")
        cmap._declared_size = state.declared_size
        cmap._edges_covered = len(cmap._seen) - cmap._seen.count(0)
        cmap._crashes = _fault_from_state(state.faults[0])
        cmap._hangs = _fault_from_state(state.faults[1])
        cmap._merged, cmap._interesting, cmap._new_edge_finds, cmap._duplicates = state.counters
        return cmap


class _FaultState(msgspec.Struct, array_like=True):
    hit: bytes
    always: bytes | None
    runs: int
    unique: int


class _MapState(msgspec.Struct, array_like=True):
    version: int
    declared_size: int
    seen: bytes
    faults: list[_FaultState]
    counters: list[int]


def _fault_state(fault: _FaultMap) -> _FaultState:
    always = None if fault.always is None else _pack_u32(sorted(fault.always))
    return _FaultState(bytes(fault.hit), always, fault.runs, fault.unique)


def _fault_from_state(state: _FaultState) -> _FaultMap:
    fault = _FaultMap(0)
    fault.hit = bytearray(state.hit)
    fault.always = None if state.always is None else set(_u32_view(state.always))
    fault.runs, fault.unique = state.runs, state.unique
    return fault
