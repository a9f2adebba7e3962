"""What a clean close leaves for the next run (snapshot.py), and the journal kept bounded
(done_log.DoneLog.compact_if_due): real campaign directories, no MPI."""

from __future__ import annotations

import hashlib
import logging
import os

import pytest

from symcc_mpi.campaign import done_log, published, snapshot, wal
from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.layout import CampaignError, check_out_dir
from symcc_mpi.campaign.verify import _check_work
from symcc_mpi.campaign.wal import settled_work_lines

TOKEN = "ab" * 16


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def opened(out, *, create: bool = False) -> CampaignDir:
    campaign = CampaignDir(out)
    if create:
        check_out_dir(out, resume=False)
        campaign.create({"test": True})
    campaign.lock()
    return campaign


def a_campaign(out, inputs: int = 20) -> list[str]:
    """A lone master's campaign, closed cleanly: half its inputs analysed."""
    campaign = opened(out, create=True)
    campaign.snapshot_on_close = True
    campaign.open_journal()
    seeds = [campaign.add_seed(b"seed %d" % n, f"s{n}") for n in range(inputs)]
    for number, seed in enumerate(seeds):
        campaign.inputs.add(seed)
        if number % 2:
            campaign.record_work(wal.Dispatch(digest=seed, token=TOKEN, generation=0, rank=1))
            campaign.record_done(seed, TOKEN, "ok")
            campaign.inputs.mark_done(seed)
    campaign.save_finding("crashes", seeds[3], seeds[2], 11)
    campaign.close()
    return seeds


def test_a_clean_close_leaves_a_snapshot_the_next_run_restores_and_removes(tmp_path):
    out = tmp_path / "out"
    seeds = a_campaign(out)
    assert snapshot.serving(CampaignDir(out)) is not None
    campaign = opened(out)
    saved = snapshot.take(campaign)
    assert saved is not None and not (campaign.state / snapshot.SNAPSHOT_FILE).exists()
    campaign.restore(saved)
    records = campaign.open_journal(after=saved)
    assert records == []  # nothing after the snapshot: nothing read
    frontier = campaign.inputs
    assert set(frontier.done) == set(seeds[1::2]) and list(frontier.pending) == seeds[0::2]
    assert [frontier.queue_id(seed) for seed in seeds] == list(range(len(seeds)))
    assert campaign.crash_digests == {seeds[3]} and campaign.next_ids["crashes"] == 1
    # Appends go on after the snapshot's records; the close's check covers the whole file.
    campaign.record_done(seeds[0], TOKEN, "ok")
    campaign.close()
    everything = CampaignDir(out).read_done()
    assert [r["digest"] for r in everything][-1] == seeds[0] and len(everything) == 11


def test_a_snapshot_of_another_journal_is_not_used(tmp_path):
    out = tmp_path / "out"
    seeds = a_campaign(out)
    campaign = opened(out)
    journal = campaign.done_journal.read_bytes()  # rewritten since (a compaction)
    campaign.done_journal.write_bytes(journal[:len(journal) // 2])
    assert snapshot.serving(campaign) is None
    assert snapshot.take(campaign) is None
    assert not (campaign.state / snapshot.SNAPSHOT_FILE).exists()  # and it is gone
    assert seeds


def died(campaign: CampaignDir) -> None:
    """The master of `campaign` dies: nothing closed, synced or snapshot at its end."""
    campaign.journal._log.close()
    campaign.publish_log.close()
    campaign._lock.release()


def a_run_that_dies_after_its_snapshot(out) -> dict[str, str]:
    """A resumed run of a_campaign takes its snapshot, then works and dies: an input done
    with a child kept, one whose child was published and not queued, a crash, a line
    announcing a queue/ entry that never appeared."""
    seeds = a_campaign(out)
    campaign = opened(out)
    saved = snapshot.take(campaign)
    campaign.restore(saved)
    campaign.open_journal(after=saved)
    campaign.save_snapshot(in_flight=[seeds[2]])
    kept, orphan, crash = (digest(b"kept"), digest(b"orphan"), digest(b"crash"))
    campaign.promote(kept, b"kept")
    campaign.add_to_queue(kept, seeds[0])
    campaign.record_done(seeds[0], TOKEN, "ok", published=[kept])
    campaign.sync_done()
    campaign.save_finding("crashes", crash, seeds[4], data=b"crash")
    campaign.promote(orphan, b"orphan")
    campaign.publish_log.intend("queue", orphan, "id:000099,src:000004,op:symcc")
    died(campaign)
    return {"seeds": seeds, "kept": kept, "orphan": orphan, "crash": crash}


def test_a_run_that_died_after_its_snapshot_resumes_from_it_as_from_the_directories(tmp_path):
    out = tmp_path / "out"
    run = a_run_that_dies_after_its_snapshot(out)
    campaign = opened(out)
    saved = snapshot.take(campaign)
    assert saved is not None and saved.in_flight == [run["seeds"][2]]
    unqueued = campaign.restore(saved)
    records = campaign.open_journal(after=saved)
    assert [r["digest"] for r in records if wal.is_done(r)] == [run["seeds"][0]]
    assert unqueued == [run["orphan"]]
    # The oracle: what the directories say, read the slow way.
    listed = CampaignDir(out)
    listed.read_queues()
    corpus = listed.corpus_digests()
    assert set(campaign.inputs.known) == corpus
    assert {d: campaign.inputs.queue_id(d) for d in corpus} \
        == {d: listed.inputs.queue_id(d) for d in corpus}
    assert campaign.next_ids == listed.next_ids
    assert campaign.crash_digests == listed.crash_digests == {run["seeds"][3], run["crash"]}
    campaign.close()


def test_a_publish_log_is_replayed_looking_only_where_its_lines_cannot_tell():
    a, b, c, d = (digest(x) for x in (b"a", b"b", b"c", b"d"))
    lines = [("corpus", a, ""), ("queue", a, "id:000007,src:000001,op:symcc"),
             ("corpus", b, ""), ("queue", b, "id:000008,src:000001,op:symcc"),  # refused
             ("queue", b, "id:000008,src:000002,op:symcc"),
             ("crashes", c, "id:000000,sig:11,src:000007"),
             ("corpus", d, ""),  # its master died before queueing it
             ("queue", d, "id:000009,src:000008,op:symcc")]  # announced, not made
    looked = []

    def exists(kind, item, name):
        looked.append((kind, item))
        return kind == "crashes" or (kind, item) == ("corpus", d)

    since = published.replay(lines, exists)
    assert since.inputs == [a, b, d]
    assert since.entries == {"queue": [(7, a, "id:000007,src:000001,op:symcc"),
                                       (8, b, "id:000008,src:000002,op:symcc")],
                             "crashes": [(0, c, "id:000000,sig:11,src:000007")],
                             "hangs": []}
    assert sorted(looked) == [("corpus", d), ("crashes", c), ("queue", d)]


def test_a_snapshot_of_an_empty_journal_serves_the_records_after_it(tmp_path):
    out = tmp_path / "out"
    campaign = opened(out, create=True)
    campaign.open_journal()
    campaign.save_snapshot(in_flight=[])  # the first round's, before anything is analysed
    seed = campaign.add_seed(b"seed", "seed")
    campaign.inputs.add(seed)
    campaign.record_done(seed, TOKEN, "ok")
    campaign.sync_done()
    died(campaign)
    campaign = opened(out)
    saved = snapshot.take(campaign)
    assert saved is not None and saved.journal_size == 0
    assert campaign.restore(saved) == []  # published after it, and queued
    assert seed in campaign.inputs.known and campaign.inputs.queue_id(seed) == 0
    assert [r["digest"] for r in campaign.open_journal(after=saved)] == [seed]


def test_a_serving_snapshot_spares_the_check_of_its_records_not_of_those_after_it(tmp_path):
    out = tmp_path / "out"
    a_run_that_dies_after_its_snapshot(out)
    campaign = CampaignDir(out)
    saved = snapshot.serving(campaign)
    assert saved is not None
    journal = campaign.done_journal.read_bytes()
    after = journal[saved.journal_size:]
    damaged = (b"0" if after[:1] != b"0" else b"1") + after[1:]
    # The first record is damaged too: a serving snapshot vouches for it, unread.
    campaign.done_journal.write_bytes(b"X" + journal[1:saved.journal_size] + damaged + after)
    assert snapshot.serving(campaign) is not None
    with pytest.raises(CampaignError, match=f"line {saved.journal_lines + 1}: "):
        campaign.inspect_journal(after=(saved.journal_size, saved.journal_lines))


def test_records_after_a_snapshot_from_another_boot_are_read_the_slow_way(tmp_path,
                                                                          monkeypatch, caplog):
    out = tmp_path / "out"
    a_run_that_dies_after_its_snapshot(out)
    monkeypatch.setattr(snapshot, "boot_id", lambda: "another boot")
    caplog.set_level(logging.INFO)
    campaign = opened(out)
    assert snapshot.take(campaign) is None
    assert "before this machine last started" in caplog.text


def test_a_snapshot_taken_during_a_run_serves_no_other_boot(tmp_path, monkeypatch, caplog):
    """Even with no record after it: the files published after it and the lines naming
    them were not synced, and a crash of the machine may have kept one without the other."""
    out = tmp_path / "out"
    a_campaign(out)
    campaign = opened(out)
    campaign.restore(snapshot.take(campaign))
    campaign.open_journal()
    campaign.save_snapshot(in_flight=[])
    campaign.promote(digest(b"child"), b"child")
    died(campaign)
    monkeypatch.setattr(snapshot, "boot_id", lambda: "another boot")
    caplog.set_level(logging.INFO)
    assert snapshot.take(opened(out)) is None
    assert "before this machine last started" in caplog.text


def test_a_clean_close_snapshot_serves_any_boot(tmp_path, monkeypatch):
    out = tmp_path / "out"
    a_campaign(out)
    monkeypatch.setattr(snapshot, "boot_id", lambda: "another boot")
    assert snapshot.take(opened(out)) is not None


def test_a_snapshot_followed_by_an_epoch_is_not_used(tmp_path, caplog):
    out = tmp_path / "out"
    seeds = a_campaign(out)
    campaign = opened(out)
    campaign.restore(snapshot.take(campaign))
    campaign.open_journal()
    campaign.save_snapshot(in_flight=[])
    campaign.begin_epoch(1)
    campaign.record_done(seeds[0], TOKEN, "ok")
    campaign.sync_done()
    died(campaign)
    caplog.set_level(logging.INFO)
    campaign = opened(out)
    assert snapshot.take(campaign) is None
    assert "a record after it begins an epoch" in caplog.text


def test_a_damaged_snapshot_is_set_aside_and_the_journal_read(tmp_path, caplog):
    out = tmp_path / "out"
    a_campaign(out)
    campaign = opened(out)
    path = campaign.state / snapshot.SNAPSHOT_FILE
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    assert snapshot.take(campaign) is None
    assert (campaign.quarantine / snapshot.SNAPSHOT_FILE).exists()
    assert "unreadable (checksum mismatch)" in caplog.text


def test_records_before_the_snapshot_changed_behind_its_back_are_reported(tmp_path, caplog):
    out = tmp_path / "out"
    a_campaign(out)
    campaign = opened(out)
    saved = snapshot.take(campaign)
    campaign.restore(saved)
    campaign.open_journal(after=saved)
    journal = campaign.done_journal.read_bytes()
    campaign.done_journal.write_bytes(journal.replace(b'"outcome":"ok"', b'"outcome":"OK"', 1))
    campaign.close()
    assert "the records before this run's differ from its snapshot's" in caplog.text


def test_a_torn_tail_after_the_snapshot_is_cut_and_a_corrupt_record_refused(tmp_path):
    out = tmp_path / "out"
    a_campaign(out)
    campaign = opened(out)
    saved = snapshot.take(campaign)
    with open(campaign.done_journal, "ab") as journal:
        journal.write(b"0badc0de {\"sha256\": \"tor")
    campaign.open_journal(after=saved)
    assert campaign.done_journal.stat().st_size == saved.journal_size
    campaign.close()
    campaign = opened(out)
    with open(campaign.done_journal, "ab") as journal:
        journal.write(b"0badc0de {}\nmore\n")
    with pytest.raises(CampaignError, match="corrupt state file"):
        campaign.open_journal(after=saved)


# -- compaction ------------------------------------------------------------------------------


def dispatch(item, token=TOKEN, epoch=0):
    return {"kind": "dispatch", "digest": item, "token": token, "generation": 0,
            **({"epoch": epoch} if epoch else {})}


def commit(item, epoch=0):
    return {"kind": "commit", "digest": item, "token": TOKEN, "generation": 0,
            **({"epoch": epoch} if epoch else {})}


def done(item, epoch=0):
    return {"digest": item, "token": TOKEN, "outcome": "ok", "time": 1.0,
            **({"epoch": epoch} if epoch else {})}


def test_only_the_records_of_work_that_went_cleanly_are_settled():
    a, b, c, d = (digest(x) for x in (b"a", b"b", b"c", b"d"))
    journal = [dispatch(a), commit(a), done(a),  # cleanly: 0, 1
               dispatch(b), {"kind": "requeue", "digest": b, "reason": "taken back"},
               dispatch(b), commit(b), done(b),  # twice, declared: kept
               dispatch(c), commit(c),  # in flight: kept
               {"kind": "epoch", "epoch": 1}, dispatch(a, epoch=1), commit(a, epoch=1),
               done(a, epoch=1),  # once in epoch 1: 11, 12
               dispatch(d), {"kind": "recovered", "generation": 1, "failed": [],
                             "requeued": [d]}, dispatch(d), done(d)]  # kept
    assert settled_work_lines(journal) == {0, 1, 11, 12}
    kept = [r for n, r in enumerate(journal) if n not in settled_work_lines(journal)]
    # What verify reads of the work records says the same of the compacted journal.
    corpus = {a, b, c, d}
    assert _check_work(kept, corpus, {})[0] == _check_work(journal, corpus, {})[0] == []


def test_the_journal_is_compacted_once_it_doubles_and_reads_back_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(done_log, "COMPACT_FLOOR", 4096)
    out = tmp_path / "out"
    campaign = opened(out, create=True)
    campaign.open_journal()
    inputs = [digest(b"%d" % n) for n in range(60)]
    dropped = 0
    for item in inputs:
        campaign.record_work(wal.Dispatch(digest=item, token=TOKEN, generation=0, rank=1))
        campaign.record_work(wal.Commit(digest=item, token=TOKEN, generation=0, rank=1,
                                        outcome="ok", exit_status=0, publish=[]))
        campaign.record_done(item, TOKEN, "ok")
        campaign.sync_done()
        dropped += campaign.compact_if_due()
    assert dropped > 0
    size = campaign.done_journal.stat().st_size
    campaign.close()  # its check of the file passes: the compaction is the owner's write
    records = CampaignDir(out).inspect_journal()[0]
    assert [r["digest"] for r in records if "kind" not in r] == inputs
    assert size < 60 * 300  # about a done record per execution, not three records
    assert not [p for p in os.listdir(campaign.state) if p.startswith(".tmp-")]


def test_a_resumed_journal_is_compacted_only_once_it_has_doubled(tmp_path, monkeypatch):
    """A resume does not read a large journal whole in its first rounds, before it
    dispatches: what it opened counts as compacted, and it compacts once that doubled."""
    monkeypatch.setattr(done_log, "COMPACT_FLOOR", 4096)
    out = tmp_path / "out"
    campaign = opened(out, create=True)
    campaign.open_journal()

    def analyse(item: str) -> None:
        campaign.record_work(wal.Dispatch(digest=item, token=TOKEN, generation=0, rank=1))
        campaign.record_work(wal.Commit(digest=item, token=TOKEN, generation=0, rank=1,
                                        outcome="ok", exit_status=0, publish=[]))
        campaign.record_done(item, TOKEN, "ok")
        campaign.sync_done()

    for n in range(40):  # no compaction: the journal as a crash can leave it
        analyse(digest(b"%d" % n))
    campaign.close()
    size_at_resume = campaign.done_journal.stat().st_size
    assert size_at_resume > 4096

    campaign = opened(out)
    campaign.open_journal()
    assert campaign.compact_if_due() == 0
    n = 40
    while campaign.done_journal.stat().st_size < 2 * size_at_resume:
        assert campaign.compact_if_due() == 0
        analyse(digest(b"%d" % n))
        n += 1
    assert campaign.compact_if_due() > 0
    campaign.close()
