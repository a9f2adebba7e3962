"""Tests of coverage triage: edge summaries, the AFL build's check, the master's coverage map
(the probe that measures coverage: test_forkserver.py)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from symcc_mpi.coverage import triage
from symcc_mpi.coverage.edges import (
    BUCKET_BITS,
    AflTargetError,
    FileCoverage,
    Novelty,
    Status,
    bucket_bit,
    check_afl_target,
    pack_u32,
)
from symcc_mpi.coverage.triage import CoverageMap

HAVE_AFL = shutil.which("afl-clang-fast") is not None and shutil.which("afl-showmap") is not None
needs_afl = pytest.mark.skipif(
    not HAVE_AFL, reason="afl-clang-fast / afl-showmap not installed (Debian package afl++)"
)

# Crashes on "CRASH", aborts on "ABRT", spins forever on "HANG"; the loop over the input
# makes one edge's hit count follow the number of 'a' bytes.
TARGET_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
  char buf[512];
  FILE *f = argc > 1 ? fopen(argv[1], "rb") : stdin;
  if (!f) return 1;
  size_t n = fread(buf, 1, sizeof buf, f);
  int as = 0;
  for (size_t i = 0; i < n; i++)
    if (buf[i] == 'a') as++;
  if (n >= 5 && memcmp(buf, "CRASH", 5) == 0) { volatile int *p = 0; *p = 1; }
  if (n >= 4 && memcmp(buf, "ABRT", 4) == 0) abort();
  if (n >= 4 && memcmp(buf, "HANG", 4) == 0) { for (;;) {} }
  if (n > 0 && buf[0] == 'x') puts("x");
  if (as > 3) puts("many");
  return 0;
}
"""


# --------------------------------------------------------------------------- pure parts


def test_bucket_bits_follow_afl_classes():
    expected = {0: 0, 1: 1, 2: 2, 3: 4, 4: 8, 7: 8, 8: 16, 15: 16, 16: 32, 31: 32}
    expected |= {32: 64, 127: 64, 128: 128, 255: 128, 10_000: 128}
    assert {hits: bucket_bit(hits) for hits in expected} == expected
    assert BUCKET_BITS == (1, 2, 4, 8, 16, 32, 64, 128)


def test_file_coverage_is_compact_and_round_trips():
    cov = FileCoverage.from_pairs([(3, 1), (70_000, 16), (12, 128)], Status.CRASH, map_size=1 << 17)
    wire = msgspec.msgpack.encode(cov)
    back = msgspec.msgpack.decode(wire, type=FileCoverage)
    assert back == cov and back.status is Status.CRASH
    assert back.pairs() == [(3, 1), (12, 128), (70_000, 16)]
    assert len(wire) < 5 * len(cov.buckets) + 24


@pytest.mark.parametrize(
    "cov",
    [
        FileCoverage(Status.OK, b"\x01\x00\x00", b"\x01"),
        FileCoverage(Status.OK, b"\x01\x00\x00\x00", b"\x03"),
        FileCoverage(Status.OK, b"", b"", map_size=-1),
        FileCoverage(Status.OK, pack_u32([7, 3]), b"\x01\x01"),  # not ascending
        FileCoverage(Status.OK, pack_u32([3, 3]), b"\x01\x02"),  # an index twice
    ],
)
def test_malformed_summaries_are_rejected(cov):
    with pytest.raises(ValueError):
        cov.validate()
    with pytest.raises(ValueError):
        CoverageMap().merge(cov)


def ok(*pairs: tuple[int, int], map_size: int = 0) -> FileCoverage:
    return FileCoverage.from_pairs(pairs, Status.OK, map_size)


def test_merge_new_edge_then_new_count_then_nothing():
    cmap = CoverageMap(64)
    assert cmap.merge_novelty(ok((1, 1), (5, 2))) is Novelty.NEW_EDGE
    assert cmap.merge_novelty(ok((1, 1), (5, 2))) is Novelty.NONE
    assert cmap.merge_novelty(ok((1, 1), (5, 8))) is Novelty.NEW_COUNT
    assert cmap.merge_novelty(ok((1, 1), (5, 2))) is Novelty.NONE
    assert cmap.merge_novelty(ok((5, 8))) is Novelty.NONE
    assert cmap.merge(ok((5, 8), (9, 1))) is True
    stats = cmap.statistics()
    assert (stats.edges_covered, stats.merged, stats.interesting) == (3, 6, 3)
    assert stats.new_edge_finds == 2 and stats.duplicate_summaries == 2
    assert cmap.bitmap_cvg == pytest.approx(100 * 3 / 64)


def test_merge_grows_past_declared_map_and_bounds_indices():
    cmap = CoverageMap()
    assert cmap.merge(ok((100_000, 1)))
    assert cmap.map_size == 100_001 and cmap.edges_covered == 1
    assert cmap.merge(ok((2, 1), map_size=200_000)) and cmap.map_size == 200_000
    with pytest.raises(ValueError):
        cmap.merge(ok((1 << 28, 1)))
    assert not cmap.merge(ok())  # an empty trace adds nothing


def test_crashes_and_hangs_use_their_own_maps():
    cmap = CoverageMap(16)
    crash = FileCoverage.from_pairs([(1, 1), (2, 1)], Status.CRASH)
    assert cmap.merge_novelty(crash) is Novelty.NEW_EDGE  # the first crash is unique
    assert cmap.merge_novelty(crash) is Novelty.NONE
    # Hit counts do not matter for crashes (AFL simplifies their traces).
    assert not cmap.merge(FileCoverage.from_pairs([(1, 128), (2, 4)], Status.CRASH))
    # Missing an edge that every earlier crash hit is new, as in AFL.
    assert cmap.merge_novelty(FileCoverage.from_pairs([(1, 1)], Status.CRASH)) is Novelty.NEW_COUNT
    assert not cmap.merge(FileCoverage.from_pairs([(1, 1)], Status.CRASH))
    assert cmap.merge_novelty(FileCoverage.from_pairs([(3, 1)], Status.CRASH)) is Novelty.NEW_EDGE
    assert cmap.merge(FileCoverage.from_pairs([(1, 1)], Status.HANG))
    stats = cmap.statistics()
    assert (stats.crash_runs, stats.unique_crashes, stats.hang_runs, stats.unique_hangs) == (
        6,
        3,
        1,
        1,
    )
    assert stats.edges_covered == 0  # faults never feed the queue's map
    assert cmap.merge(ok((1, 1)))


def test_status_may_arrive_as_a_plain_string():
    cmap, cov = CoverageMap(), ok((4, 1))
    assert cmap.merge(FileCoverage("crash", cov.edges, cov.buckets))  # type: ignore[arg-type]
    assert cmap.statistics().crash_runs == 1
    assert [s.value for s in Status] == ["ok", "crash", "hang"]


def test_packed_summaries_for_the_protocol():
    cov = FileCoverage.from_pairs([(9, 2), (1, 1)], Status.HANG, map_size=64)
    assert FileCoverage.unpack(cov.pack()) == cov
    cmap = CoverageMap()
    assert cmap.merge(FileCoverage.unpack(ok((1, 1)).pack()))
    assert not cmap.merge(FileCoverage.unpack(ok((1, 1)).pack()))
    assert cmap.merge(FileCoverage.unpack(cov.pack())) and cmap.statistics().unique_hangs == 1
    bad = msgspec.msgpack.encode(["ok", b"\x01\x00\x00\x00", b"\x05", 0])
    for data in (b"", b"\xc1", msgspec.msgpack.encode(["weird", b"", b"", 0]), bad):
        with pytest.raises(ValueError):
            FileCoverage.unpack(data)


def test_duplicate_cache_is_bounded_and_only_a_cache():
    cmap = CoverageMap(dedup_capacity=2)
    for i in range(5):
        assert cmap.merge(ok((i, 1)))
    for i in range(5):
        assert not cmap.merge(ok((i, 1)))
    assert cmap.statistics().interesting == 5


def test_map_state_round_trips():
    cmap = CoverageMap(32)
    cmap.merge(ok((1, 1), (4, 16)))
    cmap.merge(FileCoverage.from_pairs([(2, 1), (3, 1)], Status.CRASH))
    cmap.merge(FileCoverage.from_pairs([(9, 1)], Status.HANG))
    back = CoverageMap.from_bytes(cmap.to_bytes())
    assert back.statistics() == cmap.statistics()
    assert not back.merge(ok((1, 1), (4, 16)))
    assert not back.merge(FileCoverage.from_pairs([(2, 1), (3, 1)], Status.CRASH))
    assert back.merge(ok((4, 32)))
    with pytest.raises((ValueError, msgspec.DecodeError)):
        CoverageMap.from_bytes(b"\x93\x02\x00")


class _ReferenceVirgin:
    """AFL's has_new_bits on a dense virgin map, written plainly, as the oracle."""

    def __init__(self) -> None:
        self.virgin: dict[int, int] = {}

    def merge(self, pairs: list[tuple[int, int]]) -> Novelty:
        result = Novelty.NONE
        for index, bit in pairs:
            v = self.virgin.get(index, 0xFF)
            if bit & v:
                result = max(result, Novelty.NEW_EDGE if v == 0xFF else Novelty.NEW_COUNT)
                self.virgin[index] = v & ~bit
        return result


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.dictionaries(st.integers(0, 40), st.sampled_from(BUCKET_BITS), max_size=12),
        max_size=30,
    )
)
def test_merge_matches_afl_has_new_bits(traces):
    cmap, ref = CoverageMap(8), _ReferenceVirgin()
    for trace in traces:
        pairs = sorted(trace.items())
        assert cmap.merge_novelty(ok(*pairs)) is ref.merge(pairs)
    assert cmap.edges_covered == len(ref.virgin)


_TRACES = st.lists(
    st.dictionaries(st.integers(0, 40), st.sampled_from(BUCKET_BITS), max_size=12),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(_TRACES, _TRACES)
def test_assessing_several_summaries_at_once_agrees_with_each_alone(merged, assessed):
    """`assess` against `adds_coverage` and a plain count of the interesting runs that hit
    each edge (rarity), on maps grown by what was merged (indices past them included)."""
    cmap, hits = CoverageMap(8), {}
    for trace in merged:
        cov = ok(*sorted(trace.items()))
        if cmap.merge(cov):
            for index in trace:
                hits[index] = hits.get(index, 0) + 1
    covs = [ok(*sorted(trace.items())) for trace in assessed]
    expected = [(cmap.adds_coverage(cov), min((hits.get(i, 0) for i in trace), default=0))
                for cov, trace in zip(covs, assessed, strict=True)]
    assert cmap.assess(covs) == expected


_SUMMARY = st.builds(
    FileCoverage,
    st.sampled_from(Status),
    st.lists(st.integers(0, (1 << 28) + 3), max_size=6).map(pack_u32),
    st.lists(st.sampled_from((*BUCKET_BITS, 3)), max_size=6).map(bytes),
    st.sampled_from((0, 64, -1)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_SUMMARY, st.dictionaries(
    st.integers(0, 100), st.sampled_from(BUCKET_BITS), max_size=8).map(
    lambda trace: ok(*sorted(trace.items())))), max_size=5))
def test_unpacking_several_summaries_at_once_agrees_with_each_alone(covs):
    blobs = [cov.pack() for cov in covs]
    valid = True
    for cov in covs:
        try:
            cov.validate()
        except ValueError:
            valid = False
    if valid:
        assert FileCoverage.unpack_many(blobs) == [FileCoverage.unpack(b) for b in blobs]
    else:
        with pytest.raises(ValueError):
            FileCoverage.unpack_many(blobs)


def test_an_empty_afl_target_is_refused():
    with pytest.raises(AflTargetError, match="empty"):
        check_afl_target([])


# --------------------------------------------------------------------------- with AFL++


@pytest.fixture(scope="module")
def afl_target(tmp_path_factory) -> Path:
    if not HAVE_AFL:
        pytest.skip("afl-clang-fast / afl-showmap not installed (Debian package afl++)")
    build = tmp_path_factory.mktemp("afl-target")
    (build / "target.c").write_text(TARGET_C)
    subprocess.run(
        ["afl-clang-fast", "-O0", "-o", str(build / "target"), str(build / "target.c")],
        check=True,
        capture_output=True,
        env={**os.environ, "AFL_QUIET": "1"},
    )
    return build / "target"


@pytest.fixture()
def inputs(tmp_path) -> dict[str, Path]:
    contents = {
        "plain": b"hello",
        "xs": b"xaaaaaaaaa",
        "crash": b"CRASH",
        "abort": b"ABRT",
        "hang": b"HANG",
        "empty": b"",
        "two_as": b"aa",
    }
    (tmp_path / "inputs").mkdir()
    paths = {}
    for name, data in contents.items():
        paths[name] = tmp_path / "inputs" / name
        paths[name].write_bytes(data)
    return paths


EXPECTED = {
    "plain": Status.OK,
    "xs": Status.OK,
    "crash": Status.CRASH,
    "abort": Status.CRASH,
    "hang": Status.HANG,
    "empty": Status.OK,
    "two_as": Status.OK,
}


@needs_afl
def test_check_afl_target(afl_target, tmp_path):
    assert check_afl_target([str(afl_target), "@@"]) == afl_target
    plain = tmp_path / "plain"
    subprocess.run(["cc", "-x", "c", "-o", str(plain), "-"], input=TARGET_C.encode(), check=True)
    with pytest.raises(AflTargetError, match="not AFL-instrumented"):
        check_afl_target([str(plain)])
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(AflTargetError, match="not an ELF"):
        check_afl_target([str(script)])
    with pytest.raises(AflTargetError, match="not found"):
        check_afl_target([str(tmp_path / "missing")])
    with pytest.raises(AflTargetError, match="not an executable"):
        check_afl_target([str(tmp_path)])




# --------------------------------------------------------------------------- another master's map


def normal(edges: dict[int, int]) -> FileCoverage:
    """A normal run's summary hitting `edges` ({index: hit-count class bit})."""
    indices = sorted(edges)
    return FileCoverage(Status.OK, pack_u32(indices), bytes(edges[i] for i in indices))


def test_a_child_another_master_covered_adds_nothing_after_its_map_is_absorbed():
    theirs, mine = CoverageMap(), CoverageMap()
    assert theirs.merge(normal({3: 1, 9: 2}))
    child = normal({3: 1, 9: 2})
    assert mine.adds_coverage(child)
    assert mine.absorb(theirs.seen_bytes())
    assert not mine.adds_coverage(child)
    assert mine.adds_coverage(normal({3: 1, 9: 4}))  # a hit-count class they never had
    assert mine.edges_covered == 2
    assert mine.statistics().interesting == 0  # their finds, not this map's
    assert not mine.absorb(theirs.seen_bytes())  # nothing new the second time


def test_absorbing_a_larger_map_grows_this_one(monkeypatch):
    small, large = CoverageMap(), CoverageMap()
    small.merge(normal({1: 1}))
    large.merge(normal({70000: 1}))
    assert small.absorb(large.seen_bytes())
    assert small.edges_covered == 2
    assert not small.adds_coverage(normal({1: 1, 70000: 1}))
    monkeypatch.setattr(triage, "MAX_MAP_SIZE", 1 << 17)  # not 256 MB of test data
    with pytest.raises(ValueError, match="larger than any"):
        small.absorb(bytes((1 << 17) + 1))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.dictionaries(st.integers(0, 300), st.sampled_from(BUCKET_BITS),
                                min_size=1, max_size=8), min_size=1, max_size=6),
       st.lists(st.dictionaries(st.integers(0, 300), st.sampled_from(BUCKET_BITS),
                                min_size=1, max_size=8), min_size=1, max_size=6))
def test_absorbing_is_a_union_in_either_order(runs_a, runs_b):
    """Two masters that absorb each other's maps, in either order and any number of times,
    hold the union: the bits of a map that merged every run."""
    a, b, union = CoverageMap(), CoverageMap(), CoverageMap()
    for edges in runs_a:
        a.merge(normal(edges))
    for edges in runs_b:
        b.merge(normal(edges))
    for edges in runs_a + runs_b:
        union.merge(normal(edges))
    a_seen, b_seen = a.seen_bytes(), b.seen_bytes()
    a.absorb(b_seen)
    b.absorb(a_seen)
    b.absorb(a_seen)
    for merged in (a, b):
        width = max(len(merged.seen_bytes()), len(union.seen_bytes()))
        assert merged.seen_bytes().ljust(width, b"\0") == union.seen_bytes().ljust(width, b"\0")
        assert merged.edges_covered == union.edges_covered
