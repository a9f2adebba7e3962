"""The campaign directory: output-dir checks, staging verification, done journal replay."""

import os
from pathlib import Path

import pytest

from symcc_mpi.campaign import verify
from symcc_mpi.campaign.corpus import CampaignDir, CorruptInput
from symcc_mpi.campaign.layout import CampaignError, check_out_dir, sha256_bytes
from symcc_mpi.wire.staging import PackRejected, write_entries

TOKEN = "ab" * 16


@pytest.fixture
def campaign(tmp_path):
    c = CampaignDir(tmp_path / "out")
    check_out_dir(c.out, resume=False)
    c.create({"test": True})
    c.lock()
    yield c
    c.close()


def stage(c: CampaignDir, data: bytes, token=TOKEN) -> str:
    d = sha256_bytes(data)
    write_entries(Path(c.staged_pack(token)), [(d, data)])
    return d


def verified(c: CampaignDir, digest: str, token=TOKEN) -> bytes:
    with c.open_staged(token) as pack:
        return pack.read(digest)


def test_foreign_directory_is_refused(tmp_path):
    (tmp_path / "mine.txt").write_text("precious")
    with pytest.raises(CampaignError, match="not empty"):
        check_out_dir(tmp_path, resume=False)
    assert (tmp_path / "mine.txt").read_text() == "precious"


def test_existing_campaign_needs_resume(campaign):
    with pytest.raises(CampaignError, match="--resume"):
        check_out_dir(campaign.out, resume=False)
    check_out_dir(campaign.out, resume=True)


def test_resume_without_campaign(tmp_path):
    with pytest.raises(CampaignError, match="no symcc-mpi campaign"):
        check_out_dir(tmp_path / "nothing", resume=True)


def test_unwritable_output(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CampaignError):
        check_out_dir(blocker / "out", resume=False)
    with pytest.raises(CampaignError, match="not writable"):
        check_out_dir(Path("/proc/self/symcc-out"), resume=False)  # even root cannot write


def test_second_master_is_refused(campaign):
    other = CampaignDir(campaign.out)
    with pytest.raises(CampaignError, match="another campaign"):
        other.lock()


def test_verify_and_promote(campaign):
    d = stage(campaign, b"child")
    data = verified(campaign, d)
    assert data == b"child"
    assert campaign.promote(d, data)
    assert (campaign.corpus / d).read_bytes() == b"child"
    assert not campaign.promote(d, data)  # already public: nothing to do


def test_tampered_staging_is_rejected(campaign):
    d = sha256_bytes(b"child")
    write_entries(Path(campaign.staged_pack(TOKEN)), [(d, b"chilD")])
    with pytest.raises(PackRejected, match="do not match"):
        verified(campaign, d)
    with pytest.raises(PackRejected, match="no staged pack"):
        verified(campaign, d, token="9" * 32)


def test_staging_path_cannot_escape(campaign):
    with pytest.raises(ValueError):
        campaign.staged_pack("../../etc")
    with pytest.raises(ValueError):
        campaign.open_staged("../../etc")


def test_done_journal_replays_and_drops_a_torn_tail(campaign):
    campaign.record_done("a" * 64, TOKEN, "ok")
    campaign.record_done("b" * 64, TOKEN, "crash")
    campaign.close()
    with open(campaign.done_journal, "ab") as handle:
        handle.write(b'5f3a09c1 {"outcome":"ok","sha256":"cccc')  # killed mid-append
    torn = campaign.done_journal.read_bytes()

    # A reader (no lock) sees the records, reports the torn line and leaves it in place.
    records, damage = campaign.inspect_done()
    assert [r["digest"] for r in records] == ["a" * 64, "b" * 64]
    assert damage.line == 3 and damage.kept_at is None
    assert [r["digest"] for r in campaign.read_done()] == ["a" * 64, "b" * 64]
    assert campaign.done_journal.read_bytes() == torn
    assert not campaign.quarantine.exists()

    # The lock holder cuts it, and keeps it in quarantine/ under the journal's name and line.
    campaign.lock()
    records = campaign.open_done()
    assert [r["digest"] for r in records] == ["a" * 64, "b" * 64]
    assert campaign.done_journal.read_bytes() == torn[:torn.rindex(b"\n") + 1]
    kept = [p for p in campaign.quarantine.iterdir() if p.name.startswith("done.jsonl.line3.")]
    assert len(kept) == 1 and kept[0].read_bytes() == torn[torn.rindex(b"\n") + 1:]
    reasons = (campaign.quarantine / "REASONS").read_text()
    assert f"{kept[0].name}: {campaign.done_journal}, line 3: torn-tail" in reasons
    campaign.record_done("c" * 64, TOKEN, "ok")
    campaign.close()
    assert [r["digest"] for r in campaign.read_done()] == ["a" * 64, "b" * 64, "c" * 64]


def test_corrupt_done_journal_names_file_and_line(campaign):
    campaign.record_done("a" * 64, TOKEN, "ok")
    campaign.close()
    with open(campaign.done_journal, "ab") as handle:
        handle.write(b"garbage\n")
        handle.write(b'{"sha256": "' + b"d" * 64 + b'"}\n')
    with pytest.raises(CampaignError, match=r"done\.jsonl, line 2"):
        campaign.read_done()


def test_misnamed_corpus_file_is_quarantined_not_dropped(campaign):
    good = campaign.add_seed(b"seed", "s1")
    (campaign.corpus / "not-a-digest").write_bytes(b"stray")
    assert campaign.corpus_digests() == {good}
    assert (campaign.quarantine / "corpus-not-a-digest").read_bytes() == b"stray"


def test_corpus_file_whose_bytes_do_not_match_is_quarantined_when_read(campaign):
    # A resume does not hash the corpus (a cold 100k-input corpus takes ~15 s): an input's
    # bytes are checked whenever they are read to be sent.
    good = campaign.add_seed(b"seed", "s1")
    (campaign.corpus / ("f" * 64)).write_bytes(b"not matching")
    assert campaign.read_input(good) == b"seed"
    with pytest.raises(CorruptInput, match="f{12}"):
        campaign.read_input("f" * 64)
    assert not (campaign.corpus / ("f" * 64)).exists()
    assert (campaign.quarantine / f"corpus-{'f' * 64}").read_bytes() == b"not matching"


def test_verify_of_a_live_campaign_skips_writes_in_progress_and_inputs_quarantined_meanwhile(
        campaign, monkeypatch):
    seeds = [campaign.add_seed(data, name) for data, name in ((b"a", "s1"), (b"b", "s2"))]
    # A master's atomic write of a child: its temporary name, half its bytes.
    (campaign.corpus / f".tmp-{'c' * 64}.123.4").write_bytes(b"hal")
    real_sha256_file = verify.sha256_file

    def quarantined_first(path):
        # The live master quarantines the first input between the listing and its read.
        if path.name == min(seeds):
            campaign._quarantine(path, "test")
        return real_sha256_file(path)

    monkeypatch.setattr(verify, "sha256_file", quarantined_first)
    problems, facts = verify.verify_campaign(campaign.out)
    assert problems == []
    assert facts["corpus inputs"] == 1


def test_queue_names_and_resume_numbering(campaign):
    seed = campaign.add_seed(b"seed", "my,seed")
    d = stage(campaign, b"child")
    campaign.promote(d, verified(campaign, d))
    campaign.add_to_queue(d, seed)
    names = sorted(p.name for p in campaign.queue.iterdir())
    assert names == ["id:000000,orig:my_seed", "id:000001,src:000000,op:symcc"]
    reopened = CampaignDir(campaign.out)
    reopened.read_queues()
    assert (reopened.inputs.queue_id(seed), reopened.inputs.queue_id(d)) == (0, 1)
    assert reopened._take_id("queue") == 2
    assert os.path.samefile(campaign.corpus / d, campaign.queue / names[1])


def damage(campaign: CampaignDir, digest: str) -> None:
    """What a power failure can leave: corpus/<digest> and its queue/ entry, one inode,
    named and empty (another master's fsync of corpus/ made the names durable)."""
    os.truncate(campaign.corpus / digest, 0)
    with pytest.raises(CorruptInput):
        campaign.read_input(digest)


@pytest.mark.parametrize("found_by", ["this master", "another master"])
def test_a_damaged_queue_entry_links_the_input_published_again_under_its_id(campaign,
                                                                            found_by):
    seed = campaign.add_seed(b"seed", "s")
    child = stage(campaign, b"child")
    campaign.promote(child, verified(campaign, child))
    campaign.add_to_queue(child, seed)
    entry = campaign.queue / "id:000001,src:000000,op:symcc"
    damage(campaign, child)
    assert entry.read_bytes() == b""
    # Its parent, whose done record was lost, is analysed again and yields it again.
    assert campaign.promote(child, b"child")
    if found_by == "this master":
        campaign.add_to_queue(child, seed)
    else:
        assert campaign.queue_finding(child, seed)
    assert sorted(p.name for p in campaign.queue.iterdir()) == [
        "id:000000,orig:s", entry.name]
    assert os.path.samefile(campaign.corpus / child, entry)
    assert campaign.inputs.queue_id(child) == 1
    assert not campaign.queue_finding(child, seed)  # named once
    assert campaign.queue_entries == 2


def test_a_damaged_queue_entry_is_repaired_after_a_resume_too(campaign):
    seed = campaign.add_seed(b"seed", "s")
    child = stage(campaign, b"child")
    campaign.promote(child, verified(campaign, child))
    campaign.add_to_queue(child, seed)
    damage(campaign, child)
    reopened = CampaignDir(campaign.out)
    reopened.read_queues()  # the damaged entry hashes to the empty input's digest
    assert reopened.promote(child, b"child")
    reopened.add_to_queue(child, seed)
    assert (reopened.inputs.queue_id(child), reopened.queue_entries) == (1, 2)
    assert os.path.samefile(reopened.corpus / child,
                            reopened.queue / "id:000001,src:000000,op:symcc")


def test_findings_are_saved_once(campaign):
    seed = campaign.add_seed(b"boom", "s")
    assert campaign.save_finding("crashes", seed, seed, 11)
    assert not campaign.save_finding("crashes", seed, seed, 11)
    assert [p.name for p in campaign.crashes.iterdir()] == ["id:000000,sig:11,src:000000,op:symcc"]
