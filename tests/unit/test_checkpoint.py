"""What `--resume` needs besides the done journal (`checkpoint.py`), and the journal's group
commit (`CampaignDir.record_done` / `sync_done`).

The done records of a round are made durable first, then the pruning and triage maps are
saved when due (every SAVE_INTERVAL seconds, or at the end) and only when they changed.
"""

from __future__ import annotations

import array
import hashlib
import logging
import os

import msgspec
import pytest

from symcc_mpi.campaign import checkpoint as checkpoint_module
from symcc_mpi.campaign import corpus as corpus_module
from symcc_mpi.campaign.checkpoint import (
    PRUNING_DIR,
    SAVE_INTERVAL,
    SYNC_INTERVAL,
    TRIAGE_FILE,
    Checkpointer,
    _TriageState,
    load_pruning,
    load_triage,
)
from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.layout import CampaignError
from symcc_mpi.coverage.edges import FileCoverage, Status
from symcc_mpi.coverage.pruning import MAP_SIZE, SHARED_SCOPE, Delta, PruningLedger, PruningMode
from symcc_mpi.coverage.triage import CoverageMap
from symcc_mpi.durable.clock import ManualClock


def delta(*indices: int, bits: int = 1) -> Delta:
    return Delta(array.array("I", indices).tobytes(), bytes([bits]) * len(indices))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def campaign(tmp_path):
    campaign = CampaignDir(tmp_path / "out")
    campaign.create({})
    campaign.lock()  # the master's: it alone appends to the done journal
    yield campaign
    campaign.close()


@pytest.fixture
def calls(monkeypatch, campaign):
    """The order of the done-journal syncs and the map saves."""
    order: list[str] = []
    sync = campaign.sync_done
    save = checkpoint_module.save_maps

    def spy_sync():
        order.append("sync")
        sync()

    def spy_save(directory, maps):
        order.append("save")
        save(directory, maps)

    monkeypatch.setattr(campaign, "sync_done", spy_sync)
    monkeypatch.setattr(checkpoint_module, "save_maps", spy_save)
    return order


def test_after_round_syncs_done_first_and_saves_maps_when_due_and_dirty(campaign, calls):
    clock = ManualClock()
    ledger = PruningLedger(PruningMode.SHARED)
    keeper = Checkpointer(campaign, pruning=ledger, triage=None, clock=clock)
    saved = campaign.state / PRUNING_DIR / f"{SHARED_SCOPE}.map"

    keeper.after_round()  # nothing merged: only the journal
    assert calls == ["sync"] and not saved.exists() and keeper.saves == 0

    ledger.merge(1, delta(5))
    clock.advance(SAVE_INTERVAL / 4)  # not due yet (the empty round above set the interval)
    keeper.after_round()
    assert calls == ["sync", "sync"] and not saved.exists() and ledger.dirty

    clock.advance(SAVE_INTERVAL)
    keeper.after_round()
    assert calls == ["sync", "sync", "sync", "save"]  # the records are durable before the map
    assert keeper.saves == 1 and not ledger.dirty
    assert load_pruning(campaign) == ledger.maps()

    ledger.merge(1, delta(6))
    clock.advance(SAVE_INTERVAL / 2)
    keeper.after_round()  # due only SAVE_INTERVAL after the last save
    assert keeper.saves == 1 and load_pruning(campaign) != ledger.maps()
    clock.advance(SAVE_INTERVAL)
    keeper.after_round()
    assert keeper.saves == 2 and load_pruning(campaign) == ledger.maps()

    clock.advance(10 * SAVE_INTERVAL)
    keeper.after_round()  # due but nothing changed
    assert keeper.saves == 2 and calls.count("save") == 2 and calls[-1] == "sync"


def test_final_round_saves_regardless_of_the_interval(campaign, calls):
    clock = ManualClock()
    ledger = PruningLedger(PruningMode.LOCAL)
    keeper = Checkpointer(campaign, pruning=ledger, triage=None, clock=clock)
    ledger.merge(1, delta(1))
    keeper.after_round()
    assert keeper.saves == 1
    ledger.merge(2, delta(MAP_SIZE - 1, bits=0x80))
    keeper.after_round(final=True)  # at the same instant
    assert calls == ["sync", "save", "sync", "save"] and keeper.saves == 2
    assert load_pruning(campaign) == ledger.maps()
    assert set(load_pruning(campaign)) == {"rank-1", "rank-2"}
    keeper.after_round(final=True)  # nothing changed: nothing written
    assert calls[-1] == "sync" and keeper.saves == 2


def test_saved_pruning_map_resumes_the_ledger(campaign):
    ledger = PruningLedger(PruningMode.SHARED)
    ledger.merge(3, delta(1, 2, 65536 + 9, bits=4))
    Checkpointer(campaign, pruning=ledger, triage=None, clock=ManualClock()).after_round()
    resumed = PruningLedger(PruningMode.SHARED, load_pruning(CampaignDir(campaign.out)))
    assert resumed.maps() == ledger.maps()
    assert resumed.plan(1).whole  # a fresh worker gets the resumed map whole


def test_no_saved_state_loads_empty(campaign):
    assert load_pruning(campaign) == {}
    assert load_triage(campaign) == (None, 0)


def test_triage_state_round_trip_with_queue_entries(campaign):
    for i in range(3):
        campaign.add_seed(f"seed {i}\n".encode(), f"seed-{i}")
    triage = CoverageMap()
    assert triage.merge(FileCoverage.from_pairs([(3, 1), (70_000, 16), (12, 128)], Status.OK))
    clock = ManualClock()
    keeper = Checkpointer(campaign, pruning=None, triage=triage, clock=clock)
    keeper.after_round()
    assert load_triage(campaign) == (None, 0) and keeper.saves == 0  # not dirty: not saved
    keeper.triage_dirty = True
    clock.advance(SAVE_INTERVAL)
    keeper.after_round()
    assert keeper.saves == 1 and not keeper.triage_dirty

    loaded, covered = load_triage(CampaignDir(campaign.out))
    assert covered == campaign.queue_entries == 3
    assert loaded.statistics() == triage.statistics()
    # The loaded map knows what was merged: the same summary is no longer interesting.
    assert not loaded.merge(FileCoverage.from_pairs([(3, 1), (12, 128)], Status.OK))
    assert loaded.merge(FileCoverage.from_pairs([(3, 2)], Status.OK))


@pytest.mark.parametrize("content", [
    b"",
    b"\xc1 not msgpack",
    msgspec.msgpack.encode(_TriageState(2, 0, CoverageMap().to_bytes())),  # a later version
    msgspec.msgpack.encode(["1", 0, b""]),  # not a triage state
    msgspec.msgpack.encode(_TriageState(1, 4, b"\x93garbage")),  # coverage unreadable
    msgspec.msgpack.encode(_TriageState(1, 4, msgspec.msgpack.encode([2, 0, b"", [], []]))),
], ids=["empty", "garbage", "version", "shape", "coverage", "coverage-version"])
def test_corrupt_triage_state_replays_the_queue(campaign, caplog, content):
    (campaign.state / TRIAGE_FILE).write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="symcc_mpi.campaign.checkpoint"):
        assert load_triage(campaign) == (None, 0)
    assert TRIAGE_FILE in caplog.text and "replaying the whole queue" in caplog.text


def test_corrupt_pruning_map_is_a_campaign_error_naming_the_file(campaign):
    directory = campaign.state / PRUNING_DIR
    directory.mkdir()
    (directory / "shared.map").write_bytes(b"\x01" * 100)
    with pytest.raises(CampaignError, match=r"pruning/shared\.map"):
        load_pruning(campaign)


# --------------------------------------------------------------------------- group commit


@pytest.fixture
def fsyncs(monkeypatch):
    count = [0]
    real = corpus_module.os.fsync

    def spy(fd):
        count[0] += 1
        real(fd)

    monkeypatch.setattr(corpus_module.os, "fsync", spy)
    return count


def test_done_records_are_group_committed(campaign, fsyncs):
    campaign.open_done()  # as the master does at start (creating the file syncs state/)
    fsyncs[0] = 0
    campaign.sync_done()  # nothing recorded yet: nothing to do
    assert fsyncs[0] == 0
    digests = [sha(f"input {i}".encode()) for i in range(5)]
    for i, digest in enumerate(digests):
        campaign.record_done(digest, f"{i:032x}", "ok")
    assert fsyncs[0] == 0  # recording does not sync: the round's records share one fsync
    campaign.sync_done()
    assert fsyncs[0] == 1
    records = CampaignDir(campaign.out).read_done()
    assert [r["digest"] for r in records] == digests
    assert [r["token"] for r in records] == [f"{i:032x}" for i in range(5)]
    campaign.sync_done()  # nothing new since: no fsync
    assert fsyncs[0] == 1

    campaign.record_done(digests[0], "f" * 32, "crash")
    campaign.sync_done()
    assert fsyncs[0] == 2
    assert len(CampaignDir(campaign.out).read_done()) == 6


def test_close_syncs_the_done_records(campaign, fsyncs):
    campaign.open_done()
    fsyncs[0] = 0
    digest = sha(b"last")
    campaign.record_done(digest, "a" * 32, "ok")
    campaign.close()
    assert fsyncs[0] == 1
    assert [r["digest"] for r in CampaignDir(campaign.out).read_done()] == [digest]
    campaign.close()  # twice: harmless
    assert fsyncs[0] == 1


def test_the_done_journal_is_synced_at_most_every_sync_interval(campaign, calls):
    clock = ManualClock()
    ledger = PruningLedger(PruningMode.SHARED)
    keeper = Checkpointer(campaign, pruning=ledger, triage=None, clock=clock)
    keeper.after_round()
    ledger.merge(1, delta(3))
    clock.advance(SYNC_INTERVAL / 2)
    keeper.after_round()  # within the window: neither the journal nor a map is written
    assert calls == ["sync"] and ledger.dirty
    clock.advance(SYNC_INTERVAL)
    keeper.after_round()
    assert calls == ["sync", "sync"]  # the map is not due yet (SAVE_INTERVAL)
    clock.advance(SAVE_INTERVAL)
    keeper.after_round()
    assert calls == ["sync", "sync", "sync", "save"]  # a map only right after a sync
    keeper.after_round(final=True)  # the end syncs whatever the window
    assert calls[-1] == "sync" and calls.count("sync") == 4


def test_a_group_commit_makes_children_durable_before_their_done_line(campaign, monkeypatch):
    """Data of every published file, then the directories, then one append, then one fsync
    of the journal: a done line never names an input whose children a crash could lose."""
    campaign.open_done()
    steps: list[tuple[str, str]] = []
    real_fsync, real_write = corpus_module.os.fsync, corpus_module.os.write

    def name_of(fd: int) -> str:
        return corpus_module.os.readlink(f"/proc/self/fd/{fd}")

    def spy_fsync(fd):
        steps.append(("fsync", name_of(fd)))
        real_fsync(fd)

    def spy_write(fd, data):
        name = name_of(fd)
        if not os.path.basename(name).startswith(".tmp-"):  # a published file's own bytes
            steps.append(("write", name))
        return real_write(fd, data)

    token = "ab" * 16
    children = [b"child one", b"child two"]
    monkeypatch.setattr(corpus_module.os, "fsync", spy_fsync)
    monkeypatch.setattr(corpus_module.os, "write", spy_write)
    parent = sha(b"parent")
    for data in children:
        campaign.promote(sha(data), data)  # the verified bytes (corpus.verify_staged)
        campaign.add_to_queue(sha(data), parent="")
    campaign.save_finding("crashes", sha(children[0]), None)
    campaign.record_done(parent, token, "crash")
    assert steps == []  # nothing is synced or written while results are recorded
    campaign.sync_done()

    journal = str(campaign.done_journal)
    kinds = [(kind, "journal" if path == journal else path) for kind, path in steps]
    assert kinds[-2:] == [("write", "journal"), ("fsync", "journal")]
    synced = [path for kind, path in steps[:-2]]
    assert all(kind == "fsync" for kind, _ in steps[:-2])
    for data in children:
        assert str(campaign.corpus / sha(data)) in synced
    directories = {str(campaign.corpus), str(campaign.queue), str(campaign.crashes)}
    assert directories <= set(synced)
    first_directory = min(synced.index(d) for d in directories)
    assert all(synced.index(str(campaign.corpus / sha(d))) < first_directory for d in children)
    steps.clear()
    campaign.sync_done()  # nothing new: no sync at all
    assert steps == []


def test_a_failed_append_keeps_the_records_for_the_next_commit(campaign, monkeypatch):
    campaign.open_done()
    digest = sha(b"input")
    campaign.record_done(digest, "a" * 32, "ok")
    real_fsync = corpus_module.os.fsync
    failures = [OSError(28, "No space left on device")]

    def fsync_failing_once(fd):
        if failures:
            raise failures.pop()
        real_fsync(fd)

    monkeypatch.setattr(corpus_module.os, "fsync", fsync_failing_once)
    with pytest.raises(OSError):
        campaign.sync_done()
    assert CampaignDir(campaign.out).read_done() == []  # cut back off the file
    campaign.sync_done()
    assert [r["digest"] for r in CampaignDir(campaign.out).read_done()] == [digest]


def test_the_commit_probe_sees_each_step_of_commits_that_carry_records(campaign):
    campaign.open_done()
    seen: list[tuple[str, int]] = []
    campaign.commit_probe = lambda step, number: seen.append((step, number))
    campaign.add_seed(b"seed", "s")
    campaign.sync_done()  # a seed is synced, but no record: no numbered commit
    assert seen == []
    campaign.record_done(sha(b"seed"), "a" * 32, "ok")
    campaign.sync_done()
    campaign.record_done(sha(b"other"), "b" * 32, "ok")
    campaign.sync_done()
    steps = ["before-children-sync", "before-done-append", "after-done-fsync"]
    assert seen == [(step, 1) for step in steps] + [(step, 2) for step in steps]
