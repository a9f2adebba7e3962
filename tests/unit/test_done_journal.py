"""The done journal (`state/done.jsonl`) on the checksummed LineLog: torn tails, corrupt
records in the middle, records without a checksum, read-only readers that never write, and
repair by the campaign's lock holder only."""

from __future__ import annotations

import hashlib
import os

import pytest

from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.layout import CampaignError, check_out_dir
from symcc_mpi.durable.journal import DamageKind, JournalCorrupt, LineLog, inspect
from symcc_mpi.durable.lines import encode_line

TOKEN = "ab" * 16


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record(n: int) -> dict:
    return {"digest": sha(b"%d" % n), "token": TOKEN, "outcome": "ok", "time": 1.5 + n}


@pytest.fixture
def out(tmp_path):
    campaign = CampaignDir(tmp_path / "out")
    check_out_dir(campaign.out, resume=False)
    campaign.create({})
    return campaign.out


def write_journal(out, data: bytes) -> bytes:
    (out / "state" / "done.jsonl").write_bytes(data)
    return data


def snapshot(out):
    """Every file under OUT with its bytes and mtime: what a reader must leave unchanged."""
    seen = {}
    for directory, _, names in os.walk(out):
        for name in names:
            path = os.path.join(directory, name)
            info = os.stat(path)
            seen[path] = (open(path, "rb").read(), info.st_mtime_ns)
    return seen


GOOD = b"".join(encode_line(record(n)) for n in range(3))
TORN = encode_line(record(3))[:-7]


def test_readers_report_a_torn_tail_and_write_nothing(out):
    write_journal(out, GOOD + TORN)
    before = snapshot(out)
    records, torn = CampaignDir(out).inspect_done()
    assert records == [record(n) for n in range(3)]
    assert torn.kind is DamageKind.TORN_TAIL and torn.line == 4 and torn.kept_at is None
    assert [r["digest"] for r in CampaignDir(out).read_done()] == [record(n)["digest"]
                                                                    for n in range(3)]
    assert snapshot(out) == before
    assert not (out / "quarantine").exists()


def test_a_torn_tail_is_repaired_only_by_the_lock_holder(out):
    write_journal(out, GOOD + TORN)
    reader = CampaignDir(out)
    with pytest.raises(CampaignError, match="only the process holding the campaign lock"):
        reader.open_done()
    assert (out / "state" / "done.jsonl").read_bytes() == GOOD + TORN
    owner = CampaignDir(out)
    owner.lock()
    try:
        assert owner.open_done() == [record(n) for n in range(3)]
        assert (out / "state" / "done.jsonl").read_bytes() == GOOD
        kept = list((out / "quarantine").glob("done.jsonl.line4.*"))
        assert len(kept) == 1 and kept[0].read_bytes() == TORN
        assert f"{out / 'state' / 'done.jsonl'}, line 4: torn-tail" in \
            (out / "quarantine" / "REASONS").read_text()
    finally:
        owner.close()


@pytest.mark.parametrize("damage", ["flipped byte", "not hex", "not a done record"])
def test_a_bad_record_in_the_middle_is_one_error_naming_file_and_line(out, damage):
    lines = [encode_line(record(n)) for n in range(3)]
    if damage == "flipped byte":
        lines[1] = lines[1].replace(b'"ok"', b'"OK"')
    elif damage == "not hex":
        lines[1] = b"zzzzzzzz" + lines[1][8:]
    else:
        lines[1] = encode_line({"digest": "short", "token": TOKEN})
    write_journal(out, b"".join(lines))
    before = snapshot(out)
    for read in (lambda c: c.read_done(), lambda c: c.inspect_done()):
        with pytest.raises(CampaignError, match=r"done\.jsonl, line 2: "):
            read(CampaignDir(out))
    owner = CampaignDir(out)
    owner.lock()
    try:
        with pytest.raises(CampaignError, match=r"done\.jsonl, line 2: "):
            owner.open_done()
    finally:
        owner.close()
    after = snapshot(out)
    after.pop(str(out / "state" / "master.lock"))
    before.pop(str(out / "state" / "master.lock"), None)
    assert after == before  # refused, not repaired: every record is kept for the user


def test_a_campaign_of_records_without_checksums_is_refused_in_one_line(out):
    import json

    plain = b"".join(json.dumps(record(n)).encode() + b"\n" for n in range(2))
    write_journal(out, plain)
    owner = CampaignDir(out)
    owner.lock()
    try:
        with pytest.raises(CampaignError, match=r"done\.jsonl, line 1: a record without a "
                                                r"checksum \(written by an older symcc-mpi\)"):
            owner.open_done()
    finally:
        owner.close()
    assert (out / "state" / "done.jsonl").read_bytes() == plain
    # Even a single such line, last in the file, is no torn append: it is never cut.
    write_journal(out, plain.splitlines(keepends=True)[0])
    with pytest.raises(CampaignError, match="line 1: a record without a checksum"):
        CampaignDir(out).read_done()


def test_the_owner_sees_whether_the_file_is_what_it_wrote(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_bytes(GOOD)
    log = LineLog(path, fsync=False, strict=True)
    log.load(lambda r: None)
    log.open_for_append()
    log.extend([record(7), record(8)])
    assert log.changed_behind_our_back() is None
    assert log.content_digest == hashlib.sha256(path.read_bytes()).hexdigest()
    with open(path, "r+b") as handle:  # a reader that cut the last line
        handle.truncate(len(GOOD))
    assert "holds" in log.changed_behind_our_back()
    log.close()


def test_extend_writes_a_group_in_one_write_and_strict_load_refuses_corruption(tmp_path):
    writes = []

    def writer(fd, data):
        writes.append(data)
        os.write(fd, data)

    path = tmp_path / "j.jsonl"
    log = LineLog(path, fsync=False, writer=writer, strict=True)
    log.load(lambda r: None)
    log.open_for_append()
    log.extend([record(n) for n in range(4)])
    assert len(writes) == 1 and log.lines == 4
    log.close()
    data = path.read_bytes()
    path.write_bytes(data.replace(b"ok", b"ko", 1))
    with pytest.raises(JournalCorrupt, match="line 1: checksum mismatch"):
        LineLog(path, fsync=False, strict=True).load(lambda r: None)
    assert path.read_bytes() == data.replace(b"ok", b"ko", 1)
    damage = inspect(path, lambda r: None)
    assert [(d.line, d.kind) for d in damage] == [(1, DamageKind.CORRUPT_LINE)]
