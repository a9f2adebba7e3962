"""A dispatch's staged children: one pack file per dispatch, written by its worker, read by
its master.

A run leaves tens of children; staged one file each, they cost a file creation apiece on
the shared filesystem (0.5 ms each on these VMs' ext4, 35 µs on tmpfs) though the master
reads few of them. A pack is one file, `OUT/.staging/<token>`: the children's bytes back to
back, then an index (each child's SHA-256 and size, in the order the RESULT lists them),
then the number of entries and a magic. The master reads only the children it keeps, each at
its offset, and checks the bytes against their SHA-256 before anything of them is published
(F320: staging verified child by child); every child the RESULT lists must be in the pack.

A worker writes its pack once and removes it when it asks for its next work (the master has
handled the RESULT by then); the master may move a pack elsewhere first (the aside pool keeps
the packs of children it set aside, tiers/pool.py). A pack is opened without following a
link and checked to be a regular file on its descriptor (regular.py): whoever wrote it is
not trusted.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from symcc_mpi.durable.regular import NotRegularFile, open_regular
from symcc_mpi.wire.protocol import MAX_GENERATED, MAX_STAGED_SIZE, ResultField

MAGIC = b"SMPACK01"
_FOOTER = struct.Struct("<Q8s")  # entries, magic
_ENTRY = struct.Struct("<32sQ")  # SHA-256, size
_COPY_BLOCK = 1 << 20
_TAIL_READ = 4096  # the footer and an index of up to 101 children (40 bytes each)


class PackRejected(Exception):
    """A pack that is missing, not a regular file, or not what its RESULT says; `field`
    names the RESULT field at fault."""

    def __init__(self, field: ResultField, reason: str):
        super().__init__(reason)
        self.field = field


@dataclass(frozen=True)
class Staged:
    """One child in a pack."""

    digest: str
    offset: int
    size: int


def write_pack(paths: Iterable[Path], pack: Path, parent: str) -> tuple[list[Staged], Counter]:
    """Copy the regular files of `paths` into the pack `pack`, once each by content, the
    parent's own bytes left out; return what was packed, in order, and the entries refused
    as not regular files, by kind. No child: no pack is made.

    Each entry is opened without following a link nor waiting on a FIFO and checked on its
    descriptor (regular.open_regular); the bytes hashed are the bytes copied, read once. A
    copy, not a link: anything left holding the file open could change it after it was
    hashed.
    """
    staged: list[Staged] = []
    refused: Counter = Counter()
    seen = {parent}
    fd = None
    offset = 0
    try:
        for path in paths:
            try:
                source, _ = open_regular(path)
            except NotRegularFile as not_regular:
                refused[not_regular.kind] += 1
                continue
            if fd is None:
                fd = os.open(pack, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            digest = hashlib.sha256()
            size = 0
            with os.fdopen(source, "rb") as handle:
                for block in iter(lambda: handle.read(_COPY_BLOCK), b""):
                    digest.update(block)
                    _write_all(fd, block)
                    size += len(block)
            name = digest.hexdigest()
            if name in seen:
                os.ftruncate(fd, offset)
                os.lseek(fd, offset, os.SEEK_SET)
                continue
            seen.add(name)
            staged.append(Staged(name, offset, size))
            offset += size
        if fd is not None:
            _write_all(fd, b"".join(_ENTRY.pack(bytes.fromhex(s.digest), s.size)
                                    for s in staged) + _FOOTER.pack(len(staged), MAGIC))
    finally:
        if fd is not None:
            os.close(fd)
    return staged, refused


def write_entries(pack: Path, children: Sequence[tuple[str, bytes]]) -> None:
    """A pack of these (digest, bytes) as given, not hashed: what the hostile worker of
    faults.py writes, bytes under a name that is not theirs among them."""
    index = b"".join(_ENTRY.pack(bytes.fromhex(digest), len(data)) for digest, data in children)
    pack.write_bytes(b"".join(data for _, data in children) + index
                     + _FOOTER.pack(len(children), MAGIC))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_child(pack: Path, entry: Staged) -> bytes:
    """A child's bytes from a pack this worker wrote (its coverage probe reads them)."""
    with open(pack, "rb") as handle:
        return os.pread(handle.fileno(), entry.size, entry.offset)


class Pack:
    """A pack opened for reading by the master: its index checked, its children read and
    verified one at a time. Close it (or use it as a context manager)."""

    def __init__(self, name: str, *, dir_fd: int | None = None):
        """`name`: the pack's path, or its name in the directory `dir_fd`. Raises
        PackRejected."""
        try:
            self._fd, status = open_regular(name, dir_fd=dir_fd)
        except FileNotFoundError:
            raise PackRejected(ResultField.MISSING_FILE, "no staged pack") from None
        except NotRegularFile as not_regular:
            raise PackRejected(ResultField.NOT_REGULAR,
                               f"the staged pack is {not_regular.strerror}") from None
        except OSError as error:
            raise PackRejected(ResultField.MISSING_FILE,
                               f"staged pack: {error.strerror}") from None
        try:
            self.entries = self._index(status.st_size)
        except BaseException:
            os.close(self._fd)
            raise
        self.by_digest = {entry.digest: entry for entry in self.entries}

    def _index(self, size: int) -> list[Staged]:
        if size < _FOOTER.size:
            raise PackRejected(ResultField.MISSING_FILE, f"staged pack of {size} bytes")
        # One read for the footer and, most often, the whole index before it.
        tail = os.pread(self._fd, min(size, _TAIL_READ), max(0, size - _TAIL_READ))
        count, magic = _FOOTER.unpack(tail[-_FOOTER.size:])
        index_size = count * _ENTRY.size
        if magic != MAGIC or count > MAX_GENERATED or index_size > size - _FOOTER.size:
            raise PackRejected(ResultField.MISSING_FILE, "the staged pack has no index")
        data_size = size - _FOOTER.size - index_size
        raw = tail[-_FOOTER.size - index_size:-_FOOTER.size] \
            if _FOOTER.size + index_size <= len(tail) \
            else os.pread(self._fd, index_size, data_size)
        entries, offset = [], 0
        for digest, length in _ENTRY.iter_unpack(raw):
            if length > MAX_STAGED_SIZE:
                raise PackRejected(ResultField.SIZE, f"staged child of {length} bytes")
            entries.append(Staged(digest.hex(), offset, length))
            offset += length
        if offset != data_size:
            raise PackRejected(ResultField.MISSING_FILE, f"the staged pack holds {data_size} "
                               f"bytes of children, its index {offset}")
        return entries

    def check(self, listed: Sequence[tuple[str, int]]) -> None:
        """Each (digest, size) listed must be a child of this pack, of that size. The pack
        may hold more: a commit manifest lists only the children its commit publishes, and
        nothing is read but what is listed."""
        for digest, size in listed:
            entry = self.by_digest.get(digest)
            if entry is None or entry.size != size:
                raise PackRejected(ResultField.MISSING_FILE,
                                   f"staged {digest[:12]} is not in the staged pack")

    def read(self, digest: str) -> bytes:
        """A child's bytes, checked against its SHA-256 (raises PackRejected)."""
        entry = self.by_digest[digest]
        data = os.pread(self._fd, entry.size, entry.offset)
        if len(data) != entry.size or hashlib.sha256(data).hexdigest() != digest:
            raise PackRejected(ResultField.STAGED_BYTES,
                               f"staged {digest[:12]}: bytes do not match their SHA-256")
        return data

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Pack:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
