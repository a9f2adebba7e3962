"""DigestTable: per-input state keyed by raw SHA-256 digests, in a few flat buffers.

The master knows every input a campaign ever generated; Python sets and dicts of hex strings
cost hundreds of bytes per input. This table is laid out like CPython's compact dict: an
index of slots (linear probing) over dense parallel arrays, one row per digest, so an input
costs its 32 key bytes, a byte of flags, a depth, a queue id and its share of the index, and
no Python object. Rows are never deleted (a campaign never forgets an input), so a row's
number, its `entry`, is stable and the dense arrays only ever append.

Bound, for large tables: 39 bytes of row, ~1/8 more of the arrays' spare capacity, and 4
bytes per index slot, with 1.5 to 3 slots per entry: 50 to 56 bytes an entry.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterator

KEY_SIZE = 32  # a SHA-256 digest
MAX_DEPTH = 0xFFFF
NO_QUEUE_ID = 0xFFFFFFFF  # the queue-id column's "none"; real ids stay below it

# 'I' is 4 bytes on every platform CPython supports; fall back to 'L' only where it is not.
UINT32 = "I" if array("I").itemsize == 4 else "L"
_MIN_SLOTS = 8
# Every index slot holds entry + 1, so 0 marks a free slot and the index needs no other
# array; the hash of a digest is its first 8 bytes (SHA-256 output is uniform already).
# The hash, read in native byte order: the order memoryview.cast("Q") reads in `_rebuild`.
_hash = struct.Struct("=Q").unpack_from
_FLAGS = tuple(1 << bit for bit in range(8))
# For each flag, a bytes.translate table mapping a flags byte to 1 if it has the flag, else 0.
_MARKS = {flag: bytes(int(bool(byte & flag)) for byte in range(256)) for flag in _FLAGS}


class DigestTable:
    """A set of 32-byte digests, each with a stable `entry` number and small columns:
    flags (8 independent bits, each with an O(1) count), depth (0..65535) and a queue id."""

    __slots__ = ("_index", "_mask", "_limit", "_keys", "_flags", "_depths", "_queue_ids",
                 "_counts")

    def __init__(self) -> None:
        self._index = array(UINT32, [0]) * _MIN_SLOTS
        self._mask = _MIN_SLOTS - 1
        self._limit = _MIN_SLOTS * 2 // 3  # grow past ~2/3 load: probes stay short
        self._keys = bytearray()  # entry e's digest is _keys[32e:32e+32]
        self._flags = array("B")
        self._depths = array("H")
        self._queue_ids = array(UINT32)
        self._counts = dict.fromkeys(_FLAGS, 0)  # flag -> entries with it set

    # -- membership -------------------------------------------------------------------------

    def add(self, key: bytes) -> tuple[int, bool]:
        """The entry of `key`, created (flags 0, depth 0, no queue id) if new; and whether it
        was created."""
        if len(key) != KEY_SIZE:
            raise ValueError(f"a digest is {KEY_SIZE} bytes, not {len(key)}")
        index, keys, mask = self._index, self._keys, self._mask
        slot = _hash(key)[0] & mask
        while stored := index[slot]:
            # Compare in place: slicing the key out would allocate on every probe.
            if keys.startswith(key, (stored - 1) * KEY_SIZE):
                return stored - 1, False
            slot = (slot + 1) & mask
        entry = len(self._flags)
        index[slot] = entry + 1
        keys += key
        self._flags.append(0)
        self._depths.append(0)
        self._queue_ids.append(NO_QUEUE_ID)
        if entry >= self._limit:
            self._rebuild(2 * (mask + 1))
        return entry, True

    def find(self, key: bytes) -> int:
        """The entry of `key`, or -1."""
        if len(key) != KEY_SIZE:
            return -1
        index, keys, mask = self._index, self._keys, self._mask
        slot = _hash(key)[0] & mask
        while stored := index[slot]:
            if keys.startswith(key, (stored - 1) * KEY_SIZE):
                return stored - 1
            slot = (slot + 1) & mask
        return -1

    def __contains__(self, key: object) -> bool:
        return isinstance(key, (bytes, bytearray)) and self.find(key) >= 0

    def __len__(self) -> int:
        return len(self._flags)

    def key(self, entry: int) -> bytes:
        if not 0 <= entry < len(self._flags):
            self._check(entry)
        start = entry * KEY_SIZE
        return bytes(self._keys[start:start + KEY_SIZE])

    # -- flags ------------------------------------------------------------------------------

    def flags(self, entry: int) -> int:
        if entry < 0:
            self._check(entry)
        return self._flags[entry]  # past the end raises IndexError by itself

    def has(self, entry: int, flag: int) -> bool:
        if entry < 0:
            self._check(entry)
        return bool(self._flags[entry] & flag)

    def set_flag(self, entry: int, flag: int) -> bool:
        """Set one flag bit; True if it was clear (the count went up)."""
        flags = self._flags
        if flag not in self._counts or entry < 0:  # the checks inline: this is a hot path
            self._check_flag(flag)
            self._check(entry)
        old = flags[entry]
        if old & flag:
            return False
        flags[entry] = old | flag
        self._counts[flag] += 1
        return True

    def clear_flag(self, entry: int, flag: int) -> bool:
        """Clear one flag bit; True if it was set (the count went down)."""
        flags = self._flags
        if flag not in self._counts or entry < 0:
            self._check_flag(flag)
            self._check(entry)
        old = flags[entry]
        if not old & flag:
            return False
        flags[entry] = old & ~flag
        self._counts[flag] -= 1
        return True

    def count(self, flag: int) -> int:
        """How many entries have `flag` set; kept as flags change, never counted."""
        self._check_flag(flag)
        return self._counts[flag]

    def entries_with(self, flag: int, without: int = 0) -> Iterator[int]:
        """Entries with `flag` set and every flag of the mask `without` clear, in entry order.
        Entries added after the call starts are not visited; one whose flags change
        meanwhile so that it no longer matches is skipped."""
        self._check_flag(flag)
        # Map each flags byte to 1 or 0 and let bytes.find skip the rest at C speed: a
        # Python loop over a million flags would take ~50 ms for a handful of hits.
        marks = self._flags.tobytes().translate(
            _MARKS[flag] if not without else
            bytes(1 if byte & flag and not byte & without else 0 for byte in range(256)))
        flags = self._flags
        entry = marks.find(1)
        while entry >= 0:
            if flags[entry] & flag and not flags[entry] & without:
                yield entry
            entry = marks.find(1, entry + 1)

    def update_flags(self, table: bytes) -> None:
        """Rewrite every entry's flags byte through `table` (bytes.translate's 256-byte map):
        a change of many entries at C speed, as an epoch's start needs (tiers/)."""
        if len(table) != 256:
            raise ValueError("a translation table has 256 entries")
        self._flags = array("B", self._flags.tobytes().translate(table))
        counted = self._flags.tobytes()
        for flag in self._counts:
            self._counts[flag] = len(counted) - counted.translate(_MARKS[flag]).count(0)

    # -- columns ----------------------------------------------------------------------------

    def depth(self, entry: int) -> int:
        self._check(entry)
        return self._depths[entry]

    def set_depth(self, entry: int, depth: int) -> None:
        self._check(entry)
        if not 0 <= depth <= MAX_DEPTH:
            raise ValueError(f"depth {depth} outside 0..{MAX_DEPTH}")
        self._depths[entry] = depth

    def queue_id(self, entry: int) -> int | None:
        self._check(entry)
        queue_id = self._queue_ids[entry]
        return None if queue_id == NO_QUEUE_ID else queue_id

    def queue_id_or_last(self, entry: int) -> int:
        """The entry's queue id, NO_QUEUE_ID (after every id) if none: a sort key."""
        return self._queue_ids[entry]

    def entries_queued_from(self, first: int) -> list[int]:
        """The entries whose queue id is `first` or later, in queue id order."""
        ids = self._queue_ids
        return sorted((entry for entry, queue_id in enumerate(ids)
                       if first <= queue_id != NO_QUEUE_ID), key=ids.__getitem__)

    def set_queue_id(self, entry: int, queue_id: int | None) -> None:
        self._check(entry)
        if queue_id is None:
            queue_id = NO_QUEUE_ID
        elif not 0 <= queue_id < NO_QUEUE_ID:
            raise ValueError(f"queue id {queue_id} outside 0..{NO_QUEUE_ID - 1}")
        self._queue_ids[entry] = queue_id

    # -- snapshots (snapshot.py) -------------------------------------------------------------

    def dump(self) -> list[bytes]:
        """The table's buffers as they are, index included: `restore` needs no rehash."""
        return [self._index.tobytes(), bytes(self._keys), self._flags.tobytes(),
                self._depths.tobytes(), self._queue_ids.tobytes()]

    @classmethod
    def restore(cls, parts: list[bytes]) -> DigestTable:
        """The table `dump` gave these buffers of; ValueError if they do not fit together."""
        index, keys, flags, depths, queue_ids = parts
        table = cls()
        table._index = array(UINT32, index)
        table._keys = bytearray(keys)
        table._flags = array("B", flags)
        table._depths = array("H", depths)
        table._queue_ids = array(UINT32, queue_ids)
        slots, entries = len(table._index), len(table._flags)
        if slots < _MIN_SLOTS or slots & (slots - 1) or len(keys) != KEY_SIZE * entries \
                or len(table._depths) != entries or len(table._queue_ids) != entries \
                or entries >= slots:
            raise ValueError("digest table buffers that do not fit together")
        table._mask, table._limit = slots - 1, slots * 2 // 3
        for flag in _FLAGS:
            table._counts[flag] = entries - flags.translate(_MARKS[flag]).count(0)
        return table

    # -- accounting -------------------------------------------------------------------------

    def memory_bytes(self) -> int:
        """Bytes allocated to the table's buffers, spare capacity included."""
        return sum(sys.getsizeof(buffer) for buffer in (
            self._index, self._keys, self._flags, self._depths, self._queue_ids))

    def slots(self) -> int:
        """Size of the index (a power of two); for tests of growth."""
        return self._mask + 1

    # -- machinery --------------------------------------------------------------------------

    def _check(self, entry: int) -> None:
        # Negative indexes would silently address rows from the end: -1 is find's "absent".
        if not 0 <= entry < len(self._flags):
            raise IndexError(f"no entry {entry} in a table of {len(self._flags)}")

    def _check_flag(self, flag: int) -> None:
        if flag not in self._counts:
            raise ValueError(f"a flag is one bit of a byte, not {flag!r}")

    def _rebuild(self, slots: int) -> None:
        """Index every entry again in a fresh index of `slots` slots. Only the index is
        rebuilt: the dense arrays are already in entry order."""
        index = array(UINT32, [0]) * slots  # filled in C, not a Python loop
        mask = slots - 1
        # The keys read as 64-bit words in place (no copy): word 4e is entry e's hash. The
        # views are released before returning, or the bytearray could not grow again.
        with memoryview(self._keys) as raw, raw.cast("Q") as words:
            for entry, word in enumerate(words[::4], 1):
                slot = word & mask
                while index[slot]:
                    slot = (slot + 1) & mask
                index[slot] = entry
        self._index, self._mask, self._limit = index, mask, slots * 2 // 3
