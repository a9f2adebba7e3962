"""A campaign directory of layout 1 (its journal names an input's SHA-256 `sha256`; done
records with no "kind", F443's work records beside them) is resumed and verified as it was,
one of a newer layout is refused, and the records this version writes are pinned byte for
byte (campaign/wal.py).
No MPI: the master's resume (job/assembly.open_master) over a fake channel."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from symcc_mpi.campaign import wal
from symcc_mpi.campaign.afl_names import afl_queue_name
from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.layout import (
    LAYOUT_VERSION,
    MARKER,
    CampaignError,
    check_out_dir,
    layout_of,
)
from symcc_mpi.campaign.verify import verify_campaign
from symcc_mpi.config import CampaignConfig


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


SEEDS = [b"seed-0", b"seed-1", b"seed-2"]
CHILD = b"child of seed-0"
S0, S1, S2 = map(digest, SEEDS)
C0 = digest(CHILD)
TOKENS = [f"{n:032x}" for n in range(1, 5)]

# Written in layout 1 (campaign/layout.py: an input's SHA-256 named `sha256`), byte for byte:
# seed-0 analysed (its child published), seed-1 dispatched to a rank that died, requeued by a
# recovery, dispatched again and analysed (a crash), seed-2 in flight when the run ended.
OLD_JOURNAL = (
    b'710d0f31 {"generation":0,"kind":"dispatch","rank":1,"sha256":"8efd6168a055d1e45863c237'
    b'eb3feab2be94f10b7ccdc5bf8bb54305c8b19f7f","token":"00000000000000000000000000000001"}\n'
    b'16ccf26d {"exit_status":0,"generation":0,"kind":"commit","outcome":"ok","publish":[["1a'
    b'9f4a2c30de12da8c8f53e39767ba5e610fa98bb70687d47e03594cffc1e006",15,"ok"]],"rank":1,"sh'
    b'a256":"8efd6168a055d1e45863c237eb3feab2be94f10b7ccdc5bf8bb54305c8b19f7f","token":"0000'
    b'0000000000000000000000000001"}\n'
    b'41a01795 {"outcome":"ok","published":["1a9f4a2c30de12da8c8f53e39767ba5e610fa98bb70687d'
    b'47e03594cffc1e006"],"sha256":"8efd6168a055d1e45863c237eb3feab2be94f10b7ccdc5bf8bb54305'
    b'c8b19f7f","time":1700000000.125,"token":"00000000000000000000000000000001"}\n'
    b'cfe393c2 {"generation":0,"kind":"dispatch","rank":2,"sha256":"0eb026731d9ea3f870511f8c'
    b'18daeb814eaa2c9e276082b204f2a962212fb5bd","token":"00000000000000000000000000000002"}\n'
    b'b6757a0c {"failed":["host/101/1"],"generation":1,"kind":"recovered","master":"kept","r'
    b'equeued":["0eb026731d9ea3f870511f8c18daeb814eaa2c9e276082b204f2a962212fb5bd"],"second'
    b's":0.5}\n'
    b'52959e76 {"generation":1,"kind":"dispatch","rank":1,"sha256":"0eb026731d9ea3f870511f8c'
    b'18daeb814eaa2c9e276082b204f2a962212fb5bd","token":"00000000000000000000000000000003"}\n'
    b'96374e13 {"exit_status":null,"generation":1,"kind":"commit","outcome":"crash","publish'
    b'":[],"rank":1,"sha256":"0eb026731d9ea3f870511f8c18daeb814eaa2c9e276082b204f2a962212fb5'
    b'bd","token":"00000000000000000000000000000003"}\n'
    b'e1cd6532 {"generation":1,"outcome":"crash","sha256":"0eb026731d9ea3f870511f8c18daeb814'
    b'eaa2c9e276082b204f2a962212fb5bd","time":1700000001.5,"token":"000000000000000000000000'
    b'00000003"}\n'
    b'44430723 {"generation":1,"kind":"dispatch","rank":2,"sha256":"532b20b0105c9883348558ed'
    b'2711c7d23ea6b4ee718364a87e16fad4b3c3a029","token":"00000000000000000000000000000004"}\n'
)

# The records OLD_JOURNAL holds, as this version's writers make them.
RECORDS = [
    wal.Dispatch(digest=S0, token=TOKENS[0], generation=0, rank=1),
    wal.Commit(digest=S0, token=TOKENS[0], generation=0, rank=1, outcome="ok", exit_status=0,
               publish=[[C0, 15, "ok"]]),
    wal.Done(digest=S0, token=TOKENS[0], outcome="ok", time=1700000000.125, published=[C0]),
    wal.Dispatch(digest=S1, token=TOKENS[1], generation=0, rank=2),
    wal.Recovered(generation=1, failed=["host/101/1"], requeued=[S1], master="kept",
                  seconds=0.5),
    wal.Dispatch(digest=S1, token=TOKENS[2], generation=1, rank=1),
    wal.Commit(digest=S1, token=TOKENS[2], generation=1, rank=1, outcome="crash",
               exit_status=None, publish=[]),
    wal.Done(digest=S1, token=TOKENS[2], outcome="crash", time=1700000001.5, generation=1),
    wal.Dispatch(digest=S2, token=TOKENS[3], generation=1, rank=2),
]


# The same records as this version's writers make them (roles/records.py, done_log.py), in
# layout 2, byte for byte.
JOURNAL = (
    b'1b2ebff7 {"digest":"8efd6168a055d1e45863c237eb3feab2be94f10b7ccdc5bf8bb54305c8b19f7f",'
    b'"generation":0,"kind":"dispatch","rank":1,"token":"00000000000000000000000000000001"}\n'
    b'ba86abb7 {"digest":"8efd6168a055d1e45863c237eb3feab2be94f10b7ccdc5bf8bb54305c8b19f7f",'
    b'"exit_status":0,"generation":0,"kind":"commit","outcome":"ok","publish":[["1a9f4a2c30d'
    b'e12da8c8f53e39767ba5e610fa98bb70687d47e03594cffc1e006",15,"ok"]],"rank":1,"token":"000'
    b'00000000000000000000000000001"}\n'
    b'92cd4f59 {"digest":"8efd6168a055d1e45863c237eb3feab2be94f10b7ccdc5bf8bb54305c8b19f7f",'
    b'"outcome":"ok","published":["1a9f4a2c30de12da8c8f53e39767ba5e610fa98bb70687d47e03594cf'
    b'fc1e006"],"time":1700000000.125,"token":"00000000000000000000000000000001"}\n'
    b'0f720566 {"digest":"0eb026731d9ea3f870511f8c18daeb814eaa2c9e276082b204f2a962212fb5bd",'
    b'"generation":0,"kind":"dispatch","rank":2,"token":"00000000000000000000000000000002"}\n'
    b'b6757a0c {"failed":["host/101/1"],"generation":1,"kind":"recovered","master":"kept","r'
    b'equeued":["0eb026731d9ea3f870511f8c18daeb814eaa2c9e276082b204f2a962212fb5bd"],"seconds'
    b'":0.5}\n'
    b'9f704250 {"digest":"0eb026731d9ea3f870511f8c18daeb814eaa2c9e276082b204f2a962212fb5bd",'
    b'"generation":1,"kind":"dispatch","rank":1,"token":"00000000000000000000000000000003"}\n'
    b'457bfac0 {"digest":"0eb026731d9ea3f870511f8c18daeb814eaa2c9e276082b204f2a962212fb5bd",'
    b'"exit_status":null,"generation":1,"kind":"commit","outcome":"crash","publish":[],"rank'
    b'":1,"token":"00000000000000000000000000000003"}\n'
    b'3558a382 {"digest":"0eb026731d9ea3f870511f8c18daeb814eaa2c9e276082b204f2a962212fb5bd",'
    b'"generation":1,"outcome":"crash","time":1700000001.5,"token":"000000000000000000000000'
    b'00000003"}\n'
    b'dab45ee9 {"digest":"532b20b0105c9883348558ed2711c7d23ea6b4ee718364a87e16fad4b3c3a029",'
    b'"generation":1,"kind":"dispatch","rank":2,"token":"00000000000000000000000000000004"}\n'
)


class FakeChannel:
    size = 3

    def __init__(self):
        self.sent = []

    def send(self, dest, tag, message):
        self.sent.append((dest, tag, message))


def old_campaign(out: Path) -> None:
    """OUT as the earlier version left it: corpus/, queue/ links, crashes/, the journal."""
    campaign = CampaignDir(out)
    campaign.create({"test": True})
    for number, data in enumerate([*SEEDS, CHILD]):
        (campaign.corpus / digest(data)).write_bytes(data)
        source = () if number < len(SEEDS) else (0,)
        name = afl_queue_name(number, source, orig=f"s{number}" if not source else None)
        os.link(campaign.corpus / digest(data), campaign.queue / name)
    os.link(campaign.corpus / S1, campaign.crashes / afl_queue_name(0, (1,), sig=11))
    campaign.done_journal.write_bytes(OLD_JOURNAL)
    set_layout(out, 1)


def set_layout(out: Path, layout: int) -> None:
    marker = json.loads((out / MARKER).read_bytes())
    (out / MARKER).write_text(json.dumps({**marker, "layout": layout}))


def test_this_version_writes_layout_2_byte_for_byte():
    from symcc_mpi.durable.lines import encode_line

    assert b"".join(encode_line(wal.encode(record)) for record in RECORDS) == JOURNAL
    assert [wal.kind_of(wal.encode(record)) for record in RECORDS][2] is wal.Kind.DONE


def test_an_old_journal_reads_and_verifies(tmp_path):
    out = tmp_path / "out"
    old_campaign(out)
    records, torn = wal.read(out / "state" / "done.jsonl")
    assert torn is None and records == [wal.encode(record) for record in RECORDS]
    assert [r["digest"] for r in records if wal.is_done(r)] == [S0, S1]
    assert wal.outstanding(records) == {S2}
    problems, facts = verify_campaign(out)
    assert problems == []
    assert facts["analysed (unique)"] == 2 and facts["dispatches"] == 4
    assert facts["dispatched again (declared)"] == 1 and facts["in flight at failures"] == 1
    assert facts["out at the end"] == 1 and facts["done journal"] == "intact"


def test_an_old_campaign_resumes_and_verifies(tmp_path):
    from symcc_mpi.job.assembly import open_master

    out = tmp_path / "out"
    old_campaign(out)
    config = CampaignConfig(target=("t",), seeds=None, out=out, executor="noop", resume=True)
    master = open_master(FakeChannel(), config, fault_tolerant=True)
    try:
        assert master.in_flight_at_takeover == [S2]
        assert set(master.frontier.done) == {S0, S1}
        assert set(master.frontier.pending) == {S2, C0}
        assert master.campaign.crash_digests == {S1} and master.campaign.queue_entries == 4
        master.campaign.record_done(S2, TOKENS[3], "ok", 1)
        master.campaign.sync_done()
    finally:
        master.close()
    journal = (out / "state" / "done.jsonl").read_bytes()
    assert journal.startswith(OLD_JOURNAL)  # the old records are kept as they were
    assert layout_of(out) == LAYOUT_VERSION == 2  # and OUT says a layout 2 writer appended
    records, _ = wal.read(out / "state" / "done.jsonl")
    requeue, done = records[len(RECORDS):]
    assert requeue == {"kind": "requeue", "digest": S2, "reason": "the last run ended"}
    assert wal.kind_of(done) is wal.Kind.DONE and done["digest"] == S2
    problems, facts = verify_campaign(out)
    assert problems == []
    assert facts["analysed (unique)"] == 3 and facts["out at the end"] == 0


def test_a_newer_layout_is_refused_by_resume_and_verify(tmp_path):
    out = tmp_path / "out"
    old_campaign(out)
    set_layout(out, 3)
    for refuse in (lambda: check_out_dir(out, resume=True), lambda: verify_campaign(out)):
        with pytest.raises(CampaignError, match="layout 3, which this symcc-mpi cannot read"):
            refuse()
    (out / MARKER).write_text("{")
    with pytest.raises(CampaignError, match="is damaged: it names no layout version"):
        verify_campaign(out)
