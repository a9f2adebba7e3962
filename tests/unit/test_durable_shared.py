"""The durable helpers every log and lock of the campaign shares: `publish_link`'s copy
fallback (atomic.py), the flocks (locks.py), REASONS and a locked log's torn tail
(journal.py)."""

from __future__ import annotations

import errno
import os

import pytest

from symcc_mpi.durable import atomic
from symcc_mpi.durable.atomic import publish_link
from symcc_mpi.durable.journal import REASONS, LineLog, note_reason
from symcc_mpi.durable.locks import FileLock, FlockHeld, check_unlocked, flocked


def test_publish_link_links_where_it_can(tmp_path):
    source = tmp_path / "source"
    source.write_bytes(b"bytes")
    publish_link(source, tmp_path / "id:000000")
    assert os.path.samefile(source, tmp_path / "id:000000")


def test_publish_link_copies_under_a_fresh_temporary_where_links_are_refused(tmp_path,
                                                                            monkeypatch):
    source = tmp_path / "source"
    source.write_bytes(b"bytes")

    def refused(*args, **kwargs):
        raise OSError(errno.EPERM, "no hard links here")

    monkeypatch.setattr(atomic.os, "link", refused)
    # A leftover of a writer killed mid-copy under the old fixed name is no obstacle.
    (tmp_path / ".id:000000.tmp").write_bytes(b"half")
    publish_link(source, tmp_path / "id:000000")
    assert (tmp_path / "id:000000").read_bytes() == b"bytes"
    assert not os.path.samefile(source, tmp_path / "id:000000")
    assert not [p for p in tmp_path.iterdir() if atomic.is_temporary(p)]


def test_the_file_lock_excludes_a_second_holder_and_is_free_after_release(tmp_path):
    path = tmp_path / "state" / "master.lock"
    first, second = FileLock(path), FileLock(path)
    first.acquire()
    assert path.read_text() == f"{os.getpid()}\n"
    with pytest.raises(FlockHeld):
        second.acquire()
    with pytest.raises(FlockHeld):
        check_unlocked(path)
    first.release()
    first.release()  # twice is harmless
    check_unlocked(path)
    second.acquire(wait=1.0)
    assert second.held and not first.held
    second.release()


def test_check_unlocked_of_a_lock_never_taken_writes_nothing(tmp_path):
    check_unlocked(tmp_path / "master.lock")
    assert not (tmp_path / "master.lock").exists()


def test_flocked_excludes_a_file_lock_of_the_same_file(tmp_path):
    path = tmp_path / "generations.jsonl"
    with flocked(path):
        with pytest.raises(FlockHeld):
            check_unlocked(path)
    check_unlocked(path)


def test_reasons_are_appended_one_line_each(tmp_path):
    note_reason(tmp_path / "quarantine", "a", "first reason")
    note_reason(tmp_path / "quarantine", "b", "second reason")
    assert (tmp_path / "quarantine" / REASONS).read_text() == "a: first reason\nb: second reason\n"


def test_a_torn_tail_is_cut_into_quarantine_and_a_whole_log_left_alone(tmp_path):
    path = tmp_path / "log.jsonl"
    log = LineLog(path, quarantine_dir=tmp_path / "q", fsync=False)
    log.append({"n": 1})
    log.close()
    whole = path.read_bytes()
    assert LineLog(path, quarantine_dir=tmp_path / "q").cut_torn_tail() is None
    with open(path, "ab") as handle:
        handle.write(b"0123 {\"n\"")
    damage = LineLog(path, quarantine_dir=tmp_path / "q").cut_torn_tail()
    assert path.read_bytes() == whole
    assert damage.kept_at == tmp_path / "q" / f"log.jsonl.torn-at-{len(whole)}"
    assert damage.kept_at.read_bytes() == b"0123 {\"n\""
    assert f"interrupted append cut from {path} at byte {len(whole)}" in \
        (tmp_path / "q" / REASONS).read_text()


def test_a_log_without_cut_back_keeps_a_failed_append_and_takes_no_more(tmp_path):
    """The generation log's: a writer that raised may have landed its record."""
    def lands_then_raises(fd, data):
        os.write(fd, data)
        raise OSError(errno.EIO, "Input/output error")

    path = tmp_path / "log.jsonl"
    log = LineLog(path, writer=lands_then_raises, cut_back=False, fsync=False)
    with pytest.raises(OSError):
        log.append({"n": 1})
    assert path.read_bytes().endswith(b'{"n":1}\n')
    with pytest.raises(OSError):
        log.append({"n": 2})
    log.close()
