"""What the lease tables share: `table.json` (both: federation/leases.py's work-lease logs and
federation/target_leases.py's target leases), the target table's `records/<shard>/`, `locks/`
and `quarantine/`, opening them, and the errors of their records."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import msgspec

from symcc_mpi.durable.atomic import fsync_directory, make_directories, write_durable
from symcc_mpi.durable.locks import break_if_dead, sweep_debris

MAX_SHARDS = 4096


class LeaseError(Exception):
    """Base of the table's own errors (lock timeouts stay `TimeoutError`, I/O `OSError`)."""


class TableMismatch(LeaseError):
    """The directory holds a `table.json` this code cannot read or of another schema."""


class CorruptRecord(LeaseError):
    """A record did not decode or contradicts its own name; it was moved to `quarantined`.

    Repeating the operation sees the digest as absent. `quarantined` is None when even moving
    it aside failed: then the record stays, and every operation on it raises again (fail closed).
    """

    def __init__(self, path: Path, reason: str, quarantined: Path | None):
        self.path = path
        self.reason = reason
        self.quarantined = quarantined
        where = f"moved to {quarantined}" if quarantined else "could not be moved aside"
        super().__init__(f"corrupt lease record {path}: {reason}; {where}")


class InvalidRecord(Exception):
    """A record's bytes do not decode to a record consistent with its file name."""


def decode_record(decoder: msgspec.json.Decoder, raw: bytes):
    """The record `decoder` makes of `raw`; InvalidRecord, saying why, if it makes none."""
    try:
        return decoder.decode(raw)
    except msgspec.DecodeError as error:  # ValidationError is a DecodeError
        raise InvalidRecord(str(error) or "empty or truncated") from None


def check_seconds(what: str, value: float) -> float:
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value)
                                       and value > 0):
        raise ValueError(f"{what} must be a finite number of seconds > 0 (got {value!r})")
    return float(value)


def unlink_record(path: Path, *, fsync: bool) -> None:
    path.unlink(missing_ok=True)
    if fsync:
        fsync_directory(path.parent)


def open_sharded_table(root: Path, schema: str, shards: int, *, fsync: bool
                       ) -> tuple[int, int]:
    """Open (create if absent) the sharded table at `root` that this module's and
    target_leases.py's tables share the layout of: `table.json`, `records/<shard>/`, `locks/`,
    `quarantine/`. Returns the table's shard count (its creator's, whatever `shards` says)
    and how many locks of dead holders it cleared. TableMismatch if `table.json` is not one
    of `schema`."""
    make_directories(root)
    found = open_description(root, schema, shards, fsync=fsync)
    created = False
    for tree in ("records", "locks", "quarantine"):
        created |= make_directory(root / tree)
    for directory in shard_directories(root, found):
        created |= make_directory(directory)
    if created and fsync:
        for directory in (root / "records", root):
            fsync_directory(directory)
    # A master killed inside an update leaves its lock; clear it now if (and only if) its
    # holder is provably dead (locks.break_if_dead), so reopening leaves nothing behind.
    locks = root / "locks"
    sweep_debris(locks)
    return found, sum(1 for name in os.listdir(locks)
                      if name.endswith(".lock") and break_if_dead(locks / name))


def open_description(root: Path, schema: str, shards: int, *, fsync: bool) -> int:
    """`root/table.json`, created if absent: the shard count the table's creator fixed,
    whatever `shards` says. TableMismatch if it is not a table of `schema`."""
    meta = root / "table.json"
    if not meta.exists():
        # Create-if-absent without a race: of two openers one links its file into place,
        # and both read the winner's shard count (two masters putting one key in two shards
        # would lock two different locks).
        write_durable(meta, json.dumps({"schema": schema, "shards": shards}).encode() + b"\n",
                      fsync=fsync, exclusive=True)
    try:
        raw = json.loads(meta.read_bytes())
        found_schema, found = raw["schema"], raw["shards"]
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise TableMismatch(f"{meta}: unreadable table description ({error})") from None
    if found_schema != schema:
        raise TableMismatch(f"{meta}: schema {found_schema!r}, not {schema!r}")
    if isinstance(found, bool) or not isinstance(found, int) or not 1 <= found <= MAX_SHARDS:
        raise TableMismatch(f"{meta}: shard count {found!r} out of range")
    return found


def shard_directories(root: Path, shards: int) -> list[Path]:
    digits = len(f"{shards - 1:x}")
    return [root / "records" / f"{shard:0{digits}x}" for shard in range(shards)]


def make_directory(path: Path) -> bool:
    try:
        path.mkdir()
    except FileExistsError:
        return False
    fsync_directory(path.parent)
    return True
