"""AFL edge coverage as the campaign passes it around: the packed per-file summary a
worker's probe makes (coverage/forkserver.py) and the master merges (coverage/triage.py), the
probe's verdicts, AFL's hit-count buckets, and the check that --afl-target is an AFL build."""

from __future__ import annotations

import enum
import mmap
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

import msgspec
import numpy as np


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


def pack_u32(values: Iterable[int]) -> bytes:
    return np.fromiter(values, dtype=_U32).tobytes()


def indices(data: bytes) -> np.ndarray:
    """The wire's u32 array, zero-copy."""
    return np.frombuffer(data, dtype=_U32)


def gather(table: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """table[idx], 0 for an index past its end."""
    try:
        return table[idx]
    except IndexError:
        got = np.zeros(len(idx), dtype=table.dtype)
        inside = idx < len(table)
        got[inside] = table[idx[inside]]
        return got


def grown(table: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """`table`, or a copy zero-extended to hold every index of `idx`."""
    top = int(idx.max()) if len(idx) else -1
    if top < len(table):
        return table
    if top >= MAX_MAP_SIZE:
        raise ValueError(f"coverage summary: map index {top} out of range")
    return np.concatenate([table, np.zeros(top + 1 - len(table), dtype=table.dtype)])


class FileCoverage(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Edge summary of one input: what a worker sends to its master (msgspec-serialisable).

    `edges` holds the AFL map indices hit, as little-endian u32 in strictly ascending order
    (`validate` refuses any other: the master's map updates rely on each index once);
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
            edges=pack_u32(i for i, _ in ordered),
            buckets=bytes(b for _, b in ordered),
            map_size=map_size,
        )

    @classmethod
    def unpack(cls, data: bytes) -> FileCoverage:
        """Decode and validate what pack() produced (raises ValueError if malformed)."""
        return cls.unpack_many([data])[0]

    @classmethod
    def unpack_many(cls, blobs: Sequence[bytes]) -> list[FileCoverage]:
        """unpack() of each blob, their indices checked in one numpy pass: the master checks
        every child of a RESULT, and per child most of the cost was numpy's per call. Raises
        ValueError if any is malformed (unpack them one by one to learn which)."""
        try:
            covs = [_DECODER.decode(blob) for blob in blobs]
        except msgspec.DecodeError as exc:
            raise ValueError(f"coverage summary: {exc}") from None
        for cov in covs:
            cov._check_shape()
        _check_indices([cov.edges for cov in covs if cov.edges])
        return covs

    def pack(self) -> bytes:
        """The summary as compact msgpack bytes, for a protocol message."""
        return _ENCODER.encode(self)

    @property
    def top_index(self) -> int:
        """The highest map index hit, -1 if none: the last, in a summary that validates."""
        return int.from_bytes(self.edges[-4:], "little") if self.edges else -1

    def pairs(self) -> list[tuple[int, int]]:
        """The (map index, bucket bit) pairs, in ascending index order."""
        return list(zip(indices(self.edges).tolist(), self.buckets, strict=True))

    def validate(self) -> None:
        """Raise ValueError unless the summary is well formed (it comes from another process)."""
        self._check_shape()
        if self.edges:
            _check_indices([self.edges])

    def _check_shape(self) -> None:
        if len(self.edges) != 4 * len(self.buckets):
            raise ValueError(
                f"coverage summary: {len(self.edges)} index bytes for {len(self.buckets)} buckets"
            )
        if self.buckets.translate(None, _VALID_BUCKETS):
            raise ValueError("coverage summary: a bucket is not a single AFL hit-count class bit")
        if not 0 <= self.map_size <= MAX_MAP_SIZE:
            raise ValueError(f"coverage summary: map size {self.map_size} out of range")


def _check_indices(edges: list[bytes]) -> None:
    """Each summary's indices (`edges`, none empty) strictly ascending and inside AFL++'s
    largest map: the master's map updates rely on each index once."""
    if not edges:
        return
    idx = indices(edges[0] if len(edges) == 1 else b"".join(edges))
    ascending = idx[1:] > idx[:-1]
    if len(edges) > 1:
        firsts = np.cumsum([len(blob) // 4 for blob in edges[:-1]])
        ascending[firsts - 1] = True  # one summary's first index after another's last
    if not ascending.all():
        raise ValueError("coverage summary: map indices not in strictly ascending order")
    if max(int.from_bytes(blob[-4:], "little") for blob in edges) >= MAX_MAP_SIZE:
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
