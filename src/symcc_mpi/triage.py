"""Coverage triage: the edge summaries workers send (probed by forkserver.py), the AFL build
checked, and the master's AFL-style virgin-bits merge."""

from __future__ import annotations

import array
import enum
import mmap
import os
import re
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from operator import itemgetter
from pathlib import Path

import msgspec

__all__ = [
    "AflTargetError",
    "BUCKET_BITS",
    "CoverageMap",
    "CoverageStats",
    "FileCoverage",
    "MAX_MAP_SIZE",
    "Novelty",
    "Status",
    "TriageError",
    "bucket_bit",
    "check_afl_target",
    "path_key",
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


# --------------------------------------------------------------------------- target checks


def _resolve_program(program: str) -> Path | None:
    if os.sep in program:
        return Path(program)
    found = shutil.which(program)
    return Path(found) if found else None


def check_afl_target(argv: Sequence[str]) -> Path:
    """Check that `argv` names a usable AFL-instrumented program; return its resolved path.

    Raises AflTargetError with a one-line message otherwise.
    """
    if not argv:
        raise AflTargetError("empty AFL target command line")
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


def path_key(cov: FileCoverage) -> tuple[int, int]:
    """A summary's path, edges and hit-count classes, as Python's SipHash of each field: 64
    bits at least tell two summaries apart, ~4x cheaper than blake2b; a collision could only
    drop one input as a duplicate."""
    return hash(cov.edges), hash(cov.buckets)


def _gather_counts(table: array.array, idx: Sequence[int]) -> Sequence[int]:
    return itemgetter(*idx)(table) if len(idx) > 1 else (table[idx[0]],)


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
        # Per map index, how many interesting normal runs hit it: what makes a set-aside
        # input's rarest edge rare (tiers/pool.py).
        self._hits = array.array("I", bytes(4 * map_size))

    # -- merging

    def merge(self, cov: FileCoverage) -> bool:
        """Merge one summary; True if it is interesting (new coverage, unique crash/hang)."""
        return self.merge_novelty(cov) is not Novelty.NONE

    def merge_packed(self, data: bytes) -> bool:
        """merge() of a FileCoverage.pack() result (raises ValueError if malformed)."""
        return self.merge_novelty(FileCoverage.unpack(data)) is not Novelty.NONE

    def adds_coverage(self, cov: FileCoverage, beyond: Mapping[int, int] | None = None) -> bool:
        """Whether merging `cov`, a normal run's summary, would add anything; changes nothing.
        `beyond`: bits (per map index) to count as merged already.

        The map only gains bits, so a summary that adds nothing now never will.
        """
        idx = _u32_view(cov.edges)
        if not idx or path_key(cov) in self._digests:
            return False
        if max(idx) >= len(self._seen):
            if not beyond:
                return True  # an edge beyond everything seen so far
            seen = bytes(self._seen) + bytes(max(idx) + 1 - len(self._seen))
            got = _gather(seen, idx)
        else:
            got = _gather(self._seen, idx)
        if beyond:
            got = bytes(bits | beyond.get(i, 0) for i, bits in zip(idx, got, strict=True))
        return bool(int.from_bytes(cov.buckets, "little") & ~int.from_bytes(got, "little"))

    def knows_path(self, cov: FileCoverage) -> bool:
        """Whether a summary of exactly this path (edges and classes) was merged lately."""
        return path_key(cov) in self._digests

    def rarity(self, cov: FileCoverage) -> int:
        """How many interesting runs hit the rarest edge of `cov` (0: an edge none hit)."""
        idx = _u32_view(cov.edges)
        hits = self._hits
        if not idx or max(idx) >= len(hits):
            return 0
        return min(_gather_counts(hits, idx))

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
        key = path_key(cov)
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
            hits = self._hits
            if len(hits) < len(seen):
                hits.frombytes(bytes(4 * (len(seen) - len(hits))))
            for i in idx:
                hits[i] += 1
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
                hits=self._hits.tobytes(),
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
        if len(state.hits) % 4 or len(state.hits) > 4 * len(cmap._seen):
            raise ValueError("coverage map state: hit counts of another map")
        cmap._hits = array.array("I", state.hits)
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
    hits: bytes = b""  # CoverageMap._hits; absent from the maps of earlier versions


def _fault_state(fault: _FaultMap) -> _FaultState:
    always = None if fault.always is None else _pack_u32(sorted(fault.always))
    return _FaultState(bytes(fault.hit), always, fault.runs, fault.unique)


def _fault_from_state(state: _FaultState) -> _FaultMap:
    fault = _FaultMap(0)
    fault.hit = bytearray(state.hit)
    fault.always = None if state.always is None else set(_u32_view(state.always))
    fault.runs, fault.unique = state.runs, state.unique
    return fault
