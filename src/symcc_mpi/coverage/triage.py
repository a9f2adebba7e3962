"""Coverage triage: the edge summaries workers send (probed by forkserver.py), the AFL build
checked, and the master's AFL-style virgin-bits merge."""

from __future__ import annotations

import enum
import mmap
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

import msgspec
import numpy as np

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
    "with_bits",
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


# The wire's map indices: little-endian u32. Gathers and scatters over them run in numpy:
# the master triages every generated child, thousands of edges each on larger inputs, and a
# Python loop over them was most of its CPU per execution.
_U32 = np.dtype("<u4")


def _pack_u32(values: Iterable[int]) -> bytes:
    return np.fromiter(values, dtype=_U32).tobytes()


def _indices(data: bytes) -> np.ndarray:
    """The wire's u32 array, zero-copy."""
    return np.frombuffer(data, dtype=_U32)


def _gather(table: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """table[idx], 0 for an index past its end."""
    try:
        return table[idx]
    except IndexError:
        got = np.zeros(len(idx), dtype=table.dtype)
        inside = idx < len(table)
        got[inside] = table[idx[inside]]
        return got


def _grown(table: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """`table`, or a copy zero-extended to hold every index of `idx`."""
    top = int(idx.max()) if len(idx) else -1
    if top < len(table):
        return table
    if top >= MAX_MAP_SIZE:
        raise ValueError(f"coverage summary: map index {top} out of range")
    return np.concatenate([table, np.zeros(top + 1 - len(table), dtype=table.dtype)])


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
        return int(_indices(self.edges).max()) if self.edges else -1

    def pairs(self) -> list[tuple[int, int]]:
        """The (map index, bucket bit) pairs, in ascending index order."""
        return list(zip(_indices(self.edges).tolist(), self.buckets, strict=True))

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
        self.hit = np.zeros(size, dtype=np.uint8)
        self.always: set[int] | None = None
        self.runs = 0
        self.unique = 0

    def merge(self, idx: np.ndarray) -> Novelty:
        self.runs += 1
        self.hit = _grown(self.hit, idx)
        novelty = Novelty.NONE
        if not self.hit[idx].all():
            novelty = Novelty.NEW_EDGE
            self.hit[idx] = 1
        if self.always is None:
            self.always = set(idx.tolist())
            novelty = Novelty.NEW_EDGE  # AFL: the first crash always sets new bits
        elif not self.always.issubset(idx.tolist()):
            self.always.intersection_update(idx.tolist())
            novelty = novelty or Novelty.NEW_COUNT
        if novelty:
            self.unique += 1
        return novelty


def path_key(cov: FileCoverage) -> tuple[int, int]:
    """A summary's path, edges and hit-count classes, as Python's SipHash of each field: 64
    bits at least tell two summaries apart, ~4x cheaper than blake2b; a collision could only
    drop one input as a duplicate."""
    return hash(cov.edges), hash(cov.buckets)


def with_bits(bits: np.ndarray | None, cov: FileCoverage) -> np.ndarray:
    """`bits` (per map index, None for none) with the summary's classes ORed in: a copy."""
    idx = _indices(cov.edges)
    bits = np.zeros(0, dtype=np.uint8) if bits is None else bits.copy()
    bits = _grown(bits, idx)
    np.bitwise_or.at(bits, idx, np.frombuffer(cov.buckets, dtype=np.uint8))
    return bits


class CoverageMap:
    """The master's global coverage: AFL's virgin bits, as symcc_fuzzing_helper merges them.

    A normal run is interesting when it hits an edge never hit before or puts an edge
    in a hit-count class not seen before for it. Crashes and hangs are kept apart (as
    AFL does) and only decide whether the crash or hang is unique.
    """

    def __init__(self, map_size: int = 0, *, dedup_capacity: int = 1 << 16) -> None:
        if not 0 <= map_size <= MAX_MAP_SIZE:
            raise ValueError(f"map size {map_size} out of range")
        self._seen = np.zeros(map_size, dtype=np.uint8)
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
        self._hits = np.zeros(map_size, dtype=np.uint32)

    # -- merging

    def merge(self, cov: FileCoverage) -> bool:
        """Merge one summary; True if it is interesting (new coverage, unique crash/hang)."""
        return self.merge_novelty(cov) is not Novelty.NONE

    def merge_packed(self, data: bytes) -> bool:
        """merge() of a FileCoverage.pack() result (raises ValueError if malformed)."""
        return self.merge_novelty(FileCoverage.unpack(data)) is not Novelty.NONE

    def adds_coverage(self, cov: FileCoverage, beyond: np.ndarray | None = None) -> bool:
        """Whether merging `cov`, a normal run's summary, would add anything; changes nothing.
        `beyond`: bits (per map index, as `with_bits` makes them) to count as merged already.

        The map only gains bits, so a summary that adds nothing now never will.
        """
        idx = _indices(cov.edges)
        if not len(idx) or path_key(cov) in self._digests:
            return False
        got = _gather(self._seen, idx)
        if beyond is not None:
            got |= _gather(beyond, idx)
        return bool((np.frombuffer(cov.buckets, dtype=np.uint8) & ~got).any())

    def knows_path(self, cov: FileCoverage) -> bool:
        """Whether a summary of exactly this path (edges and classes) was merged lately."""
        return path_key(cov) in self._digests

    def rarity(self, cov: FileCoverage) -> int:
        """How many interesting runs hit the rarest edge of `cov` (0: an edge none hit)."""
        idx = _indices(cov.edges)
        return int(_gather(self._hits, idx).min()) if len(idx) else 0

    def merge_novelty(self, cov: FileCoverage) -> Novelty:
        """Merge one summary and say what it added (Novelty.NONE if nothing)."""
        cov.validate()
        self._merged += 1
        if cov.map_size > self._declared_size:
            self._declared_size = cov.map_size
        idx = _indices(cov.edges)
        if cov.status == Status.CRASH:
            return self._crashes.merge(idx)
        if cov.status == Status.HANG:
            return self._hangs.merge(idx)
        if not len(idx):
            return Novelty.NONE
        key = path_key(cov)
        if key in self._digests:
            self._duplicates += 1
            return Novelty.NONE
        self._seen = seen = _grown(self._seen, idx)
        got = seen[idx]
        buckets = np.frombuffer(cov.buckets, dtype=np.uint8)
        novelty = Novelty.NONE
        if (buckets & ~got).any():
            novelty = Novelty.NEW_COUNT
            # unique: a summary from another process may name an index twice
            new_edges = len(np.unique(idx[got == 0]))
            if new_edges:
                novelty = Novelty.NEW_EDGE
                self._edges_covered += new_edges
                self._new_edge_finds += 1
            np.bitwise_or.at(seen, idx, buckets)
            self._interesting += 1
            self._hits = _grown(self._hits, idx)
            np.add.at(self._hits, idx, 1)
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
                seen=self._seen.tobytes(),
                faults=[_fault_state(self._crashes), _fault_state(self._hangs)],
                counters=[
                    self._merged,
                    self._interesting,
                    self._new_edge_finds,
                    self._duplicates,
                ],
                hits=self._hits.astype(_U32).tobytes(),
            )
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> CoverageMap:
        state = msgspec.msgpack.decode(data, type=_MapState)
        if state.version != 1 or len(state.faults) != 2 or len(state.counters) != 4:
            raise ValueError("unsupported coverage map state")
        cmap = cls(0)
        if len(state.seen) > MAX_MAP_SIZE:
            raise ValueError("coverage map state: map too large")
        cmap._seen = np.frombuffer(state.seen, dtype=np.uint8).copy()
        cmap._declared_size = state.declared_size
        cmap._edges_covered = int(np.count_nonzero(cmap._seen))
        cmap._crashes = _fault_from_state(state.faults[0])
        cmap._hangs = _fault_from_state(state.faults[1])
        cmap._merged, cmap._interesting, cmap._new_edge_finds, cmap._duplicates = state.counters
        if len(state.hits) % 4 or len(state.hits) > 4 * len(cmap._seen):
            raise ValueError("coverage map state: hit counts of another map")
        cmap._hits = np.frombuffer(state.hits, dtype=_U32).astype(np.uint32)
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
    return _FaultState(fault.hit.tobytes(), always, fault.runs, fault.unique)


def _fault_from_state(state: _FaultState) -> _FaultMap:
    fault = _FaultMap(0)
    fault.hit = np.frombuffer(state.hit, dtype=np.uint8).copy()
    fault.always = None if state.always is None else set(_indices(state.always).tolist())
    fault.runs, fault.unique = state.runs, state.unique
    return fault
