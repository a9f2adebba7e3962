"""Split inputs and F311's shared target groups, with real mpiexec, Triton and the examples.

The target-group intervals are read from the masters' DEBUG lines (target_claims.py): each
claim is stamped after the table granted it and each release before the table is asked, so
a logged interval lies within the time the table held the group.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
from harness import (
    EXAMPLES,
    ROOT,
    assert_oracles,
    explore,
    explore_command,
    stats,
    verify,
    wait_until,
)

from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.federation.ownership import owner
from symcc_mpi.roles.faults import HELD_FILE, RELEASE_FILE

pytestmark = pytest.mark.mpi

BUILD = EXAMPLES / "build"
TTL = 3.0  # seconds, of the target leases in the pause test

_CLAIMED = re.compile(r"rank (\d+) DEBUG target group claimed t=([\d.]+) work=(\S+) "
                      r"token=(\S+) targets=([\d,]+)")
_RELEASED = re.compile(r"rank (\d+) DEBUG target group released t=([\d.]+) work=\S+ "
                       r"token=(\S+)")


@pytest.fixture(autouse=True)
def _examples_built():
    if not (BUILD / "gate").is_file() or not (BUILD / "json").is_file():
        pytest.fail("the examples are not built: run `make examples` (make test does)")


def held_intervals(log: str) -> list[dict]:
    """Every target group a master claimed: its rank, token, targets, [claimed, released]
    (released: infinity if the log shows none)."""
    groups = {}
    for rank, claimed, work, token, targets in _CLAIMED.findall(log):
        groups[token] = {"rank": int(rank), "work": work, "claimed": float(claimed),
                         "released": float("inf"), "targets": set(map(int, targets.split(",")))}
    for _rank, released, token in _RELEASED.findall(log):
        groups[token]["released"] = float(released)
    return list(groups.values())


def overlaps(groups: list[dict]) -> list[tuple[dict, dict, set[int]]]:
    """Pairs of groups of different masters that held a common target at the same time."""
    found = []
    for i, first in enumerate(groups):
        for second in groups[i + 1:]:
            common = first["targets"] & second["targets"]
            if common and first["rank"] != second["rank"] \
                    and first["claimed"] < second["released"] \
                    and second["claimed"] < first["released"]:
                found.append((first, second, common))
    return found


def seeds_owned(tmp_path: Path, candidates: list[bytes]) -> Path:
    """A seed directory with the first candidate each of two masters owns (rendezvous
    hashing, ownership.py): both masters split an input of their own at the start."""
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    chosen = {}
    for content in candidates:
        chosen.setdefault(owner(hashlib.sha256(content).hexdigest(), (0, 1)), content)
    assert len(chosen) == 2, "the candidates all belong to one master"
    for index, content in chosen.items():
        (seeds / f"master-{index}").write_bytes(content)
    return seeds


def two_masters_splitting(tmp_path: Path, env: dict, *arguments):
    """A campaign of two masters with two workers each on gate, each splitting a seed of its
    own at the start, over the same branches: (OUT, the finished process)."""
    out = tmp_path / "out"
    process = explore(out, *_splitting_arguments(tmp_path), *arguments,
                      env=dict(os.environ, **env))
    assert_oracles(out, process)
    return out, process


def _splitting_arguments(tmp_path: Path) -> list:
    seeds = seeds_owned(tmp_path, [b"GT0000abc", b"GT0000abe", b"GT0000abd", b"GT0001abc"])
    return ["--target", f"{BUILD / 'gate'} @@", "--seeds", seeds, "--split", "--workers", 4,
            "--masters", 2, "--afl-target", f"{BUILD / 'gate.afl'} @@"]


def test_a_single_master_splits_its_one_seed_and_analyses_each_input_once(tmp_path):
    out = tmp_path / "out"
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    (seeds / "start").write_bytes((EXAMPLES / "seeds" / "gate" / "start").read_bytes())
    process = explore(out, "--target", f"{BUILD / 'gate'} @@", "--seeds", seeds,
                      "--split", "--workers", 3, "--afl-target", f"{BUILD / 'gate.afl'} @@")
    assert_oracles(out, process)
    splitting = stats(out)["extra"]["splitting"]
    assert splitting["traces"] >= 1 and splitting["split_dispatches"] >= 2, splitting
    campaign = CampaignDir(out)
    records = campaign.inspect_journal(campaign.done_journal)[0]
    parts = [r for r in records if r.get("kind") == "part"]
    done = {r["digest"] for r in records if "kind" not in r}
    # Each split input: its trace and every group but the last on record as parts, then one
    # done record; no part twice.
    assert parts and {r["digest"] for r in parts} <= done
    assert len({(r["digest"], r["part"]) for r in parts}) == len(parts)
    assert "split inputs" in process.stdout


def test_two_masters_never_hold_overlapping_target_groups_at_once(tmp_path):
    # Each master splits a gate seed of its own at the start, over the same branches, and
    # the campaign runs until its frontier is exhausted.
    out, process = two_masters_splitting(tmp_path, {"SYMCC_MPI_LOG": "DEBUG"},
                                         "--wall-timeout", 120)
    assert stats(out)["extra"]["stop_reason"] == "frontier exhausted"
    groups = held_intervals(process.stdout + process.stderr)
    by_master = defaultdict(set)
    for group in groups:
        by_master[group["rank"]] |= group["targets"]
    assert len(by_master) == 2 and set.intersection(*by_master.values()), by_master.keys()
    assert overlaps(groups) == []
    claims = [m["target_claims"] for m in stats(out)["extra"]["per_master"].values()]
    assert sum(c["claims"] for c in claims) == len(groups)
    assert all(c["held"] == 0 for c in claims)


def test_a_paused_master_blocks_its_target_group_only_until_the_ttl(tmp_path):
    # Master 1 (ranks 3-5) splits its seed, sends its first group (WORK #2) and is held there,
    # with no round and no heartbeat, holding that group's claim (3 s TTL). Master 0's
    # workers are held after their first run until then, so that master 0's groups, over the
    # same gate branches, come while master 1 holds; master 1 is let go only once master 0
    # took the overlapping group, which must not be before master 1's claim expired. The
    # test decides both ends of the window, however slowly Triton traces the seeds.
    out, log = tmp_path / "out", tmp_path / "log"
    env = dict(os.environ, SYMCC_MPI_LOG="DEBUG", SYMCC_TARGET_LEASE_TTL=str(TTL),
               SYMCC_MPI_FAULTS="m1:pause@2=release,1:pause@1=release,2:pause@1=release")
    with open(log, "w") as output:
        launcher = subprocess.Popen(
            explore_command(out, [*_splitting_arguments(tmp_path), "--wall-timeout", 60,
                                  "--fault-tolerance", "off"]),
            stdout=output, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
        def shown():
            return log.read_text()[-3000:]

        try:
            wait_until(lambda: (out / HELD_FILE.format(3)).exists(), 240,
                       "master 1 held after its first group", launcher, shown)
            for rank in (1, 2):
                (out / f"{RELEASE_FILE}-{rank}").touch()
            wait_until(lambda: _taken_while_held(held_intervals(log.read_text())), 240,
                       "master 0 took the held master's targets", launcher, shown)
            (out / f"{RELEASE_FILE}-3").touch()
            launcher.wait(timeout=300)
        finally:
            if launcher.poll() is None:
                launcher.kill()
    text = log.read_text()
    assert_oracles(out, subprocess.CompletedProcess(launcher.args, launcher.returncode, text, ""))
    found = _taken_while_held(held_intervals(text))
    assert found, "master 0 never took the paused master's targets while it was paused"
    taken, held = found
    assert all(g["claimed"] - held["claimed"] >= TTL for g in taken)
    masters = stats(out)["extra"]["per_master"]
    assert masters["0"]["target_claims"]["steals"] >= 1, masters["0"]
    assert masters["1"]["target_claims"]["expiries"] >= 1, masters["1"]


def _taken_while_held(groups: list[dict]) -> tuple[list[dict], dict] | None:
    """Master 0's groups claimed over targets of master 1's first group while that group was
    claimed (none yet: None), and that group."""
    paused = [g for g in groups if g["rank"] == 3]  # master 1's first rank (3 ranks each)
    if not paused:
        return None
    held = min(paused, key=lambda g: g["claimed"])
    taken = [g for g in groups if g["rank"] == 0 and g["targets"] & held["targets"]
             and held["claimed"] < g["claimed"] < held["released"]]
    return (taken, held) if taken else None


def gate_seed(tmp_path: Path) -> Path:
    seeds = tmp_path / "seeds"
    seeds.mkdir(exist_ok=True)
    (seeds / "start").write_bytes((EXAMPLES / "seeds" / "gate" / "start").read_bytes())
    return seeds


def verify_facts(out: Path) -> dict[str, str]:
    checked = verify(out)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    return dict(line.strip().split(": ", 1) for line in checked.stdout.splitlines()
                if ": " in line)


@pytest.mark.parametrize("fault", ["0:die@3", "0:die@3=after-manifest",
                                   "0:die@2=after-publish"])
def test_a_master_killed_while_it_splits_is_taken_over_and_nothing_is_analysed_twice(
        tmp_path, fault):
    # The seed's trace is WORK #1 and commit #1, its groups the next ones: the master dies
    # after sending a group, or inside a group's commit (its manifest written, or its
    # children published and its part record not yet). A worker takes the campaign over
    # (ULFM), finishes what the manifest says, and splits the seed anew.
    out = tmp_path / "out"
    env = dict(os.environ, SYMCC_MPI_FAULTS=fault)
    process = explore(out, "--target", f"{BUILD / 'gate'} @@", "--seeds", gate_seed(tmp_path),
                      "--split", "--workers", 3, "--timeout", 20,
                      "--afl-target", f"{BUILD / 'gate.afl'} @@", env=env)
    assert_oracles(out, process)
    extra = stats(out)["extra"]
    assert extra["stop_reason"] == "frontier exhausted" and len(extra["failures"]) == 1
    found = verify_facts(out)
    assert found["out at the end"] == "0"
    assert int(found["dispatched again (declared)"]) <= int(found["in flight at failures"]) \
        + int(found["parts split anew"])


def test_a_split_cut_short_without_fault_tolerance_is_split_anew_on_resume(tmp_path):
    out = tmp_path / "out"
    arguments = ["--target", f"{BUILD / 'gate'} @@", "--seeds", gate_seed(tmp_path), "--split",
                 "--workers", 3, "--timeout", 20, "--afl-target", f"{BUILD / 'gate.afl'} @@"]
    first = explore(out, *arguments, "--fault-tolerance", "off",
                    env=dict(os.environ, SYMCC_MPI_FAULTS="0:die@3"))
    assert first.returncode != 0 and "--resume" in first.stdout + first.stderr
    second = explore(out, *arguments, "--resume")
    assert_oracles(out, second)
    assert stats(out)["extra"]["stop_reason"] == "frontier exhausted"


def test_a_master_that_loses_its_workers_while_it_splits_hands_the_input_over_whole(tmp_path):
    # Masters at world ranks 0 and 3, two workers each; each splits a gate seed of its own.
    # Both of master 1's workers die at their second dispatch (a group of the split, or the
    # one taken back from the other): master 1 withdraws with parts still to run, and master
    # 0 analyses that seed anew, whole, then split.
    out, process = two_masters_splitting(tmp_path, {"SYMCC_MPI_FAULTS": "4:die@2,5:die@2"},
                                         "--timeout", 20, "--fault-tolerance", "on")
    output = process.stdout + process.stderr
    assert "master 1 has no worker left: it withdraws from the work" in output
    assert "inputs it was splitting go whole" in output
    extra = stats(out)["extra"]
    assert extra["stop_reason"] == "frontier exhausted"
    done = [r["digest"] for path in (out / "state").glob("**/done.jsonl")
            for r in CampaignDir(out).inspect_journal(path)[0] if "kind" not in r]
    assert sorted(done) == sorted(set(done))  # each input once, the one handed over too
    seeds = tmp_path / "seeds"
    assert {hashlib.sha256(p.read_bytes()).hexdigest() for p in seeds.iterdir()} <= set(done)
