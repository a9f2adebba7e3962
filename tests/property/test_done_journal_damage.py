"""Property: whatever a crash or a flipped byte does to the done journal, a reader (no lock)
never writes a byte of the campaign and either reads every whole record before the damage
or names the damaged line; the lock holder cuts exactly a torn tail, keeps it in quarantine,
and appends after it as if nothing had happened."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.layout import CampaignError
from symcc_mpi.durable.lines import encode_line

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def record(n: int) -> dict:
    return {"digest": hashlib.sha256(b"%d" % n).hexdigest(), "token": "cd" * 16,
            "outcome": "ok", "time": float(n)}


def campaign_with(data: bytes) -> Path:
    out = Path(tempfile.mkdtemp(prefix="done-journal-")) / "out"
    CampaignDir(out).create({})
    (out / "state" / "done.jsonl").write_bytes(data)
    return out


def files(out: Path) -> dict:
    seen = {}
    for directory, _, names in os.walk(out):
        for name in names:
            path = os.path.join(directory, name)
            seen[path] = (Path(path).read_bytes(), os.stat(path).st_mtime_ns)
    return seen


@SETTINGS
@given(count=st.integers(1, 6), cut=st.integers(0, 10_000))
def test_a_crash_mid_append_loses_at_most_the_torn_line(count, cut):
    lines = [encode_line(record(n)) for n in range(count)]
    whole = b"".join(lines)
    cut %= len(whole) + 1
    out = campaign_with(whole[:cut])
    try:
        before = files(out)
        records, torn = CampaignDir(out).inspect_done()
        assert files(out) == before  # the reader wrote nothing
        complete = sum(1 for end in _ends(lines) if end <= cut)
        assert records == [record(n) for n in range(complete)]
        at_boundary = cut in (0, *_ends(lines))
        assert (torn is None) == at_boundary

        owner = CampaignDir(out)
        owner.lock()
        assert owner.open_done() == records
        kept = b"".join(p.read_bytes() for p in (out / "quarantine").glob("done.jsonl.line*")) \
            if (out / "quarantine").exists() else b""
        assert kept == whole[sum(len(x) for x in lines[:complete]):cut]  # nothing dropped
        owner.record_done(record(99)["digest"], "ef" * 16, "crash")
        owner.close()
        assert [r["digest"] for r in CampaignDir(out).read_done()] == \
            [r["digest"] for r in records] + [record(99)["digest"]]
    finally:
        shutil.rmtree(out.parent)


@SETTINGS
@given(count=st.integers(1, 6), position=st.integers(0, 10_000), byte=st.integers(0, 255))
@example(count=2, position=5, byte=ord("E"))  # CI's: the checksum's "e" as "E" still parsed
def test_a_flipped_byte_is_named_by_its_line_or_is_a_torn_tail(count, position, byte):
    lines = [encode_line(record(n)) for n in range(count)]
    whole = bytearray(b"".join(lines))
    position %= len(whole)
    if whole[position] == ord("\n") or byte in (ord("\n"), whole[position]):
        return  # a newline moved is a different line structure, not a flipped byte
    whole[position] = byte
    damaged_line = next(n for n, end in enumerate(_ends(lines), start=1) if position < end)
    out = campaign_with(bytes(whole))
    try:
        before = files(out)
        try:
            records, torn = CampaignDir(out).inspect_done()
        except CampaignError as error:
            assert f"done.jsonl, line {damaged_line}: " in str(error)
        else:
            # Only the last line may read as torn (a crash cannot tell a flip there from a cut).
            assert damaged_line == count and torn.line == count
            assert records == [record(n) for n in range(count - 1)]
        assert files(out) == before
    finally:
        shutil.rmtree(out.parent)


def _ends(lines: list[bytes]) -> list[int]:
    ends, total = [], 0
    for line in lines:
        total += len(line)
        ends.append(total)
    return ends

