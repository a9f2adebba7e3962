"""The master's coverage triage: the campaign's AFL-style virgin-bits map that decides which
children add coverage, its figures, and its saved state for --resume."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np

from symcc_mpi.coverage.edges import (
    _U32,
    MAX_MAP_SIZE,
    FileCoverage,
    Novelty,
    Status,
    gather,
    grown,
    indices,
    pack_u32,
)

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
        self.hit = grown(self.hit, idx)
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
    idx = indices(cov.edges)
    bits = np.zeros(0, dtype=np.uint8) if bits is None else bits.copy()
    bits = grown(bits, idx)
    bits[idx] |= np.frombuffer(cov.buckets, dtype=np.uint8)  # each index once (validate)
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

    def adds_coverage(self, cov: FileCoverage, beyond: np.ndarray | None = None) -> bool:
        """Whether merging `cov`, a normal run's summary, would add anything; changes nothing.
        `beyond`: bits (per map index, as `with_bits` makes them) to count as merged already.

        The map only gains bits, so a summary that adds nothing now never will.
        """
        idx = indices(cov.edges)
        if not len(idx) or path_key(cov) in self._digests:
            return False
        got = gather(self._seen, idx)
        if beyond is not None:
            got |= gather(beyond, idx)
        return bool((np.frombuffer(cov.buckets, dtype=np.uint8) & ~got).any())

    def assess(self, covs: Sequence[FileCoverage]) -> list[tuple[bool, int]]:
        """For each of several normal runs' summaries: whether it adds coverage (as
        `adds_coverage`), and its rarity: how many interesting runs hit its rarest edge (0: an
        edge none hit). One numpy pass over all their edges: per summary, most of the cost
        was numpy's per call, and a RESULT brings several."""
        nonempty = [cov for cov in covs if cov.edges]
        if not nonempty:
            return [(False, 0)] * len(covs)
        counts = np.fromiter((len(cov.buckets) for cov in nonempty), dtype=np.intp,
                             count=len(nonempty))
        starts = np.zeros(len(nonempty), dtype=np.intp)
        np.cumsum(counts[:-1], out=starts[1:])
        idx = indices(b"".join(cov.edges for cov in nonempty))
        buckets = np.frombuffer(b"".join(cov.buckets for cov in nonempty), dtype=np.uint8)
        novel = np.logical_or.reduceat(buckets & ~gather(self._seen, idx), starts).tolist()
        rarest = np.minimum.reduceat(gather(self._hits, idx), starts).tolist()
        assessed = iter(zip(novel, rarest, strict=True))
        digests = self._digests
        found = []
        for cov in covs:
            if not cov.edges:
                found.append((False, 0))
                continue
            adds, rarity = next(assessed)
            found.append((bool(adds) and path_key(cov) not in digests, rarity))
        return found

    def knows_path(self, cov: FileCoverage) -> bool:
        """Whether a summary of exactly this path (edges and classes) was merged lately."""
        return path_key(cov) in self._digests

    def merge_novelty(self, cov: FileCoverage) -> Novelty:
        """Merge one summary and say what it added (Novelty.NONE if nothing)."""
        cov.validate()
        self._merged += 1
        if cov.map_size > self._declared_size:
            self._declared_size = cov.map_size
        idx = indices(cov.edges)
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
        self._seen = seen = grown(self._seen, idx)
        got = seen[idx]
        buckets = np.frombuffer(cov.buckets, dtype=np.uint8)
        novelty = Novelty.NONE
        if (buckets & ~got).any():
            novelty = Novelty.NEW_COUNT
            new_edges = int(np.count_nonzero(got == 0))  # each index once (validate above)
            if new_edges:
                novelty = Novelty.NEW_EDGE
                self._edges_covered += new_edges
                self._new_edge_finds += 1
            seen[idx] = got | buckets
            self._interesting += 1
            self._hits = grown(self._hits, idx)
            self._hits[idx] += 1
        if len(self._digests) >= self._dedup_capacity:
            self._digests.clear()
        self._digests.add(key)
        return novelty

    # -- another master's coverage (federation/map_exchange.py)

    def seen_bytes(self) -> bytes:
        """The normal runs' virgin bits, per map index: what `absorb` takes."""
        return self._seen.tobytes()

    def absorb(self, seen: bytes) -> bool:
        """OR another map's `seen_bytes` into this one's: its coverage counts as had here, not
        as finds of this map's (no interesting run, no hit counts). True if it added bits."""
        if len(seen) > MAX_MAP_SIZE:
            raise ValueError(f"a coverage map of {len(seen)} bytes is larger than any")
        other = np.frombuffer(seen, dtype=np.uint8)
        if len(other) > len(self._seen):
            self._seen = np.concatenate(
                [self._seen, np.zeros(len(other) - len(self._seen), dtype=np.uint8)])
        mine = self._seen[:len(other)]
        if not (other & ~mine).any():
            return False
        self._edges_covered += int(np.count_nonzero((mine == 0) & (other != 0)))
        mine |= other
        return True

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
    always = None if fault.always is None else pack_u32(sorted(fault.always))
    return _FaultState(fault.hit.tobytes(), always, fault.runs, fault.unique)


def _fault_from_state(state: _FaultState) -> _FaultMap:
    fault = _FaultMap(0)
    fault.hit = np.frombuffer(state.hit, dtype=np.uint8).copy()
    fault.always = None if state.always is None else set(indices(state.always).tolist())
    fault.runs, fault.unique = state.runs, state.unique
    return fault
