"""Publication hints: torn lines, garbage, logs appearing late, offsets kept, O(new) reads."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from symcc_mpi.federation.hints import HintReader, PublicationLog, log_path

D = [hashlib.sha256(f"child-{i}".encode()).hexdigest() for i in range(10)]


def test_each_master_reads_the_others_not_itself(tmp_path):
    logs = [PublicationLog(tmp_path, k) for k in range(3)]
    readers = [HintReader(tmp_path, [p for p in range(3) if p != k]) for k in range(3)]
    logs[0].append(D[:2])
    logs[2].append([D[2]])
    assert readers[0].poll() == [D[2]]
    assert readers[1].poll() == [*D[:2], D[2]]
    assert readers[1].poll() == []  # offsets kept: nothing is read twice
    logs[0].append([D[3]])
    assert readers[1].poll() == [D[3]] and readers[2].poll() == [*D[:2], D[3]]


def test_a_log_that_appears_late_is_read_from_its_start(tmp_path):
    reader = HintReader(tmp_path, [1])
    assert reader.poll() == []  # not even the published/ directory exists yet
    PublicationLog(tmp_path, 1).append(D[:3])
    assert reader.poll() == D[:3]


def test_a_torn_last_line_waits_for_its_newline(tmp_path):
    path = log_path(tmp_path, 1)
    path.parent.mkdir(parents=True)
    reader = HintReader(tmp_path, [1])
    path.write_text(D[0] + "\n" + D[1][:20])
    assert reader.poll() == [D[0]]
    with open(path, "a") as handle:
        handle.write(D[1][20:])
    assert reader.poll() == []  # 64 characters but still no newline: maybe more is coming
    with open(path, "a") as handle:
        handle.write("\n")
    assert reader.poll() == [D[1]]
    assert reader.statistics().rejected == 0 and reader.statistics().hints == 2


def test_garbage_lines_are_counted_and_skipped(tmp_path):
    path = log_path(tmp_path, 1)
    path.parent.mkdir(parents=True)
    reader = HintReader(tmp_path, [1])
    torn_then_appended = D[1][:30] + D[2]  # a writer killed mid-line, then the next append
    path.write_text("\n".join([D[0], "hello", D[0].upper(), "", torn_then_appended, D[3]]) + "\n")
    assert reader.poll() == [D[0], D[3]]
    assert reader.statistics().rejected == 4


def test_an_overlong_line_without_newline_is_skipped_once_counted(tmp_path):
    path = log_path(tmp_path, 1)
    path.parent.mkdir(parents=True)
    reader = HintReader(tmp_path, [1])
    path.write_bytes(b"x" * 100)
    assert reader.poll() == []
    with open(path, "ab") as handle:
        handle.write(b"y" * 100)
    assert reader.poll() == []
    with open(path, "ab") as handle:
        handle.write(b"z\n" + D[0].encode() + b"\n")
    assert reader.poll() == [D[0]]
    stats = reader.statistics()
    assert stats.rejected == 1 and stats.bytes_read == 202 + 65


def test_reads_only_new_bytes(tmp_path):
    log, reader = PublicationLog(tmp_path, 1), HintReader(tmp_path, [1])
    for i in range(10):
        log.append([D[i]])
        assert reader.poll() == [D[i]]
        assert reader.statistics().bytes_read == 65 * (i + 1)


def test_append_refuses_what_is_not_a_digest(tmp_path):
    log = PublicationLog(tmp_path, 0)
    for bad in ("abc", D[0].upper(), D[0] + "\n"):
        with pytest.raises(ValueError):
            log.append([D[1], bad])
    log.append([])
    assert not log.path.exists()  # nothing half-written, not even an empty log


@settings(max_examples=150, deadline=None)
@given(lines=st.lists(st.one_of(st.sampled_from(D), st.text("0123456789abcdefXY ", max_size=70)),
                      max_size=12),
       cuts=st.lists(st.integers(0, 12 * 71), max_size=8))
def test_any_split_of_the_writes_reads_the_valid_lines_in_order(tmp_path_factory, lines, cuts):
    directory = tmp_path_factory.mktemp("hints")
    path = log_path(directory, 1)
    path.parent.mkdir(parents=True)
    data = "".join(line + "\n" for line in lines).encode()
    reader = HintReader(directory, [1])
    got = []
    start = 0
    for cut in sorted({min(c, len(data)) for c in cuts} | {len(data)}):
        with open(path, "ab") as handle:
            handle.write(data[start:cut])
        start = cut
        got += reader.poll()
    valid = [line for line in lines if line in D]
    assert got == valid
    assert reader.statistics().rejected == len(lines) - len(valid)
