"""Stateful property tests: WorkLeaseJournal and WorkWAL driven beside in-memory models, with
injected write failures, torn appends, interrupted publications and reopen-and-recover as rules.
Invariants: the structure always equals the model (nothing lost, memory never ahead of disk),
every done work's objects are in the corpus under their SHA-256, nothing is published twice
under different bytes."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from symcc_mpi.durable.atomic import write_durable
from symcc_mpi.durable.clock import ManualClock
from symcc_mpi.durable.journal import (
    DamageKind,
    JournalConflict,
    LeaseState,
    WorkLeaseJournal,
    encode_line,
    write_all,
)
from symcc_mpi.durable.wal import Manifest, ObjectCorrupt, WalConflict, WorkState, WorkWAL

WORKS = st.sampled_from(["w0", "w1", "w2", "w3"])
TOKENS = st.sampled_from(["t1", "t2", "t3"])
SETTINGS = settings(max_examples=40, stateful_step_count=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


class ArmedWriter:
    """The journal's write step; `arm(partial)` makes the next write fail after `partial`
    bytes (0 = before anything reached the file)."""

    def __init__(self) -> None:
        self.partial: int | None = None

    def arm(self, partial: int) -> None:
        self.partial = partial

    def __call__(self, fd: int, data: bytes) -> None:
        if self.partial is not None:
            partial, self.partial = self.partial, None
            os.write(fd, data[: min(partial, len(data) - 1)])
            raise OSError(errno.EIO, "injected write failure")
        write_all(fd, data)


class JournalMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="journal-machine-"))
        self.path = self.directory / "leases.jsonl"
        self.clock = ManualClock()
        self.writer = ArmedWriter()
        self.journal = self._open()
        self.model: dict[str, tuple[LeaseState, str]] = {}

    def _open(self) -> WorkLeaseJournal:
        return WorkLeaseJournal(self.path, clock=self.clock, fsync=False, writer=self.writer,
                                compact_after=6)

    def teardown(self) -> None:
        self.journal.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _expect(self, event: str, work: str, token: str) -> str:
        state, held = self.model.get(work, (LeaseState.FREE, ""))
        if state is LeaseState.DONE:
            return "repeat" if event == "done" and held == token else "conflict"
        if state is LeaseState.LEASED:
            if held != token:
                return "conflict"
            return "repeat" if event == "lease" else "apply"
        if event == "lease":
            return "apply"
        return "repeat" if event == "reclaim" else "conflict"

    def _do(self, event: str, work: str, token: str) -> None:
        expected = self._expect(event, work, token)
        armed = self.writer.partial is not None
        call = getattr(self.journal, event)
        if expected == "conflict":
            with pytest.raises(JournalConflict):
                call(work, token)
            return
        if expected == "repeat":
            assert call(work, token) is False  # a repeat writes nothing, so cannot fail
            return
        if armed:
            with pytest.raises(OSError):
                call(work, token)
            return  # F313 §3.4: the model (memory) does not move
        assert call(work, token) is True
        if event == "lease":
            self.model[work] = (LeaseState.LEASED, token)
        elif event == "done":
            self.model[work] = (LeaseState.DONE, token)
        else:
            del self.model[work]

    @rule(work=WORKS, token=TOKENS)
    def lease(self, work, token):
        self._do("lease", work, token)

    @rule(work=WORKS, token=TOKENS)
    def done(self, work, token):
        self._do("done", work, token)

    @rule(work=WORKS, token=TOKENS)
    def reclaim(self, work, token):
        self._do("reclaim", work, token)

    @rule(work=WORKS)
    def finish_current(self, work):
        state, token = self.model.get(work, (LeaseState.FREE, "t1"))
        self._do("done" if state is LeaseState.LEASED else "lease", work, token)

    @rule(partial=st.integers(min_value=0, max_value=80))
    def fail_next_write(self, partial):
        self.writer.arm(partial)

    @rule()
    def compact(self):
        self.journal.compact()

    @rule()
    def reopen(self):
        self.journal.close()
        self.journal = self._open()
        assert self.journal.damage == ()

    @rule(cut=st.integers(min_value=1, max_value=60), work=WORKS)
    def crash_mid_append(self, cut, work):
        # A process killed inside write(): part of a line, no newline, then a restart.
        self.journal.close()
        line = encode_line({"event": "lease", "work": work, "token": "t9", "at": 0.0})
        with open(self.path, "ab") as handle:
            handle.write(line[: min(cut, len(line) - 1)])
        self.journal = self._open()
        assert [d.kind for d in self.journal.damage] == [DamageKind.TORN_TAIL]
        assert self.journal.damage[0].kept_at.exists()

    @invariant()
    def agrees_with_model(self):
        leases = {w: lease.token for w, lease in self.journal.leases().items()}
        assert leases == {w: t for w, (s, t) in self.model.items() if s is LeaseState.LEASED}
        assert self.journal.done_ids() == {w for w, (s, _) in self.model.items()
                                           if s is LeaseState.DONE}


TestJournalMachine = JournalMachine.TestCase
TestJournalMachine.settings = SETTINGS


# -- the WAL ------------------------------------------------------------------------------------

OBJECTS = [f"object {i}".encode() * (i + 1) for i in range(5)]
DIGESTS = [hashlib.sha256(data).hexdigest() for data in OBJECTS]
MANIFEST_CHOICES = st.lists(st.integers(min_value=0, max_value=4), min_size=0, max_size=3)


class ArmedRecordWriter:
    """The WAL's record write; armed, the next write fails before its rename ("before": the
    old record stays) or after it ("after": the new record is in place, the call still
    raises, as when the directory fsync fails)."""

    def __init__(self) -> None:
        self.mode: str | None = None

    def __call__(self, path: Path, data: bytes) -> None:
        mode, self.mode = self.mode, None
        if mode == "before":
            raise OSError(errno.ENOSPC, "injected write failure")
        write_durable(path, data, fsync=False)
        if mode == "after":
            raise OSError(errno.EIO, "injected failure after the rename")


class WalMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="wal-machine-"))
        self.staging = self.directory / "staging" / "result"
        self.staging.mkdir(parents=True)
        for data, digest in zip(OBJECTS, DIGESTS, strict=True):
            (self.staging / digest).write_bytes(data)
        self.corpus = self.directory / "corpus"
        self.clock = ManualClock()
        self.writer = ArmedRecordWriter()
        self.wal = self._open()
        # work -> (state, token, manifest)
        self.model: dict[str, tuple[WorkState, str, Manifest | None]] = {}

    def _open(self) -> WorkWAL:
        return WorkWAL(self.directory / "wal", self.corpus, clock=self.clock, fsync=False,
                       writer=self.writer)

    def teardown(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def _manifest(self, picks: list[int]) -> Manifest:
        return Manifest(self.staging, tuple(DIGESTS[i] for i in picks))

    def _write_call(self, call, work: str, after: tuple[WorkState, str, Manifest | None]):
        """Run a call that writes one record; with a fault armed, accept old or new."""
        before = self.model.get(work)
        mode = self.writer.mode
        if mode is None:
            call()
            self.model[work] = after
            return
        with pytest.raises(OSError):
            call()
        record = self.wal.get(work)
        seen = None if record is None else (record.state, record.token, record.manifest)
        if mode == "before":
            assert seen == before
        else:
            assert seen == after
            self.model[work] = after
            # Repeat-safe: the caller repeats the call and it now succeeds without change.
            call()

    @rule(work=WORKS, token=TOKENS)
    def begin(self, work, token):
        current = self.model.get(work)
        if current is None:
            self._write_call(lambda: self.wal.begin(work, token), work,
                             (WorkState.LEASED, token, None))
        elif current[0] is WorkState.LEASED and current[1] == token:
            assert self.wal.begin(work, token).token == token
        else:
            with pytest.raises(WalConflict):
                self.wal.begin(work, token)

    @rule(work=WORKS, token=TOKENS, picks=MANIFEST_CHOICES)
    def commit_manifest(self, work, token, picks):
        manifest = self._manifest(picks)
        current = self.model.get(work)
        call = lambda: self.wal.commit_manifest(work, token, manifest)  # noqa: E731
        if current is None or current[1] != token:
            with pytest.raises(WalConflict):
                call()
        elif current[0] is WorkState.LEASED:
            self._write_call(call, work, (WorkState.COMMITTING, token, manifest))
        elif current[2] == manifest:
            assert call().state is current[0]
        else:
            with pytest.raises(WalConflict):
                call()

    @rule(work=WORKS, token=TOKENS,
          picks=st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=3))
    def advance(self, work, token, picks):
        # One step along the path a healthy master takes, so that random runs reach the
        # committing state (where crashes matter most) often.
        current = self.model.get(work)
        if current is None:
            self.begin(work, token)
        elif current[0] is WorkState.LEASED:
            self.commit_manifest(work, current[1], picks)
        else:
            self.publish_and_done(work)

    @rule(work=WORKS)
    def publish_and_done(self, work):
        current = self.model.get(work)
        token = current[1] if current else "t1"
        if current is None or current[0] is WorkState.LEASED:
            with pytest.raises(WalConflict):
                self.wal.publish(work, token)
            return
        self.wal.publish(work, token)
        if current[0] is WorkState.DONE:
            assert self.wal.done(work, token).state is WorkState.DONE  # a repeat: no write
            return
        self._write_call(lambda: self.wal.done(work, token), work,
                         (WorkState.DONE, token, current[2]))

    @rule(work=WORKS, token=TOKENS)
    def stale_publish(self, work, token):
        current = self.model.get(work)
        if current is not None and current[1] != token:
            with pytest.raises(WalConflict):
                self.wal.publish(work, token)
            with pytest.raises(WalConflict):
                self.wal.done(work, token)

    @rule(work=WORKS, token=TOKENS)
    def abandon(self, work, token):
        current = self.model.get(work)
        if current is None:
            assert self.wal.abandon(work, token) is False
        elif current[0] is WorkState.LEASED and current[1] == token:
            assert self.wal.abandon(work, token) is True
            del self.model[work]
        else:
            with pytest.raises(WalConflict):
                self.wal.abandon(work, token)

    @rule(work=WORKS)
    def crash_mid_publication(self, work):
        # Killed after linking the first object: the corpus holds part of the manifest.
        current = self.model.get(work)
        if current and current[0] is WorkState.COMMITTING and current[2].objects:
            digest = current[2].objects[0]
            target = self.corpus / digest
            if not target.exists():
                os.link(self.staging / digest, target)

    @rule(mode=st.sampled_from(["before", "after"]))
    def fail_next_write(self, mode):
        self.writer.mode = mode

    @rule()
    def reopen_and_recover(self):
        self.writer.mode = None
        self.wal = self._open()
        recovery = self.wal.recover()
        committing = {w for w, (s, _, _) in self.model.items() if s is WorkState.COMMITTING}
        leased = {w for w, (s, _, _) in self.model.items() if s is WorkState.LEASED}
        assert set(recovery.redone) == committing
        assert set(recovery.reclaimed) == leased
        assert recovery.failed == () and recovery.quarantined == ()
        for work in committing:
            state, token, manifest = self.model[work]
            self.model[work] = (WorkState.DONE, token, manifest)
        for work in leased:
            del self.model[work]
        again = self.wal.recover()  # recovery is itself repeat-safe
        assert again.redone == () and again.reclaimed == ()

    @invariant()
    def agrees_with_model(self):
        for work in ("w0", "w1", "w2", "w3"):
            record = self.wal.get(work)
            seen = None if record is None else (record.state, record.token, record.manifest)
            assert seen == self.model.get(work)

    @invariant()
    def done_work_is_published_under_its_hash(self):
        for state, _, manifest in self.model.values():
            if state is WorkState.DONE:
                for digest in manifest.objects:
                    assert hashlib.sha256((self.corpus / digest).read_bytes()).hexdigest() \
                        == digest
        for path in self.corpus.iterdir() if self.corpus.exists() else ():
            assert hashlib.sha256(path.read_bytes()).hexdigest() == path.name


TestWalMachine = WalMachine.TestCase
TestWalMachine.settings = SETTINGS


# -- WAL examples: bad input and refusals -----------------------------------------------------


@pytest.fixture
def staged(tmp_path):
    staging = tmp_path / "staging" / "r1"
    staging.mkdir(parents=True)
    for data, digest in zip(OBJECTS, DIGESTS, strict=True):
        (staging / digest).write_bytes(data)
    return staging


def test_corrupt_record_is_quarantined_others_recovered(tmp_path, staged):
    wal = WorkWAL(tmp_path / "wal", tmp_path / "corpus", fsync=False)
    for work in ("a", "b", "c"):
        wal.begin(work, "t")
    wal.commit_manifest("b", "t", Manifest(staged, tuple(DIGESTS[:2])))
    wal.commit_manifest("c", "t", Manifest(staged, tuple(DIGESTS[2:])))
    bad = wal.path_of("c")
    bad.write_bytes(bad.read_bytes()[:-20] + b"\n")  # truncated record
    recovery = WorkWAL(tmp_path / "wal", tmp_path / "corpus", fsync=False).recover()
    assert recovery.redone == ("b",) and recovery.reclaimed == ("a",)
    (damage,) = recovery.quarantined
    assert damage.path == bad and str(bad) in damage.reason
    assert damage.kept_at.exists() and not bad.exists()  # moved aside, not deleted


def test_corrupt_record_read_names_its_path(tmp_path):
    wal = WorkWAL(tmp_path / "wal", tmp_path / "corpus", fsync=False)
    wal.begin("a", "t")
    wal.path_of("a").write_bytes(b"\x00" * 40)
    with pytest.raises(Exception, match=str(wal.path_of("a"))):
        wal.get("a")


def test_staged_object_with_wrong_bytes_is_refused_before_commit(tmp_path, staged):
    wal = WorkWAL(tmp_path / "wal", tmp_path / "corpus", fsync=False)
    wal.begin("a", "t")
    (staged / DIGESTS[0]).write_bytes(b"tampered")
    with pytest.raises(ObjectCorrupt, match=DIGESTS[0]):
        wal.commit_manifest("a", "t", Manifest(staged, (DIGESTS[0],)))
    assert wal.get("a").state is WorkState.LEASED


def test_published_object_with_wrong_bytes_is_a_corruption_error(tmp_path, staged):
    corpus = tmp_path / "corpus"
    wal = WorkWAL(tmp_path / "wal", corpus, fsync=False)
    wal.begin("a", "t")
    wal.commit_manifest("a", "t", Manifest(staged, (DIGESTS[1],)))
    (corpus / DIGESTS[1]).write_bytes(b"impostor")
    with pytest.raises(ObjectCorrupt, match=str(corpus / DIGESTS[1])):
        wal.publish("a", "t")
    recovery = WorkWAL(tmp_path / "wal", corpus, fsync=False).recover()
    assert recovery.redone == () and recovery.failed[0][0] == "a"
    assert wal.get("a").state is WorkState.COMMITTING  # never rolled back, never stolen


def test_redo_verifies_staged_bytes(tmp_path, staged):
    wal = WorkWAL(tmp_path / "wal", tmp_path / "corpus", fsync=False)
    wal.begin("a", "t")
    wal.commit_manifest("a", "t", Manifest(staged, (DIGESTS[2],)))
    (staged / DIGESTS[2]).write_bytes(b"rotted after the commit")
    recovery = WorkWAL(tmp_path / "wal", tmp_path / "corpus", fsync=False).recover()
    assert recovery.failed and "hashes to" in recovery.failed[0][1]
    assert not (tmp_path / "corpus" / DIGESTS[2]).exists()


def test_manifest_and_ids_are_validated(tmp_path, staged):
    wal = WorkWAL(tmp_path / "wal", tmp_path / "corpus", fsync=False)
    with pytest.raises(ValueError):
        Manifest(staged, ("not-a-digest",))
    for work in ("", "../x", ".hidden", "a/b", "x" * 200):
        with pytest.raises(ValueError):
            wal.begin(work, "t")
    assert Manifest(staged, (DIGESTS[1], DIGESTS[0], DIGESTS[1])).objects == \
        tuple(sorted(DIGESTS[:2]))
