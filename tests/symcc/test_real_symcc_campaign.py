"""A real 2-worker campaign through the CLI with the SymCC executor finds a planted bug."""

from __future__ import annotations

import os
import shutil
import time

import pytest
from harness import (
    assert_oracles,
    crash_files,
    crashes_natively,
    done_digests,
    explore,
    stats,
)
from realsymcc import BUILD, SEEDS

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(240)]


@pytest.mark.skipif(shutil.which("afl-showmap") is None, reason="AFL++ not installed")
def test_symcc_campaign_finds_the_json_label_overrun(tmp_path):
    """From the seeds the overrun is a surrogate pair away (two escapes to rewrite, each
    over several branches); measured on 2 busy cores: found after ~10 s, the campaign
    saturates after ~25 s."""
    if not (BUILD / "json.afl").exists():
        pytest.skip("no AFL build of the json example")
    out = tmp_path / "out"
    started = time.monotonic()
    process = explore(out, "--executor", "symcc", "--target", f"{BUILD / 'json.symcc'} @@",
                      "--afl-target", f"{BUILD / 'json.afl'} @@", "--seeds", SEEDS / "json",
                      "--workers", 2, "--timeout", 20, timeout=200)
    elapsed = time.monotonic() - started
    assert_oracles(out, process)
    crashes = crash_files(out)
    assert crashes, f"no crash after {elapsed:.0f} s: {process.stdout[-2000:]}"
    for crash in crashes:
        data = crash.read_bytes()
        assert crashes_natively(BUILD / "json", data, tmp_path), data
        assert b'"x-\\u' in data, data  # the overrun is only reachable through such a key
    figures = stats(out)
    assert figures["executions"] > 0 and figures["edges_found"] > 0


@pytest.mark.parametrize("mode", ["off", "local", "shared"])
def test_each_pruning_mode_finds_the_magic_crash(tmp_path, mode):
    out = tmp_path / "out"
    process = explore(out, "--executor", "symcc", "--target", f"{BUILD / 'magic.symcc'} @@",
                      "--seeds", SEEDS / "magic", "--workers", 2, "--pruning", mode,
                      "--timeout", 20, timeout=200)
    assert_oracles(out, process)
    assert crash_files(out), process.stdout[-2000:]
    extra = stats(out)["extra"]
    assert extra["solver"]["pruning"] == mode
    assert extra["solver"]["queries"] > 0 and extra["solver"]["skipped_known"]
    pruning = extra["pruning"]
    if mode == "off":
        assert pruning is None and not (out / "state" / "pruning").exists()
    else:
        assert pruning["merged"] > 0 and pruning["shipped_entries"] > 0
        maps = sorted(p.name for p in (out / "state" / "pruning").iterdir())
        assert maps == ["shared.map"] if mode == "shared" else \
            set(maps) <= {"rank-1.map", "rank-2.map"} and maps


@pytest.mark.skipif(shutil.which("afl-showmap") is None, reason="AFL++ not installed")
def test_resume_keeps_pruning_and_the_triage_map(tmp_path):
    out = tmp_path / "out"
    common = ("--executor", "symcc", "--target", f"{BUILD / 'json.symcc'} @@",
              "--afl-target", f"{BUILD / 'json.afl'} @@", "--workers", 2, "--timeout", 20)
    first = explore(out, *common, "--seeds", SEEDS / "json", "--wall-timeout", 6, timeout=120)
    assert first.returncode == 0, first.stdout[-2000:]
    saved = (out / "state" / "pruning" / "shared.map").read_bytes()
    assert len(saved) == 2 * 65536 and any(saved)
    before = stats(out)
    queue_entries = len(list((out / "queue").iterdir()))
    # A new seed gives the resumed run work whatever tier the first one ended in; with no
    # budget it ends with the interesting frontier, in the epoch it resumed (a budget would go
    # on into a fresh pruning epoch, whose map starts empty: tiers/schedule.py).
    more = tmp_path / "more"
    more.mkdir()
    (more / "new").write_bytes(b'{"version":2,"items":[{"id":7,"tags":["z"]}]}')
    resumed = explore(out, *common, "--resume", "--seeds", more, timeout=200)
    assert_oracles(out, resumed)
    # The saved triage map covered the whole queue: only the new seed was replayed.
    assert f"triage map saved over {queue_entries} queue entries: replaying 1 " in \
        resumed.stdout, resumed.stdout[-3000:]
    pruning = stats(out)["extra"]["pruning"]
    assert pruning["whole_maps_shipped"] >= 1  # each worker starts from the saved map
    after = (out / "state" / "pruning" / "shared.map").read_bytes()
    assert all(a & b == b for a, b in zip(after, saved, strict=True))  # it only gained bits
    assert stats(out)["edges_found"] >= before["edges_found"]


@pytest.mark.skipif(shutil.which("afl-showmap") is None, reason="AFL++ not installed")
def test_two_masters_exchange_their_triage_and_pruning_maps(tmp_path):
    """Each master ORs the other's maps into its own (federation/map_exchange.py): both read
    the other's and gained bits from them, in a real two-master campaign."""
    out = tmp_path / "out"
    process = explore(out, "--executor", "symcc", "--target", f"{BUILD / 'json.symcc'} @@",
                      "--afl-target", f"{BUILD / 'json.afl'} @@", "--seeds", SEEDS / "json",
                      "--workers", 2, "--masters", 2, "--pruning", "shared",
                      "--fault-tolerance", "off", "--timeout", 20, timeout=200)
    assert_oracles(out, process)
    for index, master in stats(out)["extra"]["per_master"].items():
        maps = master["maps"]
        assert maps["published"] > 0 and maps["read"] > 0 and maps["gained"] > 0, (index, maps)
        assert maps["rejected"] == 0, (index, maps)



@pytest.mark.skipif(shutil.which("afl-showmap") is None, reason="AFL++ not installed")
@pytest.mark.parametrize(("dead", "index", "successor"), [(3, 1, 4), (0, 0, 1)],
                         ids=["master-1", "the-first-master"])
def test_a_dead_master_is_replaced_by_one_of_its_workers_in_a_real_campaign(tmp_path, dead,
                                                                            index, successor):
    """Under ULFM, a master (world rank 3, or 0: the first) is SIGKILLed after its 5th WORK
    send; the next rank, a worker of its, takes its place (job/federated.py) and the campaign
    ends in the job; the first master's successor names queue/ on from where it stopped."""
    out = tmp_path / "out"
    process = explore(out, "--executor", "symcc", "--target", f"{BUILD / 'json.symcc'} @@",
                      "--afl-target", f"{BUILD / 'json.afl'} @@", "--seeds", SEEDS / "json",
                      "--workers", 4, "--masters", 2, "--fault-tolerance", "on",
                      "--timeout", 20, timeout=200,
                      env=dict(os.environ, SYMCC_MPI_FAULTS=f"{dead}:die@5"))
    assert_oracles(out, process)
    done = done_digests(out)
    assert len(done) == len(set(done))  # over both masters' journals: each input once
    (failure,) = stats(out)["extra"]["failures"]
    assert failure["master"] == "new" and failure["master_index"] == index
    assert failure["failed"][0].startswith(f"rank {dead} ")
    assert failure["first_dispatch"] >= failure["detected"]
    assert stats(out)["extra"]["per_master"][str(index)]["world_rank"] == successor
    ids = sorted(int(name[3:9]) for name in os.listdir(out / "queue"))
    assert ids == list(range(len(ids)))
