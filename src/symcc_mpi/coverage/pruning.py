"""The campaign's QSYM pruning map: worker deltas OR-merged, and what each worker lacks shipped.

QSYM (SymCC's backend) skips the solver for a branch whose context its coverage map already
holds (`SYMCC_AFL_COVERAGE_MAP`, `AflTraceMap` in qsym/pintool/afl_trace_map.cpp): 64 KiB of
trace map then 64 KiB of context map, read at start and rewritten whole at every interesting
branch. Both halves only ever gain bits (`trace_map_[i] |= ...`, `context_map_[i] |= mask`),
so maps merge by bitwise OR, in any order, any number of times.

Who holds what:
- a worker keeps a *base* map on node-local storage, exactly the bits the master shipped it;
  a run starts from a copy of it, and what the run added (its *contribution*) travels back with
  the RESULT. The worker never folds its own contribution into its base: a run whose RESULT
  is dropped (stale, rejected, timed out) must not prune the run that redoes it;
- the master merges the contributions of committed runs only into the campaign map of the
  run's *scope* (one scope for `--pruning shared`, one per worker rank for `local`) and logs
  what was new as a segment; with each WORK it ships the segments the worker has not been
  sent yet (its own committed contribution included), or the whole map when that is smaller.
  A worker's cursor advances only once the send returned (as the object cache, F313 D7): a
  lost send ships the same bits again, which OR makes harmless.

So the campaign prunes like a single `symcc_fuzzing_helper` over its committed runs; runs in
flight at the same time cannot see each other's bits, as in any parallel exploration.
"""

from __future__ import annotations

import array
import enum
import logging
import os
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from symcc_mpi.durable.atomic import make_directories, write_durable

log = logging.getLogger("symcc_mpi.coverage.pruning")

MAP_SIZE = 2 * 65536  # QSYM's kMapSize of trace map, then as much context map
SHARED_SCOPE = "shared"
_ENTRY_BYTES = 5  # a u32 index and its byte of bits on the wire
# Once a log holds this many entries, shipping the whole map is cheaper than the log.
_LOG_CAP = MAP_SIZE // _ENTRY_BYTES
_NONZERO = re.compile(rb"[^\x00]")
_U32 = np.dtype("<u4")  # the wire's indices
CHUNK = 4096  # bytes of map compared at once when looking for what a run changed


class PruningMode(str, enum.Enum):
    SHARED = "shared"  # one campaign map: every committed run prunes every later run
    LOCAL = "local"  # one map per worker, as N independent helpers
    OFF = "off"  # no map and no linearization: QSYM solves every branch


class MalformedDelta(ValueError):
    """Bytes that are not a pruning delta (from a worker: never merged)."""


class Delta(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """Bits to OR into a map: sparse (`indices` u32 little-endian, `bits` one byte each), or a
    whole map in `full` (then the sparse part is empty)."""

    indices: bytes = b""
    bits: bytes = b""
    full: bytes = b""

    def __bool__(self) -> bool:
        return bool(self.bits or self.full)

    @property
    def entries(self) -> int:
        return len(self.bits)


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Delta)
EMPTY = Delta()


def encode(delta: Delta) -> bytes:
    return _ENCODER.encode(delta) if delta else b""


def decode(data: bytes) -> Delta:
    """A delta from the wire, checked: indices inside the map, one bits byte per index."""
    if not data:
        return EMPTY
    try:
        delta = _DECODER.decode(data)
    except msgspec.DecodeError as error:
        raise MalformedDelta(f"pruning delta: {error}") from None
    if len(delta.indices) != 4 * len(delta.bits):
        raise MalformedDelta(f"pruning delta: {len(delta.indices)} index bytes for "
                             f"{len(delta.bits)} entries")
    if delta.full and (delta.bits or len(delta.full) != MAP_SIZE):
        raise MalformedDelta(f"pruning delta: a whole map of {len(delta.full)} bytes")
    if delta.bits and max(memoryview(delta.indices).cast("I")) >= MAP_SIZE:
        raise MalformedDelta("pruning delta: an index outside the map")
    return delta


def changed_chunks(before: bytes | bytearray, after: bytes | bytearray) -> list[int]:
    """The offsets of the CHUNK-byte blocks in which two whole maps differ: a run changes a
    few of them, and comparing blocks is a memcmp, where the bit arithmetic is not. Slices of
    bytes, not of memoryviews: those compare byte by byte through struct unpacking, 12x
    slower (0.3 ms a map)."""
    if before == after:
        return []
    return [start for start in range(0, MAP_SIZE, CHUNK)
            if before[start:start + CHUNK] != after[start:start + CHUNK]]


def difference(before: bytes | bytearray, after: bytes | bytearray) -> Delta:
    """The bits `after` has and `before` lacks (both whole maps)."""
    indices: list[int] = []
    bits = bytearray()
    for start in changed_chunks(before, after):
        fresh = int.from_bytes(after[start:start + CHUNK], "little") \
            & ~int.from_bytes(before[start:start + CHUNK], "little")
        if fresh:
            lanes = fresh.to_bytes(CHUNK, "little")
            for m in _NONZERO.finditer(lanes):
                indices.append(start + m.start())
                bits.append(lanes[m.start()])
    return Delta(_pack(indices), bytes(bits)) if indices else EMPTY


def apply(target: bytearray, delta: Delta) -> None:
    """OR `delta` into the whole map `target`, in place."""
    if delta.full:
        merged = int.from_bytes(target, "little") | int.from_bytes(delta.full, "little")
        target[:] = merged.to_bytes(MAP_SIZE, "little")
        return
    for index, bits in zip(memoryview(delta.indices).cast("I"), delta.bits, strict=True):
        target[index] |= bits


def _pack(indices: list[int]) -> bytes:
    return array.array("I", indices).tobytes()  # little-endian hosts only, as triage


def read_map(path: Path) -> bytes:
    """A map file as QSYM leaves it; one of another size is not a map QSYM would read."""
    data = path.read_bytes()
    if len(data) != MAP_SIZE:
        raise MalformedDelta(f"{path}: {len(data)} bytes, a QSYM coverage map has {MAP_SIZE}")
    return data


# --------------------------------------------------------------------------- worker side


class WorkerMap:
    """A worker's base map and the file QSYM reads and rewrites during one run."""

    def __init__(self, path: Path):
        self.path = path
        self.base = bytearray(MAP_SIZE)
        self.epoch = 0
        self._on_file: bytes | None = None  # what the file holds, as last written or read

    def receive(self, data: bytes, epoch: int = 0) -> None:
        """OR the bits a WORK carried into the base (raises MalformedDelta); a WORK of a new
        epoch (tiers/schedule.py) starts the base afresh first."""
        delta = decode(data)
        if epoch != self.epoch:
            self.base = bytearray(MAP_SIZE)
            self.epoch = epoch
        apply(self.base, delta)

    def prepare(self) -> None:
        """The run's map file starts as the base, whatever the last run left there: only the
        blocks that differ are written back (QSYM rewrites the file in place)."""
        on_file, self._on_file = self._on_file, None
        try:
            if on_file is None:
                raise FileNotFoundError
            with open(self.path, "r+b") as handle:
                for start in changed_chunks(on_file, self.base):
                    os.pwrite(handle.fileno(), self.base[start:start + CHUNK], start)
        except FileNotFoundError:
            self.path.write_bytes(self.base)
        self._on_file = bytes(self.base)

    def contribution(self) -> bytes:
        """What the run added to its map, encoded for the RESULT."""
        self._on_file = None  # unless read back whole below
        try:
            after = read_map(self.path)
        except FileNotFoundError:
            return b""
        except MalformedDelta as error:  # not QSYM's map: this SymCC cannot share pruning
            log.warning("%s; the run's pruning is not shared", error)
            return b""
        self._on_file = after
        return encode(difference(self.base, after))


# --------------------------------------------------------------------------- master side


@dataclass(frozen=True)
class Shipment:
    """What one WORK carries to `rank`, and the cursor its confirmation moves to."""

    rank: int
    payload: bytes
    cursor: int
    entries: int = 0
    whole: bool = False


@dataclass(frozen=True)
class PruningStatistics:
    mode: str
    scopes: int
    map_bytes_set: int  # non-zero bytes, summed over the scopes
    merged: int  # contributions merged
    new_entries: int  # (index, bits) entries that were new to their scope
    shipped_bytes: int
    shipped_entries: int
    whole_maps_shipped: int


class _Segment(msgspec.Struct, array_like=True, gc=False):
    seq: int
    indices: bytes
    bits: bytes


class _Scope:
    __slots__ = ("map", "log", "log_entries", "seq", "set_bytes")

    def __init__(self, initial: bytes | None = None):
        self.map = bytearray(initial if initial is not None else MAP_SIZE)
        self.log: deque[_Segment] = deque()
        self.log_entries = 0
        self.seq = 0
        self.set_bytes = MAP_SIZE - self.map.count(0)
        if self.set_bytes:  # a resumed map: everyone's cursor (0) is before it
            self.seq = 1


class PruningLedger:
    """The master's campaign maps, per scope, with the log of what each gained and when."""

    def __init__(self, mode: PruningMode, saved: dict[str, bytes] | None = None):
        if mode is PruningMode.OFF:
            raise ValueError("no ledger when pruning is off")
        self.mode = mode
        self._scopes: dict[str, _Scope] = {name: _Scope(data) for name, data in
                                           (saved or {}).items()}
        self._cursors: dict[int, int] = {}
        self._merged = 0
        self._new_entries = 0
        self._shipped_bytes = 0
        self._shipped_entries = 0
        self._whole_maps = 0
        self.dirty = False

    def scope_of(self, rank: int) -> str:
        return SHARED_SCOPE if self.mode is PruningMode.SHARED else f"rank-{rank}"

    def _scope(self, rank: int) -> _Scope:
        name = self.scope_of(rank)
        scope = self._scopes.get(name)
        if scope is None:
            scope = self._scopes[name] = _Scope()
        return scope

    def merge(self, rank: int, delta: Delta) -> int:
        """OR a committed run's contribution into its scope; return the entries it added."""
        if not delta:
            return 0
        self._merged += 1
        return self._merge(self._scope(rank), delta)

    def _merge(self, scope: _Scope, delta: Delta) -> int:
        # Vectorised: a run's contribution holds hundreds of entries, and this runs for
        # every commit (a Python loop over them was 6% of the master's CPU on toml).
        target = np.frombuffer(scope.map, dtype=np.uint8)  # a view: writes reach the map
        if delta.full:
            indices = np.arange(MAP_SIZE, dtype=_U32)
            bits = np.frombuffer(delta.full, dtype=np.uint8)
        else:
            indices = np.frombuffer(delta.indices, dtype=_U32)
            bits = np.frombuffer(delta.bits, dtype=np.uint8)
        gained = bits & ~target[indices]
        hit = np.flatnonzero(gained)
        if not len(hit):
            return 0
        new_indices, new_bits = indices[hit], gained[hit]
        if len(new_indices) < 2 or (new_indices[1:] > new_indices[:-1]).all():
            # Each index once, as `difference` writes them: plain indexing instead of
            # ufunc.at (8.0 against 10.2 µs a merge on deltas captured from toml).
            before = target[new_indices]
            scope.set_bytes += int(np.count_nonzero(before == 0))
            target[new_indices] = before | new_bits
        else:  # a worker's delta may name an index twice: count each map byte once, OR both
            scope.set_bytes += len(np.unique(new_indices[target[new_indices] == 0]))
            np.bitwise_or.at(target, new_indices, new_bits)
        scope.seq += 1
        scope.log.append(_Segment(scope.seq, new_indices.tobytes(), new_bits.tobytes()))
        scope.log_entries += len(hit)
        while scope.log_entries > _LOG_CAP:  # beyond this the whole map ships instead
            scope.log_entries -= len(scope.log.popleft().bits)
        self._new_entries += len(hit)
        self.dirty = True
        return len(hit)

    def shared_map(self) -> bytes | None:
        """The `--pruning shared` campaign map (None in `local` mode, or before any bit)."""
        scope = self._scopes.get(SHARED_SCOPE) if self.mode is PruningMode.SHARED else None
        return bytes(scope.map) if scope is not None else None

    def absorb(self, whole: bytes) -> int:
        """OR another master's shared map into this one's, shipped to the workers as any
        merged bits are; returns the entries it added (none in `local` mode)."""
        if len(whole) != MAP_SIZE:
            raise MalformedDelta(f"pruning map of {len(whole)} bytes, a QSYM map has {MAP_SIZE}")
        if self.mode is not PruningMode.SHARED:
            return 0
        scope = self._scopes.get(SHARED_SCOPE) or self._scopes.setdefault(SHARED_SCOPE, _Scope())
        delta = difference(scope.map, whole)
        return self._merge(scope, delta) if delta else 0

    def plan(self, rank: int) -> Shipment:
        """What `rank` lacks of its scope's map. Changes nothing until `confirm`."""
        scope = self._scopes.get(self.scope_of(rank))
        cursor = self._cursors.get(rank, 0)
        if scope is None or cursor >= scope.seq:
            return Shipment(rank, b"", cursor)
        oldest = scope.log[0].seq if scope.log else scope.seq + 1
        if cursor + 1 < oldest:  # the log no longer reaches back to this cursor
            return Shipment(rank, encode(Delta(full=bytes(scope.map))), scope.seq, whole=True)
        pending = []
        for segment in reversed(scope.log):  # the newest are the ones a worker lacks
            if segment.seq <= cursor:
                break
            pending.append(segment)
        pending.reverse()
        delta = Delta(b"".join(s.indices for s in pending), b"".join(s.bits for s in pending))
        return Shipment(rank, encode(delta), scope.seq, entries=delta.entries)

    def confirm(self, shipment: Shipment) -> None:
        """The WORK carrying `shipment` was sent (the send returned)."""
        self._cursors[shipment.rank] = shipment.cursor
        self._shipped_bytes += len(shipment.payload)
        self._shipped_entries += shipment.entries
        self._whole_maps += shipment.whole

    def forget(self, rank: int) -> None:
        """The worker may have lost its map: the next WORK ships it whole."""
        self._cursors.pop(rank, None)

    def forget_all(self) -> None:
        """Ranks are numbered anew (ulfm/): every worker gets its map whole again."""
        self._cursors.clear()

    def begin_epoch(self) -> None:
        """A new epoch (tiers/schedule.py): every map starts empty, the workers' too (their
        next WORK says so)."""
        self._scopes.clear()
        self._cursors.clear()
        self.dirty = True

    def maps(self) -> dict[str, bytes]:
        return {name: bytes(scope.map) for name, scope in self._scopes.items()}

    def statistics(self) -> PruningStatistics:
        return PruningStatistics(
            mode=self.mode.value, scopes=len(self._scopes),
            map_bytes_set=sum(s.set_bytes for s in self._scopes.values()),
            merged=self._merged, new_entries=self._new_entries,
            shipped_bytes=self._shipped_bytes, shipped_entries=self._shipped_entries,
            whole_maps_shipped=self._whole_maps)


# --------------------------------------------------------------------------- on disk


def save_maps(directory: Path, maps: dict[str, bytes]) -> None:
    """Save the scopes' maps; a map file of a scope that has none any more (a new epoch) is
    removed."""
    make_directories(directory)
    for name, data in maps.items():
        write_durable(directory / f"{name}.map", data)
    for path in directory.glob("*.map"):
        if path.stem not in maps:
            path.unlink()


def load_maps(directory: Path) -> dict[str, bytes]:
    """Saved scope maps; a file of the wrong size is refused (raises MalformedDelta)."""
    if not directory.is_dir():
        return {}
    return {path.stem: read_map(path) for path in sorted(directory.glob("*.map"))}
