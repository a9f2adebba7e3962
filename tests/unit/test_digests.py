"""The compact digest table (`digests.DigestTable`): membership, growth, flags and columns."""

from __future__ import annotations

import hashlib

import pytest

from symcc_mpi.scheduling.digests import KEY_SIZE, MAX_DEPTH, NO_QUEUE_ID, DigestTable

A, B, C = 1, 2, 4  # flags


def digest(i: int) -> bytes:
    return hashlib.sha256(i.to_bytes(8, "little")).digest()


def same_prefix(i: int, prefix: bytes = b"\x5a" * 8) -> bytes:
    """Keys that share their first 8 bytes, hence their hash: every one collides."""
    return prefix + hashlib.sha256(b"tail %d" % i).digest()[:KEY_SIZE - 8]


def test_add_find_and_entries():
    table = DigestTable()
    assert len(table) == 0 and table.find(digest(0)) == -1 and digest(0) not in table
    assert table.add(digest(0)) == (0, True)
    assert table.add(digest(1)) == (1, True)
    assert table.add(digest(0)) == (0, False)  # known: same entry, nothing created
    assert len(table) == 2 and digest(0) in table and digest(2) not in table
    assert table.find(digest(1)) == 1 and table.key(1) == digest(1)
    assert bytearray(digest(1)) in table and "not bytes" not in table


def test_wrong_sizes_and_entries_are_refused():
    table = DigestTable()
    with pytest.raises(ValueError):
        table.add(b"short")
    assert table.find(b"short") == -1 and table.find(digest(0) + b"x") == -1
    table.add(digest(0))
    for bad in (-1, 1):  # -1 is find's "absent": it must not address the last row
        with pytest.raises(IndexError):
            table.key(bad)
        with pytest.raises(IndexError):
            table.set_flag(bad, A)
        with pytest.raises(IndexError):
            table.depth(bad)
        with pytest.raises(IndexError):
            table.flags(bad)


def test_growth_across_several_resizes_keeps_every_entry():
    table = DigestTable()
    sizes = set()
    for i in range(5000):
        assert table.add(digest(i)) == (i, True)
        sizes.add(table.slots())
        assert len(table) <= table.slots() * 2 // 3 + 1  # load stays under ~2/3
    assert len(sizes) >= 9  # 8 -> 16 -> ... -> 8192
    assert all(table.find(digest(i)) == i and table.key(i) == digest(i) for i in range(5000))
    assert table.find(digest(5000)) == -1


def test_keys_sharing_their_first_8_bytes():
    table = DigestTable()
    keys = [same_prefix(i) for i in range(300)]  # one probe chain, across several resizes
    for i, key in enumerate(keys):
        assert table.add(key) == (i, True)
    table.add(digest(0))  # an ordinary key among them
    assert [table.find(key) for key in keys] == list(range(300))
    assert [table.add(key) for key in keys] == [(i, False) for i in range(300)]
    assert table.find(same_prefix(300)) == -1  # same hash, other key: absent
    assert table.find(digest(0)) == 300
    # Keys equal but for their last byte, and prefixes of one another's hash in the index.
    near = [bytes(31) + bytes([i]) for i in range(20)]
    for key in near:
        table.add(key)
    assert [table.key(table.find(key)) for key in near] == near


def test_flags_and_their_counts():
    table = DigestTable()
    for i in range(10):
        table.add(digest(i))
    assert table.count(A) == 0 and table.flags(3) == 0
    assert table.set_flag(3, A) and not table.set_flag(3, A)  # set twice, counted once
    assert table.set_flag(5, A) and table.set_flag(5, B) and table.set_flag(1, A)
    assert (table.count(A), table.count(B), table.count(C)) == (3, 1, 0)
    assert table.flags(5) == A | B and table.has(5, B) and not table.has(3, B)
    assert list(table.entries_with(A)) == [1, 3, 5] and list(table.entries_with(B)) == [5]
    assert list(table.entries_with(A, without=B)) == [1, 3]
    assert list(table.entries_with(A, without=B | C)) == [1, 3]
    assert table.clear_flag(3, A) and not table.clear_flag(3, A) and not table.clear_flag(0, C)
    assert table.count(A) == 2 and list(table.entries_with(A)) == [1, 5]
    assert table.flags(5) == A | B  # clearing one entry's flag leaves the others
    for bad in (0, 3, 256, -1):
        with pytest.raises(ValueError):
            table.set_flag(0, bad)
        with pytest.raises(ValueError):
            table.count(bad)


def test_entries_with_while_flags_change():
    table = DigestTable()
    for i in range(6):
        table.add(digest(i))
        table.set_flag(i, C)
    seen = []
    for entry in table.entries_with(C):
        seen.append(entry)
        if entry == 1:
            table.clear_flag(2, C)  # cleared before it is reached: skipped
            table.set_flag(table.add(digest(99))[0], C)  # added meanwhile: not visited
    assert seen == [0, 1, 3, 4, 5] and table.count(C) == 6


def test_depth_and_queue_id_columns():
    table = DigestTable()
    entry, _ = table.add(digest(0))
    assert table.depth(entry) == 0 and table.queue_id(entry) is None
    table.set_depth(entry, MAX_DEPTH)
    table.set_queue_id(entry, 0)
    assert table.depth(entry) == MAX_DEPTH and table.queue_id(entry) == 0
    table.set_queue_id(entry, NO_QUEUE_ID - 1)
    assert table.queue_id(entry) == NO_QUEUE_ID - 1
    table.set_queue_id(entry, None)
    assert table.queue_id(entry) is None
    for bad_depth in (-1, MAX_DEPTH + 1):
        with pytest.raises(ValueError):
            table.set_depth(entry, bad_depth)
    for bad_id in (-1, NO_QUEUE_ID):
        with pytest.raises(ValueError):
            table.set_queue_id(entry, bad_id)
    # Columns survive growth: the dense arrays are never moved, only the index.
    table.set_depth(entry, 7)
    for i in range(1, 100):
        table.add(digest(i))
    assert table.depth(entry) == 7 and table.depth(99) == 0 and table.queue_id(99) is None


def test_memory_per_entry_is_bounded():
    table = DigestTable()
    empty = table.memory_bytes()
    for i in range(50_000):
        table.add(digest(i))
    per_entry = (table.memory_bytes() - empty) / len(table)
    # 32 key bytes + 1 + 2 + 4 of columns, spare capacity and the index's share.
    assert 39 < per_entry <= 64, per_entry
