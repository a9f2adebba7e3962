"""LineLog and DeferredWorkJournal: the line codec, replay, write faults, damage and repair."""

from __future__ import annotations

import errno
import os
import stat
import zlib

import pytest

from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.durable.clock import ManualClock
from symcc_mpi.durable.deferred import DEFERRED_JOURNAL_NAME, Deferral, DeferredWorkJournal
from symcc_mpi.durable.journal import Damage, DamageKind, JournalBroken, LineLog
from symcc_mpi.durable.lines import LineError, decode_line, encode_line, write_all


class FailingWriter:
    """Fails the next `failures` writes, after writing `partial` bytes of each."""

    def __init__(self) -> None:
        self.failures = 0
        self.partial = 0

    def __call__(self, fd: int, data: bytes) -> None:
        if self.failures:
            self.failures -= 1
            if self.partial:
                os.write(fd, data[: self.partial])
            raise OSError(errno.EIO, "injected write failure")
        write_all(fd, data)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def work(record: dict) -> None:
    """The replay rule of these tests: a record applies if it names its work."""
    if not isinstance(record.get("work"), str):
        raise ValueError("no work named")


def open_log(path, clock, **options) -> tuple[LineLog, list[str], tuple[Damage, ...]]:
    """Load (with repair) and open for appending, as an owner does: the log, the works
    replayed and the damage found."""
    log = LineLog(path, clock=clock, fsync=False, **options)
    works: list[str] = []
    found = log.load(lambda record: (work(record), works.append(record["work"])))
    log.open_for_append()
    return log, works, found


# -- line codec -------------------------------------------------------------------------------


def test_line_round_trip_and_checksum():
    line = encode_line({"b": 1, "a": "é\n"})
    assert line.endswith(b"\n") and line.count(b"\n") == 1 and line.isascii()
    assert decode_line(line[:-1]) == {"a": "é\n", "b": 1}
    flipped = bytearray(line[:-1])
    flipped[-3] ^= 1
    for bad in (bytes(flipped), line[:-5], b"", b"zzzzzzzz {}", b"00000000{}"):
        with pytest.raises(LineError):
            decode_line(bad)


@pytest.mark.parametrize("spelling", [str.upper, lambda h: "0x" + h[2:], lambda h: " " + h[1:],
                                      lambda h: "+" + h[1:]])
def test_a_checksum_spelled_otherwise_is_damage(spelling):
    """Found by hypothesis in CI: "02d41ee8" with one byte flipped to "02d41Ee8" still parsed
    to the right checksum. So do these other flips of a checksum starting "00"."""
    payload = next(p for n in range(100_000)
                   if (p := b'{"n":%d}' % n) and zlib.crc32(p) < 1 << 24
                   and any(c in "abcdef" for c in f"{zlib.crc32(p):08x}"))
    crc = f"{zlib.crc32(payload):08x}"
    assert int(spelling(crc), 16) == zlib.crc32(payload) and spelling(crc) != crc
    with pytest.raises(LineError, match="8 lowercase hex"):
        decode_line(spelling(crc).encode() + b" " + payload)


# -- LineLog ------------------------------------------------------------------------------


@pytest.mark.parametrize("partial", [0, 7, 30])
def test_append_failure_leaves_the_file_unchanged(tmp_path, clock, partial):
    path = tmp_path / "w.jsonl"
    writer = FailingWriter()
    log, _, _ = open_log(path, clock, writer=writer)
    log.append({"work": "a"})
    before_bytes = path.read_bytes()
    writer.failures, writer.partial = 1, partial
    with pytest.raises(OSError) as failure:
        log.append({"work": "b"})
    assert failure.value.filename == str(path)  # the one-line error names the file
    assert path.read_bytes() == before_bytes  # the torn fragment was cut back off
    assert (log.lines, log.size) == (1, len(before_bytes))
    log.append({"work": "b"})  # and the next append lands on a clean line
    log.close()
    again, works, found = open_log(path, clock)
    assert found == () and works == ["a", "b"]


def test_cut_back_failure_breaks_the_journal(tmp_path, clock, monkeypatch):
    writer = FailingWriter()
    log, _, _ = open_log(tmp_path / "w.jsonl", clock, writer=writer)
    writer.failures, writer.partial = 1, 5

    def failing_ftruncate(fd, size):
        raise OSError(errno.EIO, "injected")

    with monkeypatch.context() as patch:
        patch.setattr(os, "ftruncate", failing_ftruncate)
        with pytest.raises(OSError):
            log.append({"work": "a"})
    assert log.broken is not None
    with pytest.raises(JournalBroken):
        log.append({"work": "b"})
    log.close()
    # Reopening quarantines the torn fragment and works again.
    again, works, found = open_log(tmp_path / "w.jsonl", clock)
    assert [d.kind for d in found] == [DamageKind.TORN_TAIL] and works == []
    again.append({"work": "b"})


def test_torn_last_line_is_truncated_and_quarantined(tmp_path, clock):
    path = tmp_path / "w.jsonl"
    log, _, _ = open_log(path, clock)
    log.extend([{"work": "a"}, {"work": "b"}])
    log.close()
    good = path.read_bytes()
    torn = encode_line({"work": "c", "at": 1.0})[:-9]
    path.write_bytes(good + torn)
    again, works, found = open_log(path, clock)
    (damage,) = found
    assert damage.kind is DamageKind.TORN_TAIL
    assert damage.path == path and damage.line == 3
    assert damage.kept_at.read_bytes() == torn
    assert str(path) in str(damage) and ":3:" in str(damage)
    assert path.read_bytes() == good
    assert works == ["a", "b"]


def test_complete_line_without_newline_is_a_torn_append(tmp_path, clock):
    path = tmp_path / "w.jsonl"
    whole = encode_line({"work": "a"})
    path.write_bytes(whole[:-1])
    again, works, found = open_log(path, clock)
    assert [d.kind for d in found] == [DamageKind.TORN_TAIL]
    assert works == []
    again.append({"work": "b"})
    again.close()
    assert open_log(path, clock)[2] == ()


@pytest.mark.parametrize("bad", [
    b"this is not a record\n",
    b"\xff\xfe\x00binary\n",
    b"00000000 {\"work\":\"a\"}\n",  # wrong checksum
    encode_line({"explode": True}),  # checksummed, does not apply
    encode_line({"work": 5}),  # checksummed, does not apply
])
def test_corrupt_middle_line_is_quarantined_others_kept(tmp_path, clock, bad):
    path = tmp_path / "w.jsonl"
    log, _, _ = open_log(path, clock)
    log.extend([{"work": "a"}, {"work": "b"}, {"work": "c"}])
    log.close()
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join([lines[0], bad, *lines[1:]]))
    again, works, found = open_log(path, clock)
    (damage,) = found
    assert damage.kind is DamageKind.CORRUPT_LINE
    assert (damage.path, damage.line) == (path, 2)
    assert damage.kept_at.read_bytes() == bad  # never silently dropped
    assert works == ["a", "b", "c"]
    again.close()
    _, works, found = open_log(path, clock)  # the live file was repaired: no repeat report
    assert found == () and works == ["a", "b", "c"]


def test_interrupted_repair_temporary_is_swept(tmp_path, clock):
    path = tmp_path / "w.jsonl"
    log, _, _ = open_log(path, clock)
    log.append({"work": "a"})
    log.close()
    leftover = tmp_path / f".tmp-{path.name}.12345"
    leftover.write_bytes(b"half a repair")
    again, works, found = open_log(path, clock)
    assert not leftover.exists() and works == ["a"]


# -- DeferredWorkJournal ------------------------------------------------------------------------


def test_defer_persists_and_repeats(tmp_path, clock):
    # Where the master keeps it (job/assembly.py): its state directory, beside done.jsonl.
    campaign = CampaignDir(tmp_path)
    d = DeferredWorkJournal(campaign.state / DEFERRED_JOURNAL_NAME, clock=clock, fsync=False,
                            quarantine_dir=campaign.quarantine)
    assert d.path.name == DEFERRED_JOURNAL_NAME
    assert d.defer("w1", source="watchdog-timeout", attempts=3,
                   payload={"seed": "abc"}) is Deferral.PERSISTED
    assert d.defer("w1", source="watchdog-timeout", attempts=3) is Deferral.PERSISTED
    assert len(d.path.read_bytes().splitlines()) == 1
    d.close()
    again = DeferredWorkJournal(d.path, clock=clock, fsync=False)
    assert again.deferred()["w1"].payload == {"seed": "abc"}
    assert again.is_persisted("w1")


def test_defer_write_failure_falls_back_to_memory_and_is_reported(tmp_path, clock):
    writer = FailingWriter()
    path = tmp_path / DEFERRED_JOURNAL_NAME
    d = DeferredWorkJournal(path, clock=clock, fsync=False, writer=writer)
    writer.failures, writer.partial = 2, 11
    assert d.defer("w1", source="invalid-result", attempts=2) is Deferral.MEMORY_ONLY
    assert "w1" in d.deferred() and not d.is_persisted("w1")
    stats = d.statistics()
    assert (stats.memory_only, stats.persisted, stats.write_failures) == (1, 0, 1)
    assert str(path) in stats.last_error
    assert path.read_bytes() == b""  # never reported as persisted, and nothing torn left
    assert d.retry() == 1  # the second injected failure
    assert d.retry() == 0
    assert d.is_persisted("w1")
    d.close()
    assert DeferredWorkJournal(path, fsync=False).is_persisted("w1")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_unwritable_directory_defers_in_memory(tmp_path, clock):
    directory = tmp_path / "ro"
    directory.mkdir()
    directory.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        d = DeferredWorkJournal(directory / DEFERRED_JOURNAL_NAME, clock=clock, fsync=False)
        assert d.defer("w1", source="x", attempts=1) is Deferral.MEMORY_ONLY
        assert d.statistics().write_failures >= 1
    finally:
        directory.chmod(stat.S_IRWXU)


def test_missing_directory_defers_in_memory_then_persists(tmp_path, clock, monkeypatch):
    path = tmp_path / DEFERRED_JOURNAL_NAME
    real_open = os.open
    calls = {"n": 0}

    def flaky_open(file, flags, *args):
        if str(file) == str(path) and calls["n"] == 0:
            calls["n"] += 1
            raise OSError(errno.EACCES, "injected")
        return real_open(file, flags, *args)

    monkeypatch.setattr(os, "open", flaky_open)
    d = DeferredWorkJournal(path, clock=clock, fsync=False)
    assert d.statistics().write_failures == 1  # could not open for appending
    assert d.defer("w1", source="x", attempts=1) is Deferral.PERSISTED  # reopened on demand


def test_deferred_journal_quarantines_damage(tmp_path, clock):
    path = tmp_path / DEFERRED_JOURNAL_NAME
    d = DeferredWorkJournal(path, clock=clock, fsync=False)
    d.defer("w1", source="x", attempts=1)
    d.defer("w2", source="x", attempts=1)
    d.close()
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"garbage\n" + lines[1] + b"0123")
    again = DeferredWorkJournal(path, clock=clock, fsync=False)
    assert [(x.line, x.kind) for x in again.damage] == [
        (2, DamageKind.CORRUPT_LINE), (4, DamageKind.TORN_TAIL)]
    assert set(again.deferred()) == {"w1", "w2"}
    assert again.statistics().damage == 2
