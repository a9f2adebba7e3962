"""The QSYM pruning map (`pruning.py`): deltas on the wire, the worker's base map, the master's
ledger of what each worker lacks, and the maps saved for `--resume`.

QSYM's coverage map (`SYMCC_AFL_COVERAGE_MAP`) is a 131072-byte file, 64 KiB of trace map then
64 KiB of context map, that only ever gains bits: maps merge by bitwise OR.
"""

from __future__ import annotations

import array
import logging

import msgspec
import pytest

from symcc_mpi.coverage.pruning import (
    _LOG_CAP,
    EMPTY,
    MAP_SIZE,
    SHARED_SCOPE,
    Delta,
    MalformedDelta,
    PruningLedger,
    PruningMode,
    WorkerMap,
    apply,
    decode,
    difference,
    encode,
    load_maps,
    read_map,
    save_maps,
)


def whole(bits: dict[int, int]) -> bytes:
    """A whole map holding `bits` ({index: byte})."""
    data = bytearray(MAP_SIZE)
    for index, byte in bits.items():
        data[index] = byte
    return bytes(data)


def sparse(bits: dict[int, int]) -> Delta:
    indices = sorted(bits)
    return Delta(array.array("I", indices).tobytes(), bytes(bits[i] for i in indices))


def as_dict(delta: Delta) -> dict[int, int]:
    """A delta's bits as {index: byte} (ORed when an index repeats)."""
    if delta.full:
        return {i: b for i, b in enumerate(delta.full) if b}
    out: dict[int, int] = {}
    for index, byte in zip(memoryview(delta.indices).cast("I"), delta.bits, strict=True):
        out[index] = out.get(index, 0) | byte
    return out


def received(payload: bytes) -> dict[int, int]:
    return as_dict(decode(payload))


def raw(indices: bytes = b"", bits: bytes = b"", full: bytes = b"") -> bytes:
    """Wire bytes of a delta, bypassing any check."""
    return msgspec.msgpack.encode([indices, bits, full])


# --------------------------------------------------------------------------- wire format


def test_encode_decode_round_trip():
    delta = sparse({0: 1, 65535: 0x80, 65536: 3, MAP_SIZE - 1: 0xFF})
    assert decode(encode(delta)) == delta
    full = Delta(full=whole({7: 2, MAP_SIZE - 1: 1}))
    assert decode(encode(full)) == full
    assert encode(EMPTY) == b"" and decode(b"") == EMPTY and not decode(b"")
    assert delta.entries == 4 and bool(delta) and bool(full)


@pytest.mark.parametrize("data, why", [
    (b"\xc1garbage", "not msgpack"),
    (msgspec.msgpack.encode(42), "not a delta"),
    (msgspec.msgpack.encode(["x", "y", "z"]), "strings, not bytes"),
    (raw(b"\x00\x00\x00", b"\x01"), "3 index bytes for 1 entry"),
    (raw(b"\x00" * 8, b"\x01"), "8 index bytes for 1 entry"),
    (raw(b"", b"\x01"), "no index for an entry"),
    (raw(array.array("I", [MAP_SIZE]).tobytes(), b"\x01"), "index == MAP_SIZE"),
    (raw(array.array("I", [3, 2**32 - 1]).tobytes(), b"\x01\x01"), "index far outside"),
    (raw(full=bytes(MAP_SIZE - 1)), "a whole map one byte short"),
    (raw(full=bytes(MAP_SIZE + 1)), "a whole map one byte long"),
    (raw(array.array("I", [1]).tobytes(), b"\x01", bytes(MAP_SIZE)), "full and sparse"),
])
def test_decode_refuses_malformed(data, why):
    with pytest.raises(MalformedDelta):
        decode(data)


def test_difference_and_apply():
    a = whole({0: 0b0011, 10: 0x80, 70000: 1})
    b = whole({0: 0b0110, 11: 4, 70000: 1, MAP_SIZE - 1: 2})
    delta = difference(a, b)
    assert as_dict(delta) == {0: 0b0100, 11: 4, MAP_SIZE - 1: 2}  # only what a lacks
    target = bytearray(a)
    apply(target, delta)
    assert bytes(target) == bytes(x | y for x, y in zip(a, b, strict=True))
    assert difference(b, b) == EMPTY and difference(b, a) == sparse({0: 1, 10: 0x80})
    # A whole map ORs in too, and applying twice changes nothing.
    target = bytearray(a)
    apply(target, Delta(full=b))
    apply(target, Delta(full=b))
    apply(target, delta)
    assert bytes(target) == bytes(x | y for x, y in zip(a, b, strict=True))


def test_read_map_refuses_other_sizes(tmp_path):
    path = tmp_path / "m"
    path.write_bytes(bytes(MAP_SIZE // 2))  # an AFL-sized map, not QSYM's
    with pytest.raises(MalformedDelta, match=str(MAP_SIZE)):
        read_map(path)


# --------------------------------------------------------------------------- worker side


def test_worker_map_receive_prepare_contribution(tmp_path):
    wmap = WorkerMap(tmp_path / "qsym.map")
    wmap.receive(encode(sparse({1: 1, 2: 2})))
    wmap.receive(encode(sparse({1: 4})))
    wmap.receive(b"")
    assert bytes(wmap.base) == whole({1: 5, 2: 2})  # ORed, not replaced
    wmap.receive(encode(Delta(full=whole({3: 8}))))
    assert bytes(wmap.base) == whole({1: 5, 2: 2, 3: 8})

    # The last run left bits in the file: prepare starts the next run from the base.
    wmap.path.write_bytes(whole({9: 9, 1: 0xFF}))
    wmap.prepare()
    assert wmap.path.read_bytes() == bytes(wmap.base)
    assert wmap.contribution() == b""  # a run that added nothing

    # QSYM adds bits (and keeps the base's).
    run = bytearray(wmap.path.read_bytes())
    run[1] |= 0x10
    run[500] = 7
    wmap.path.write_bytes(run)
    assert received(wmap.contribution()) == {1: 0x10, 500: 7}
    # The contribution is not folded into the base: a dropped RESULT must not prune its redo.
    assert bytes(wmap.base) == whole({1: 5, 2: 2, 3: 8})
    wmap.prepare()
    assert wmap.path.read_bytes() == whole({1: 5, 2: 2, 3: 8})


def test_worker_map_receive_refuses_malformed_and_keeps_base(tmp_path):
    wmap = WorkerMap(tmp_path / "qsym.map")
    wmap.receive(encode(sparse({4: 4})))
    with pytest.raises(MalformedDelta):
        wmap.receive(raw(array.array("I", [1, MAP_SIZE]).tobytes(), b"\x01\x01"))
    assert bytes(wmap.base) == whole({4: 4})  # checked before anything is applied


def test_worker_map_of_wrong_size_or_missing_contributes_nothing(tmp_path, caplog):
    wmap = WorkerMap(tmp_path / "qsym.map")
    assert wmap.contribution() == b""  # no file: the run never got that far
    wmap.prepare()
    wmap.path.write_bytes(b"\xff" * 65536)  # an older SymCC's AFL-sized map
    with caplog.at_level(logging.WARNING, logger="symcc_mpi.coverage.pruning"):
        assert wmap.contribution() == b""
    assert "not shared" in caplog.text
    wmap.path.write_bytes(b"")  # truncated by a killed run
    assert wmap.contribution() == b""


# --------------------------------------------------------------------------- master side


def test_off_mode_has_no_ledger():
    with pytest.raises(ValueError):
        PruningLedger(PruningMode.OFF)


def test_scopes_shared_and_local():
    shared = PruningLedger(PruningMode.SHARED)
    assert {shared.scope_of(r) for r in (1, 2, 3)} == {SHARED_SCOPE}
    local = PruningLedger(PruningMode.LOCAL)
    assert [local.scope_of(r) for r in (1, 2, 3)] == ["rank-1", "rank-2", "rank-3"]
    local.merge(1, sparse({5: 1}))
    # Rank 2's scope is its own: rank 1's bits never reach it.
    assert local.plan(2).payload == b""
    assert received(local.plan(1).payload) == {5: 1}
    assert set(local.maps()) >= {"rank-1"} and local.maps()["rank-1"] == whole({5: 1})
    shared.merge(1, sparse({5: 1}))
    assert received(shared.plan(2).payload) == {5: 1}
    assert list(shared.maps()) == [SHARED_SCOPE]


def test_merge_returns_new_entries_and_ignores_known_bits():
    ledger = PruningLedger(PruningMode.SHARED)
    assert not ledger.dirty
    assert ledger.merge(1, EMPTY) == 0 and not ledger.dirty
    assert ledger.merge(1, sparse({1: 0b01, 2: 0b10})) == 2 and ledger.dirty
    ledger.dirty = False
    assert ledger.merge(2, sparse({1: 0b01, 2: 0b10})) == 0  # known: no segment, not dirty
    assert not ledger.dirty
    assert ledger.merge(2, sparse({1: 0b11, 3: 1})) == 2  # index 1 gains one bit
    assert ledger.maps()[SHARED_SCOPE] == whole({1: 0b11, 2: 0b10, 3: 1})
    # Only the bits gained are logged: a worker that had the first segment gets the gains.
    assert received(ledger.plan(3).payload) == {1: 0b11, 2: 0b10, 3: 1}
    assert ledger.merge(1, Delta(full=whole({3: 1, 4: 4}))) == 1


def test_merge_of_an_index_named_twice_ors_both_and_counts_its_byte_once():
    ledger = PruningLedger(PruningMode.SHARED)
    twice = Delta(array.array("I", [5, 5, 6]).tobytes(), bytes([0b01, 0b10, 0b100]))
    assert ledger.merge(1, twice) == 3
    assert ledger.maps()[SHARED_SCOPE] == whole({5: 0b11, 6: 0b100})
    assert ledger.statistics().map_bytes_set == 2


def test_plan_changes_nothing_until_confirm():
    ledger = PruningLedger(PruningMode.SHARED)
    ledger.merge(1, sparse({10: 1}))
    first = ledger.plan(2)
    again = ledger.plan(2)
    assert first == again and received(first.payload) == {10: 1}
    assert ledger.statistics().shipped_bytes == 0
    ledger.confirm(first)
    assert ledger.plan(2).payload == b""
    stats = ledger.statistics()
    assert stats.shipped_bytes == len(first.payload) and stats.shipped_entries == 1


def test_unconfirmed_plan_ships_the_same_bits_again():
    ledger = PruningLedger(PruningMode.SHARED)
    ledger.merge(1, sparse({10: 1}))
    lost = ledger.plan(2)  # the send raised: no confirm
    ledger.merge(1, sparse({11: 2}))
    retry = ledger.plan(2)
    assert received(retry.payload) == {10: 1, 11: 2}
    assert received(lost.payload).items() <= received(retry.payload).items()
    ledger.confirm(retry)
    assert ledger.plan(2).payload == b""


def test_after_confirm_only_later_segments_ship_including_own_contribution():
    ledger = PruningLedger(PruningMode.SHARED)
    ledger.merge(1, sparse({1: 1}))
    ledger.confirm(ledger.plan(2))
    ledger.merge(2, sparse({2: 2}))  # rank 2's own committed run
    ledger.merge(3, sparse({3: 3, 1: 1}))
    shipment = ledger.plan(2)
    # By design a worker learns its own bits only once they are committed (they come back).
    assert received(shipment.payload) == {2: 2, 3: 3}
    assert not shipment.whole and shipment.entries == 2
    ledger.confirm(shipment)
    assert ledger.plan(2).payload == b""


def test_local_mode_ships_a_rank_its_own_committed_bits():
    ledger = PruningLedger(PruningMode.LOCAL)
    ledger.confirm(ledger.plan(1))  # nothing yet
    ledger.merge(1, sparse({7: 7}))
    assert received(ledger.plan(1).payload) == {7: 7}


def test_resumed_map_ships_whole_on_first_plan():
    saved = whole({1: 1, 65536 + 1: 2})
    ledger = PruningLedger(PruningMode.SHARED, {SHARED_SCOPE: saved})
    assert not ledger.dirty
    assert ledger.statistics().map_bytes_set == 2
    first = ledger.plan(1)
    assert first.whole and decode(first.payload).full == saved
    ledger.confirm(first)
    assert ledger.plan(1).payload == b""
    ledger.merge(2, sparse({5: 5}))
    assert received(ledger.plan(1).payload) == {5: 5}  # then only what came later
    second = ledger.plan(3)  # a rank that never got the saved bits still gets everything
    assert second.whole and received(second.payload) == {1: 1, 65537: 2, 5: 5}
    stats = ledger.statistics()
    assert stats.whole_maps_shipped == 1


def test_resumed_empty_map_is_not_shipped():
    ledger = PruningLedger(PruningMode.SHARED, {SHARED_SCOPE: bytes(MAP_SIZE)})
    assert ledger.plan(1).payload == b""


def test_log_cap_drops_oldest_segments_and_a_rank_behind_gets_the_whole_map():
    ledger = PruningLedger(PruningMode.SHARED)
    ledger.confirm(ledger.plan(3))
    big = _LOG_CAP * 2 // 3
    ledger.merge(1, sparse(dict.fromkeys(range(big), 1)))  # segment 1
    ledger.confirm(ledger.plan(2))  # rank 2 holds segment 1
    ledger.merge(1, sparse(dict.fromkeys(range(big, 2 * big), 1)))  # segment 2: over the cap
    assert ledger.statistics().new_entries == 2 * big > _LOG_CAP

    behind = ledger.plan(3)  # segment 1 is gone from the log
    assert behind.whole
    assert decode(behind.payload).full == whole(dict.fromkeys(range(2 * big), 1))
    recent = ledger.plan(2)
    assert not recent.whole and recent.entries == big
    assert received(recent.payload) == dict.fromkeys(range(big, 2 * big), 1)
    # The payload is bounded by about a whole map either way.
    assert len(recent.payload) <= MAP_SIZE + 64


def test_one_contribution_beyond_the_cap_ships_whole():
    ledger = PruningLedger(PruningMode.SHARED)
    ledger.merge(1, sparse(dict.fromkeys(range(_LOG_CAP + 1), 3)))
    shipment = ledger.plan(1)
    assert shipment.whole and received(shipment.payload) == dict.fromkeys(range(_LOG_CAP + 1), 3)
    ledger.confirm(shipment)
    assert ledger.plan(1).payload == b""
    ledger.merge(2, sparse({MAP_SIZE - 1: 1}))
    assert received(ledger.plan(1).payload) == {MAP_SIZE - 1: 1}


def test_forget_ships_the_whole_map_next():
    ledger = PruningLedger(PruningMode.SHARED)
    ledger.merge(1, sparse({1: 1}))
    ledger.confirm(ledger.plan(2))
    ledger.merge(1, sparse({2: 2}))
    ledger.confirm(ledger.plan(2))
    ledger.forget(2)
    ledger.forget(9)  # never seen: harmless
    shipment = ledger.plan(2)
    assert received(shipment.payload) == {1: 1, 2: 2}  # everything, from the start
    ledger.confirm(shipment)
    assert ledger.plan(2).payload == b""


def test_statistics_counters():
    ledger = PruningLedger(PruningMode.LOCAL)
    ledger.merge(1, sparse({1: 1, 2: 2}))
    ledger.merge(1, sparse({1: 1}))  # nothing new, still a merged contribution
    ledger.merge(2, sparse({1: 1}))
    ledger.merge(2, EMPTY)  # not counted
    a = ledger.plan(1)
    ledger.confirm(a)
    b = ledger.plan(2)
    ledger.confirm(b)
    ledger.plan(2)  # planned, never confirmed: not shipped
    stats = ledger.statistics()
    assert stats.mode == "local" and stats.scopes == 2
    assert stats.map_bytes_set == 3 and stats.merged == 3 and stats.new_entries == 3
    assert stats.shipped_bytes == len(a.payload) + len(b.payload)
    assert stats.shipped_entries == 3 and stats.whole_maps_shipped == 0


# --------------------------------------------------------------------------- on disk


def test_save_and_load_maps_round_trip(tmp_path):
    assert load_maps(tmp_path / "absent") == {}
    ledger = PruningLedger(PruningMode.LOCAL)
    ledger.merge(1, sparse({1: 1}))
    ledger.merge(2, sparse({MAP_SIZE - 1: 0x80}))
    save_maps(tmp_path / "pruning", ledger.maps())
    loaded = load_maps(tmp_path / "pruning")
    assert loaded == ledger.maps()
    resumed = PruningLedger(PruningMode.LOCAL, loaded)
    assert resumed.maps() == ledger.maps()
    assert received(resumed.plan(2).payload) == {MAP_SIZE - 1: 0x80}


def test_load_maps_refuses_a_file_of_the_wrong_size(tmp_path):
    save_maps(tmp_path, {SHARED_SCOPE: whole({1: 1})})
    (tmp_path / f"{SHARED_SCOPE}.map").write_bytes(b"\x01" * 1000)
    with pytest.raises(MalformedDelta, match="shared.map"):
        load_maps(tmp_path)


# --------------------------------------------------------------------------- another master's map


def test_another_masters_shared_map_is_absorbed_and_shipped_to_the_workers():
    ledger = PruningLedger(PruningMode.SHARED)
    ledger.merge(1, sparse({5: 0x01}))
    ledger.confirm(ledger.plan(1))  # worker 1 has everything so far
    assert ledger.absorb(whole({5: 0x01, 7: 0x10})) == 1
    assert received(ledger.plan(1).payload) == {7: 0x10}  # only what it lacked
    assert ledger.shared_map() == whole({5: 0x01, 7: 0x10})
    assert ledger.dirty
    assert ledger.absorb(whole({7: 0x10})) == 0  # nothing new


def test_a_local_ledger_absorbs_nothing_and_a_map_of_another_size_is_refused():
    local = PruningLedger(PruningMode.LOCAL)
    local.merge(1, sparse({5: 0x01}))
    assert local.shared_map() is None
    assert local.absorb(whole({9: 0x01})) == 0
    with pytest.raises(MalformedDelta, match="a QSYM map has"):
        PruningLedger(PruningMode.SHARED).absorb(b"\x01" * 10)
