"""The journals' line format: `<crc32 of the JSON, 8 hex> <JSON object>\n`, ASCII only, and
the write step that puts a line's bytes in a file (durable/journal.py says why the checksum)."""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from symcc_mpi.durable.atomic import SYSTEM_DISK

Writer = Callable[[int, bytes], None]
"""Write all of `data` to the file descriptor; raise OSError on failure."""


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = SYSTEM_DISK.write(fd, view)
        view = view[written:]


class LineError(ValueError):
    """A journal line is not a well-formed, checksummed record."""


class UnchecksummedLine(LineError):
    """A whole line of bare JSON: written by a version that wrote no checksums, not torn."""


# Keys sorted, no spaces: the bytes of `json.dumps(sort_keys=True, separators=(",", ":"))`,
# at a twentieth of its cost (a work record is written before every WORK the master sends).
_ENCODER = msgspec.json.Encoder(order="sorted")
_DECODER = msgspec.json.Decoder()  # a resume reads every line: 6x json.loads's speed


def encode_line(record: Mapping[str, Any]) -> bytes:
    payload = _ENCODER.encode(record)
    # The file is ASCII only, and a NaN is refused, not written as null: json.dumps decides.
    if not payload.isascii() or b"null" in payload:
        payload = json.dumps(record, sort_keys=True, separators=(",", ":"),
                             ensure_ascii=True, allow_nan=False).encode("ascii")
    return b"%08x %s\n" % (zlib.crc32(payload), payload)


def decode_line(line: bytes) -> dict[str, Any]:
    """Decode one line (its trailing newline already removed)."""
    if line[:1] == b"{":
        # A line of this format opens with hex digits, so this is no torn append of it.
        raise UnchecksummedLine("a record without a checksum (written by an older symcc-mpi)")
    if len(line) < 10 or line[8:9] != b" ":
        raise LineError("no checksum field")
    try:
        stated = int(line[:8], 16)
    except ValueError:
        raise LineError("checksum field is not hex") from None
    if line[:8] != b"%08x" % stated:
        # int() also takes upper case, "_", "+", "0x" and spaces: a flipped byte there would
        # leave the checksum intact. Only what encode_line writes is a checksum.
        raise LineError("checksum field is not 8 lowercase hex digits")
    payload = line[9:]
    if zlib.crc32(payload) != stated:
        raise LineError("checksum mismatch")
    try:
        record = _DECODER.decode(payload)
    except msgspec.DecodeError:
        raise LineError("checksummed payload is not JSON") from None
    if not isinstance(record, dict):
        raise LineError("record is not a JSON object")
    return record
