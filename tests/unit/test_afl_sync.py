"""The fuzzers' side of a hybrid campaign: reading AFL++ queues, ranking, importing once."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from symcc_mpi.campaign.afl_sync import (
    AFL_MAX_FILE,
    CURSORS_FILE,
    FleetQueues,
    Importer,
    check_instance_name,
    helper_rank,
    load_cursors,
)
from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.layout import sha256_bytes
from symcc_mpi.durable.clock import ManualClock
from symcc_mpi.scheduling.frontier import Frontier


def afl_entry(sync_dir, instance: str, name: str, data: bytes, *, age: float = 60.0):
    queue = sync_dir / instance / "queue"
    queue.mkdir(parents=True, exist_ok=True)
    path = queue / name
    path.write_bytes(data)
    then = 1_000_000.0 - age
    os.utime(path, (then, then))
    return path


def campaign_in(sync_dir, name="symcc-mpi") -> CampaignDir:
    campaign = CampaignDir(sync_dir / name)
    campaign.create({})
    campaign.keep_queue_names = True
    return campaign


def importer_for(sync_dir, campaign, cursors=None, clock=None) -> Importer:
    fleet = FleetQueues(sync_dir, campaign.out.name, cursors or {},
                        clock=clock or ManualClock(1_000_000.0))
    importer = Importer(campaign, campaign.inputs, fleet)
    campaign.inputs.rank_by(importer.priority)
    return importer


def test_the_helpers_ranking_new_coverage_then_seeds_then_small_then_new():
    names = {
        "id:000003,src:000001,op:havoc,+cov": 50,
        "id:000004,src:000001,op:havoc": 1,
        "id:000000,time:0,execs:0,orig:seed": 10,
        "id:000005,src:000002,op:havoc,+cov": 50,
        "id:000006,src:000002,op:havoc,+cov": 5,
        "id:000007,src:000003,op:symcc": 70,  # the campaign's own child: it added coverage
    }
    ranked = sorted(names, key=lambda n: helper_rank(n, names[n], int(n[3:9])))
    assert ranked == [
        "id:000006,src:000002,op:havoc,+cov",
        "id:000005,src:000002,op:havoc,+cov",  # newer first among equals, as the helper
        "id:000003,src:000001,op:havoc,+cov",
        "id:000007,src:000003,op:symcc",
        "id:000000,time:0,execs:0,orig:seed",
        "id:000004,src:000001,op:havoc",
    ]


@pytest.mark.parametrize("name", ["", "a b", "../x", "x/y", "ünï", "x" * 65])
def test_instance_names_afl_would_refuse_are_refused(name):
    with pytest.raises(ValueError, match="--name"):
        check_instance_name(name)


def test_scan_reads_every_other_instance_from_its_cursor_in_id_order(tmp_path):
    for entry_id in (2, 0, 1):
        afl_entry(tmp_path, "main", f"id:{entry_id:06d},src:000000,op:havoc", b"m%d" % entry_id)
    afl_entry(tmp_path, "sec", "id:000000,orig:a", b"s0")
    afl_entry(tmp_path, "symcc-mpi", "id:000000,orig:ours", b"ours")  # its own: never read
    afl_entry(tmp_path, ".hidden", "id:000000,orig:x", b"x")
    (tmp_path / "main" / "queue" / ".state").mkdir()  # afl-fuzz's own bookkeeping
    (tmp_path / "notes.txt").write_text("not an instance")
    fleet = FleetQueues(tmp_path, "symcc-mpi", {"main": 1}, clock=ManualClock(1_000_000.0))
    assert fleet.instances() == ["main", "sec"]
    found = fleet.scan(limit=10)
    assert [(e.instance, e.entry_id) for e in found] == [("main", 1), ("main", 2), ("sec", 0)]
    for entry in found:
        fleet.advance(entry)
    assert fleet.cursors == {"main": 3, "sec": 1}
    assert fleet.scan(limit=10) == []


def test_an_entry_too_young_to_be_whole_waits_and_so_do_those_after_it(tmp_path):
    afl_entry(tmp_path, "main", "id:000000,orig:a", b"a")
    afl_entry(tmp_path, "main", "id:000001,src:000000", b"b", age=0.2)
    afl_entry(tmp_path, "main", "id:000002,src:000000", b"c")
    clock = ManualClock(1_000_000.0)
    fleet = FleetQueues(tmp_path, "symcc-mpi", {}, clock=clock)
    first = fleet.scan(limit=10)
    assert [e.entry_id for e in first] == [0]
    fleet.advance(first[0])
    clock.advance(5)  # the queue/ did not change, but the scan stopped short: read it again
    assert [e.entry_id for e in fleet.scan(limit=10)] == [1, 2]


def test_entries_written_before_the_clock_was_set_back_are_read_once_settled(tmp_path):
    """Found by the simulation (seed 148): after the clock was set back 1506 s, every entry
    the fuzzers had written looked written in the future, too young to be whole, for 25
    minutes. An entry seen unchanged for the settling time is whole whatever its mtime."""
    afl_entry(tmp_path, "main", "id:000000,orig:a", b"a", age=-1506.0)
    clock = ManualClock(1_000_000.0)
    fleet = FleetQueues(tmp_path, "symcc-mpi", {}, clock=clock)
    assert fleet.scan(limit=10) == []
    clock.advance(0.5)
    assert fleet.scan(limit=10) == []
    clock.advance(0.5)
    assert [e.entry_id for e in fleet.scan(limit=10)] == [0]


def test_an_entry_still_growing_waits_however_old_its_mtime_looks(tmp_path):
    path = afl_entry(tmp_path, "main", "id:000000,orig:a", b"a", age=-600.0)
    clock = ManualClock(1_000_000.0)
    fleet = FleetQueues(tmp_path, "symcc-mpi", {}, clock=clock)
    assert fleet.scan(limit=10) == []
    clock.advance(0.8)
    path.write_bytes(b"ab")  # afl-fuzz still writing: the settling time starts again
    then = clock.time() + 600.0
    os.utime(path, (then, then))
    clock.advance(0.8)
    assert fleet.scan(limit=10) == []  # changed since the last scan: settling from now
    clock.advance(0.9)
    assert fleet.scan(limit=10) == []
    clock.advance(0.1)
    assert [e.entry_id for e in fleet.scan(limit=10)] == [0]


def test_the_limit_leaves_the_rest_for_the_next_scan(tmp_path):
    for entry_id in range(5):
        afl_entry(tmp_path, "main", f"id:{entry_id:06d},src:000000", b"%d" % entry_id)
    fleet = FleetQueues(tmp_path, "symcc-mpi", {}, clock=ManualClock(1_000_000.0))
    seen = []
    while batch := fleet.scan(limit=2):
        seen += [e.entry_id for e in batch]
        for entry in batch:
            fleet.advance(entry)
    assert seen == [0, 1, 2, 3, 4]


def test_imports_are_named_with_afl_provenance_and_held_once_by_content(tmp_path):
    campaign = campaign_in(tmp_path)
    afl_entry(tmp_path, "main", "id:000000,time:0,execs:0,orig:seed", b"same bytes")
    afl_entry(tmp_path, "main", "id:000001,src:000000,op:havoc,rep:2,+cov", b"new edge")
    afl_entry(tmp_path, "sec", "id:000000,time:0,execs:0,orig:seed", b"same bytes")
    importer = importer_for(tmp_path, campaign)
    assert importer.round(now=0.0) == 2
    assert sorted(os.listdir(campaign.queue)) == [
        "id:000000,sync:main,src:000000",
        "id:000001,sync:main,src:000001,+cov",
    ]
    for data in (b"same bytes", b"new edge"):
        digest = sha256_bytes(data)
        assert (campaign.corpus / digest).read_bytes() == data
        assert digest in campaign.inputs.known
    assert importer.stats.duplicates == 1  # sec's seed: main's under another name
    assert dict(importer.stats.imported) == {"main": 2}
    # The +cov entry is analysed first, as the helper would.
    assert campaign.inputs.take() == sha256_bytes(b"new edge")


def test_what_a_fuzzer_took_from_the_campaign_is_not_imported_back(tmp_path):
    campaign = campaign_in(tmp_path)
    importer = importer_for(tmp_path, campaign)
    campaign.inputs.add(campaign.add_seed(b"our find", "seed"))
    afl_entry(tmp_path, "main", "id:000007,sync:symcc-mpi,src:000000", b"our find")
    assert importer.round(now=0.0) == 0
    assert importer.stats.duplicates == 1
    assert importer.figures(fresh=True)["imported_by"] == {"main": 1}


def test_an_entry_that_is_not_a_regular_file_or_too_large_is_skipped_and_counted(tmp_path):
    campaign = campaign_in(tmp_path)
    queue = tmp_path / "main" / "queue"
    queue.mkdir(parents=True)
    (queue / "id:000000,orig:link").symlink_to("/etc/passwd")
    (queue / "id:000001,orig:dir").mkdir()
    for odd in ("id:000000,orig:link", "id:000001,orig:dir"):
        os.utime(queue / odd, (999_000.0, 999_000.0), follow_symlinks=False)
    afl_entry(tmp_path, "main", "id:000002,orig:big", b"x" * (AFL_MAX_FILE + 1))
    afl_entry(tmp_path, "main", "id:000003,orig:fine", b"fine")
    importer = importer_for(tmp_path, campaign)
    assert importer.round(now=0.0) == 1
    assert importer.stats.unreadable == 3
    assert importer.fleet.cursors == {"main": 4}


def test_cursors_are_saved_and_read_back_and_a_corrupt_file_starts_over(tmp_path, caplog):
    campaign = campaign_in(tmp_path)
    afl_entry(tmp_path, "main", "id:000000,orig:a", b"a")
    importer = importer_for(tmp_path, campaign)
    importer.round(now=0.0)
    importer.save()
    assert load_cursors(campaign.state / CURSORS_FILE) == {"main": 1}
    (campaign.state / CURSORS_FILE).write_text('{"cursors": {"main": -4}}')
    assert load_cursors(campaign.state / CURSORS_FILE) == {}
    assert "reading the fuzzers' queues from their start" in caplog.text
    (campaign.state / CURSORS_FILE).write_bytes(b"\x00garbage")
    assert load_cursors(campaign.state / CURSORS_FILE) == {}


def test_a_restart_from_lost_cursors_imports_nothing_twice(tmp_path):
    campaign = campaign_in(tmp_path)
    for entry_id in range(3):
        afl_entry(tmp_path, "main", f"id:{entry_id:06d},src:000000", b"%d" % entry_id)
    first = importer_for(tmp_path, campaign)
    assert first.round(now=0.0) == 3
    campaign.sync_done()
    reopened = CampaignDir(campaign.out)
    reopened.keep_queue_names = True
    reopened.read_queues()
    again = importer_for(tmp_path, reopened)  # no cursors: the save was lost
    for digest in reopened.corpus_digests():
        reopened.inputs.add(digest)
    assert again.round(now=0.0) == 0
    assert again.stats.duplicates == 3
    assert len(os.listdir(reopened.queue)) == 3


def test_the_scan_is_paced(tmp_path):
    campaign = campaign_in(tmp_path)
    importer = importer_for(tmp_path, campaign)
    importer.round(now=10.0)
    afl_entry(tmp_path, "main", "id:000000,orig:a", b"a")
    assert importer.round(now=10.5) == 0
    assert importer.round(now=11.0) == 1


def test_saved_cursors_document(tmp_path):
    campaign = campaign_in(tmp_path)
    afl_entry(tmp_path, "main", "id:000000,orig:a", b"a")
    importer = importer_for(tmp_path, campaign)
    importer.round(now=0.0)
    importer.save()
    document = json.loads((campaign.state / CURSORS_FILE).read_text())
    assert document == {"version": 1, "sync_dir": str(tmp_path), "cursors": {"main": 1}}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=1, max_size=40),
       st.randoms(use_true_random=False))
def test_a_ranked_frontier_takes_by_key_then_arrival_with_put_backs_first(items, rnd):
    frontier = Frontier()
    keys = {}
    frontier.rank_by(keys.__getitem__)
    order = []
    for number, (key, _) in enumerate(items):
        digest = sha256_bytes(b"%d" % number)
        keys[digest] = (key,)
        frontier.add(digest)
        order.append((key, number, digest))
    expected = [digest for _, _, digest in sorted(order)]
    assert list(frontier.pending) == expected
    taken = [frontier.take() for _ in range(rnd.randint(0, len(expected)))]
    assert taken == expected[:len(taken)]
    put_back = [d for d, (_, back) in zip(taken, items, strict=False) if back]
    for digest in put_back:
        frontier.put_back(digest)
    rest = put_back[::-1] + expected[len(taken):]
    assert list(frontier.pending) == rest
    assert [frontier.take() for _ in range(len(frontier))] == rest


def test_rank_by_ranks_the_inputs_already_pending_too():
    """A resumed hybrid campaign restores its frontier (snapshot.py) before it ranks it."""
    frontier = Frontier()
    first, second, third = (sha256_bytes(b) for b in (b"x", b"y", b"z"))
    frontier.add(first)
    frontier.add(second)
    frontier.requeue(third)  # requeued: still first in line, whatever the ranking
    frontier.rank_by(lambda digest: (digest != second,))
    assert [frontier.take() for _ in range(3)] == [third, second, first]


def test_ranking_is_stable_for_equal_keys():
    frontier = Frontier()
    frontier.rank_by(lambda digest: (0,))
    digests = [sha256_bytes(b"%d" % n) for n in range(50)]
    random.Random(4).shuffle(digests)
    for digest in digests:
        frontier.add(digest)
    assert [frontier.take() for _ in digests] == digests


def test_an_unreadable_fuzzer_directory_is_skipped_with_one_warning(tmp_path, caplog,
                                                                    monkeypatch):
    afl_entry(tmp_path, "main", "id:000000,orig:a", b"a")
    afl_entry(tmp_path, "sec", "id:000000,orig:b", b"b")
    fleet = FleetQueues(tmp_path, "symcc-mpi", {}, clock=ManualClock(1_000_000.0))
    real_scandir = os.scandir

    def refusing(path):
        if str(path).endswith("sec/queue"):
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)
    assert [e.instance for e in fleet.scan(limit=10)] == ["main"]
    assert [e.instance for e in fleet.scan(limit=10)] == []
    assert caplog.text.count("Permission denied") == 1


class FailingProbe:
    def probe(self, paths):
        from symcc_mpi.coverage.edges import TriageError

        raise TriageError("afl-showmap died")


def test_imports_survive_a_failing_coverage_probe(tmp_path, caplog):
    from symcc_mpi.coverage.triage import CoverageMap

    campaign = campaign_in(tmp_path)
    afl_entry(tmp_path, "main", "id:000000,orig:a", b"a")
    fleet = FleetQueues(tmp_path, "symcc-mpi", {}, clock=ManualClock(1_000_000.0))
    importer = Importer(campaign, campaign.inputs, fleet, probe=FailingProbe(),
                        triage=CoverageMap())
    assert importer.round(now=0.0) == 1
    assert importer.stats.unprobed == 1
    assert "kept without their coverage" in caplog.text


def test_the_next_pending_input_of_a_ranked_frontier_is_the_one_take_returns():
    frontier = Frontier()
    frontier.rank_by(lambda digest: (digest[-1],))
    digests = [sha256_bytes(b"%d" % n) for n in range(30)]
    for digest in digests:
        frontier.add(digest)
    frontier.put_back(frontier.take())
    while len(frontier):
        assert frontier.pending[0] == frontier.take()


AFL_GATE = Path(__file__).resolve().parents[2] / "examples" / "build" / "gate.afl"


@pytest.mark.skipif(not AFL_GATE.exists(), reason="no AFL build of the examples (make examples)")
def test_what_the_fuzzers_hold_is_in_the_triage_map_before_anything_is_kept(tmp_path):
    """Triage against the fleet: a generated input whose edges and hit counts an imported
    entry already has adds nothing; one with a new edge does."""
    from symcc_mpi.coverage.forkserver import ForkserverProbe
    from symcc_mpi.coverage.triage import CoverageMap

    campaign = campaign_in(tmp_path)
    afl_entry(tmp_path, "main", "id:000000,src:000000,op:havoc,+cov", b"GT0000abc")
    probe = ForkserverProbe([str(AFL_GATE), "@@"], timeout=5)
    fleet = FleetQueues(tmp_path, "symcc-mpi", {}, clock=ManualClock(1_000_000.0))
    importer = Importer(campaign, campaign.inputs, fleet, probe=probe, triage=CoverageMap())
    assert importer.round(now=0.0) == 1
    generated = tmp_path / "generated"
    generated.mkdir()
    (generated / "same").write_bytes(b"GT0000cab")  # the same commands, once each
    (generated / "new").write_bytes(b"GT0000abh")  # a command the fuzzers have not run
    same, new = probe.probe([generated / "same", generated / "new"])
    assert not importer.triage.adds_coverage(same)
    assert importer.triage.adds_coverage(new)
