"""WorkLeaseJournal and DeferredWorkJournal: events, replay, compaction, write faults, damage."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from symcc_mpi.durable import journal as journal_module
from symcc_mpi.durable.clock import ManualClock
from symcc_mpi.durable.journal import (
    DEFERRED_JOURNAL_NAME,
    DamageKind,
    Deferral,
    DeferredWorkJournal,
    JournalBroken,
    JournalConflict,
    LeaseState,
    LineError,
    WorkLeaseJournal,
    decode_line,
    encode_line,
    write_all,
)


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


def open_journal(path, clock, **options) -> WorkLeaseJournal:
    return WorkLeaseJournal(path, clock=clock, fsync=False, **options)


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


# -- WorkLeaseJournal -------------------------------------------------------------------------


def test_events_are_repeat_safe_and_conflicts_write_nothing(tmp_path, clock):
    j = open_journal(tmp_path / "w.jsonl", clock)
    assert j.lease("a", "t1") is True
    assert j.lease("a", "t1") is False  # repeat
    with pytest.raises(JournalConflict):
        j.lease("a", "t2")
    with pytest.raises(JournalConflict):
        j.done("b", "t1")  # never leased
    assert j.reclaim("b", "t1") is False  # nothing held
    assert j.done("a", "t1") is True
    assert j.done("a", "t1") is False
    with pytest.raises(JournalConflict):
        j.lease("a", "t3")  # done is final
    with pytest.raises(JournalConflict):
        j.reclaim("a", "t1")
    assert j.statistics().lines == 2
    assert j.state("a") is LeaseState.DONE and j.state("b") is LeaseState.FREE


def test_replay_on_open_reproduces_state(tmp_path, clock):
    path = tmp_path / "w.jsonl"
    j = open_journal(path, clock)
    j.lease("a", "t1")
    clock.advance(5)
    j.lease("b", "t2")
    j.reclaim("b", "t2")
    j.lease("b", "t3")
    j.done("a", "t1")
    before = (j.leases(), j.done_ids())
    j.close()
    again = open_journal(path, clock)
    assert (again.leases(), again.done_ids()) == before
    assert again.leases()["b"].at == clock.time()
    assert again.damage == ()


def test_compaction_from_memory_keeps_state(tmp_path, clock):
    path = tmp_path / "w.jsonl"
    j = open_journal(path, clock, compact_after=8)
    for i in range(20):
        j.lease(f"w{i}", "t")
        if i % 2:
            j.reclaim(f"w{i}", "t")
        elif i % 4 == 0:
            j.done(f"w{i}", "t")
    stats = j.statistics()
    assert stats.compactions >= 1
    assert stats.lines < stats.appends
    state = (j.leases(), j.done_ids())
    j.compact()
    assert len(path.read_bytes().splitlines()) == 2 * len(j.done_ids()) + len(j.leases())
    j.close()
    again = open_journal(path, clock)
    assert (again.leases(), again.done_ids()) == state


def test_compaction_failure_is_counted_not_raised(tmp_path, clock, monkeypatch):
    j = open_journal(tmp_path / "w.jsonl", clock, compact_after=2)

    def refuse(*args, **kwargs):
        raise OSError(errno.ENOSPC, "injected")

    monkeypatch.setattr(journal_module, "write_durable", refuse)
    for i in range(4):
        assert j.lease(f"w{i}", "t") is True  # the appends succeeded: so did the calls
        assert j.reclaim(f"w{i}", "t") is True
    j.lease("kept", "t")
    assert j.statistics().compaction_failures >= 1
    j.close()
    monkeypatch.undo()
    assert set(open_journal(tmp_path / "w.jsonl", clock).leases()) == {"kept"}


@pytest.mark.parametrize("partial", [0, 7, 30])
def test_append_failure_leaves_memory_and_file_unchanged(tmp_path, clock, partial):
    path = tmp_path / "w.jsonl"
    writer = FailingWriter()
    j = open_journal(path, clock, writer=writer)
    j.lease("a", "t1")
    before_bytes = path.read_bytes()
    writer.failures, writer.partial = 1, partial
    with pytest.raises(OSError):
        j.done("a", "t1")
    assert j.state("a") is LeaseState.LEASED  # F313 §3.4: memory not ahead of the file
    assert path.read_bytes() == before_bytes  # the torn fragment was cut back off
    assert j.statistics().append_failures == 1
    assert j.done("a", "t1") is True  # and the next append lands on a clean line
    j.close()
    again = open_journal(path, clock)
    assert again.damage == () and again.state("a") is LeaseState.DONE


def test_cut_back_failure_breaks_the_journal(tmp_path, clock, monkeypatch):
    writer = FailingWriter()
    j = open_journal(tmp_path / "w.jsonl", clock, writer=writer)
    writer.failures, writer.partial = 1, 5

    def failing_ftruncate(fd, size):
        raise OSError(errno.EIO, "injected")

    with monkeypatch.context() as patch:
        patch.setattr(os, "ftruncate", failing_ftruncate)
        with pytest.raises(OSError):
            j.lease("a", "t1")
    assert j.statistics().broken
    with pytest.raises(JournalBroken):
        j.lease("b", "t1")
    j.close()
    # Reopening quarantines the torn fragment and works again.
    again = open_journal(tmp_path / "w.jsonl", clock)
    assert [d.kind for d in again.damage] == [DamageKind.TORN_TAIL]
    assert again.lease("b", "t1") is True


def test_torn_last_line_is_truncated_and_quarantined(tmp_path, clock):
    path = tmp_path / "w.jsonl"
    j = open_journal(path, clock)
    j.lease("a", "t1")
    j.lease("b", "t2")
    j.close()
    good = path.read_bytes()
    torn = encode_line({"event": "done", "work": "a", "token": "t1", "at": 1.0})[:-9]
    path.write_bytes(good + torn)
    again = open_journal(path, clock)
    (damage,) = again.damage
    assert damage.kind is DamageKind.TORN_TAIL
    assert damage.path == path and damage.line == 3
    assert damage.kept_at.read_bytes() == torn
    assert str(path) in str(damage) and ":3:" in str(damage)
    assert path.read_bytes() == good
    assert set(again.leases()) == {"a", "b"}


def test_complete_line_without_newline_is_a_torn_append(tmp_path, clock):
    path = tmp_path / "w.jsonl"
    open_journal(path, clock).close()
    whole = encode_line({"event": "lease", "work": "a", "token": "t", "at": 1.0})
    path.write_bytes(whole[:-1])
    again = open_journal(path, clock)
    assert [d.kind for d in again.damage] == [DamageKind.TORN_TAIL]
    assert again.leases() == {}
    again.lease("b", "t")
    again.close()
    assert open_journal(path, clock).damage == ()


@pytest.mark.parametrize("bad", [
    b"this is not a record\n",
    b"\xff\xfe\x00binary\n",
    b"00000000 {\"event\":\"lease\"}\n",  # wrong checksum
    encode_line({"event": "explode", "work": "x", "token": "t", "at": 0}),  # checksummed
    encode_line({"event": "done", "work": "zz", "token": "t", "at": 0}),  # does not apply
])
def test_corrupt_middle_line_is_quarantined_others_kept(tmp_path, clock, bad):
    path = tmp_path / "w.jsonl"
    j = open_journal(path, clock)
    j.lease("a", "t1")
    j.lease("b", "t2")
    j.done("b", "t2")
    j.close()
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join([lines[0], bad, *lines[1:]]))
    again = open_journal(path, clock)
    (damage,) = again.damage
    assert damage.kind is DamageKind.CORRUPT_LINE
    assert (damage.path, damage.line) == (path, 2)
    assert damage.kept_at.read_bytes() == bad  # never silently dropped
    assert again.leases().keys() == {"a"} and again.done_ids() == {"b"}
    again.close()
    third = open_journal(path, clock)  # the live file was repaired: no repeat report
    assert third.damage == () and third.done_ids() == {"b"}


def test_interrupted_compaction_temporary_is_swept(tmp_path, clock):
    path = tmp_path / "w.jsonl"
    j = open_journal(path, clock)
    j.lease("a", "t1")
    j.close()
    leftover = tmp_path / f".tmp-{path.name}.12345"
    leftover.write_bytes(b"half a compaction")
    again = open_journal(path, clock)
    assert not leftover.exists() and set(again.leases()) == {"a"}


def test_bad_arguments_are_refused_up_front(tmp_path, clock):
    j = open_journal(tmp_path / "w.jsonl", clock)
    for work, token in (("", "t"), ("a", ""), ("a" * 300, "t"), (None, "t")):
        with pytest.raises(ValueError):
            j.lease(work, token)
    with pytest.raises(ValueError):
        WorkLeaseJournal(tmp_path / "x.jsonl", compact_after=0)


# -- DeferredWorkJournal ------------------------------------------------------------------------


def test_defer_persists_and_repeats(tmp_path, clock):
    d = DeferredWorkJournal.in_campaign(tmp_path, clock=clock, fsync=False)
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
