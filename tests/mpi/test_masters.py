"""Several masters, one campaign (issue 11, F320 §5.2): real mpiexec runs where 2 or 3
masters share one OUT and each input is analysed once across all of them."""

from __future__ import annotations

import os
import re
import signal
import subprocess

import pytest
from harness import assert_oracles, done_digests, explore, rank_pid, start_explore, stats, verify

from symcc_mpi.campaign.layout import LEASE_DIRECTORY_PREFIX, sha256_bytes
from symcc_mpi.federation.ownership import owner

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(600)]


def seeds_of(tmp_path, contents: list[bytes]):
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    for number, data in enumerate(contents):
        (seeds / f"seed{number:02d}").write_bytes(data)
    return seeds


def script(tmp_path, name: str, body: str):
    """A target under SymCC's contract: what it writes into $SYMCC_OUTPUT_DIR is generated."""
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def campaign(out, target, seeds, *extra, masters=2, workers=2, env=None):
    return explore(out, "--executor", "symcc", "--target", target, "--seeds", seeds,
                   "--workers", workers, "--masters", masters, "--fault-tolerance", "off",
                   *extra, env=env)


def per_master(out) -> dict[int, dict]:
    return {int(k): v for k, v in stats(out)["extra"]["per_master"].items()}


def facts(out) -> dict[str, str]:
    checked = verify(out)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    return dict(line.strip().split(": ", 1) for line in checked.stdout.splitlines()
                if ": " in line)


def assert_ended_cleanly(out, process) -> None:
    assert_oracles(out, process)
    assert not list(out.glob(LEASE_DIRECTORY_PREFIX + "*")), "the job's lease table is left"
    assert stats(out)["extra"]["stop_reason"] == "frontier exhausted"


def test_one_seed_two_masters_one_observation(tmp_path):
    out = tmp_path / "out"
    process = campaign(out, script(tmp_path, "true", "exit 0\n"), seeds_of(tmp_path, [b"x"]))
    assert_ended_cleanly(out, process)
    assert facts(out)["analysed (observations)"] == "1"
    assert sorted(per_master(out)) == [0, 1]


def test_24_distinct_seeds_are_split_between_two_masters_by_owner(tmp_path):
    out = tmp_path / "out"
    contents = [b"seed %d" % number for number in range(24)]
    process = campaign(out, script(tmp_path, "true", "exit 0\n"), seeds_of(tmp_path, contents))
    assert_ended_cleanly(out, process)
    assert sorted(done_digests(out)) == sorted(map(sha256_bytes, contents))
    assert len(list((out / "corpus").iterdir())) == 24
    owners = [owner(sha256_bytes(data), (0, 1)) for data in contents]
    # No master paused: each analysed exactly what rendezvous hashing gave it.
    executions = {k: m["executions"] for k, m in per_master(out).items()}
    assert executions == {0: owners.count(0), 1: owners.count(1)}
    assert all(executions.values())
    assert "master 1 (rank " in process.stdout  # the summary breaks the figures down


def test_a_child_that_12_seeds_generate_is_analysed_once(tmp_path):
    out = tmp_path / "out"
    target = script(tmp_path, "same-child", 'printf child > "$SYMCC_OUTPUT_DIR/out"\n')
    contents = [b"seed %d" % number for number in range(12)]
    process = campaign(out, target, seeds_of(tmp_path, contents), masters=3, workers=3)
    assert_ended_cleanly(out, process)
    done = done_digests(out)
    assert len(done) == len(set(done)) == 13
    assert sha256_bytes(b"child") in done
    figures = stats(out)
    assert figures["executions"] == 13 and figures["interesting"] == 1
    assert len(list((out / "queue").iterdir())) == 13  # named once, by the first master


def test_the_triton_example_with_two_masters_finds_the_bug_as_one_master_does(build,
                                                                              tmp_path):
    # Results over MPI (the other campaigns here stage them in OUT): each master writes its
    # own workers' packs into the OUT they share.
    out = tmp_path / "out"
    process = explore(out, "--target", f"{build / 'magic'} @@", "--seeds",
                      build.parent / "seeds" / "magic", "--workers", 2, "--masters", 2,
                      "--fault-tolerance", "off", "--timeout", 20, "--results-via", "mpi")
    assert_ended_cleanly(out, process)
    assert list((out / "crashes").glob("id:*"))
    assert facts(out)["observations / unique"] == "1.0"
    assert all(m["executions"] for m in per_master(out).values())
    assert stats(out)["extra"]["packs_over_mpi"]["packs"] > 0  # the first master's
    assert process.stdout.count("sends its results over MPI") == 2


def test_a_master_paused_past_its_lease_ttl_loses_its_work_to_another(tmp_path):
    # Master 1 stops (SIGSTOP) right after its 2nd WORK, for 8 s, with a 2 s lease TTL: master
    # 0 takes the expired lease over and analyses the input; the paused master's result,
    # committed late, is stale and changes nothing.
    out = tmp_path / "out"
    contents = [b"seed %d" % number for number in range(16)]
    target = script(tmp_path, "slow", "sleep 0.5\n")
    env = dict(os.environ, SYMCC_MPI_FAULTS="m1:pause@2=8",
               SYMCC_STANDALONE_WORK_LEASE_TTL="2")
    process = campaign(out, target, seeds_of(tmp_path, contents), env=env)
    assert_ended_cleanly(out, process)
    assert sorted(done_digests(out)) == sorted(map(sha256_bytes, contents))
    masters = per_master(out)
    assert masters[0]["steals"] >= 1, masters
    assert masters[1]["stale_results"] >= 1, masters
    assert "whose lease another master took over" in process.stdout + process.stderr


def test_a_single_master_keeps_its_layout(tmp_path):
    out = tmp_path / "out"
    process = campaign(out, script(tmp_path, "true", "exit 0\n"),
                       seeds_of(tmp_path, [b"a", b"b"]), masters=1)
    assert_oracles(out, process)
    assert not list((out / "state").glob("master-*"))
    assert "per_master" not in stats(out)["extra"]


def test_too_few_ranks_for_the_masters_is_one_line(tmp_path):
    process = campaign(tmp_path / "out", script(tmp_path, "true", "exit 0\n"),
                       seeds_of(tmp_path, [b"a"]), masters=3, workers=2)
    assert process.returncode == 2
    assert process.stderr.strip().splitlines() == [
        "symcc-mpi: error: --masters 3 needs at least one worker each (--workers 2)"]


@pytest.mark.parametrize("masters_after", [1, 3])
def test_a_budget_stops_every_master_and_a_resume_with_other_masters_finishes(tmp_path,
                                                                              masters_after):
    out = tmp_path / "out"
    contents = [b"seed %d" % number for number in range(40)]
    seeds = seeds_of(tmp_path, contents)
    target = script(tmp_path, "slow", "sleep 0.4\n")
    first = campaign(out, target, seeds, "--wall-timeout", 3)
    assert_oracles(out, first)
    assert stats(out)["extra"]["stop_reason"] == "wall-clock budget spent"
    analysed_first = done_digests(out)
    assert 0 < len(analysed_first) < 40
    # Root saw the budget and told the other master, which stopped too.
    for rank in (0, 2):
        assert f"rank {rank} INFO stopping: wall-clock budget spent" in first.stdout
    second = explore(out, "--resume", "--executor", "symcc", "--target", target,
                     "--workers", 3, "--masters", masters_after, "--fault-tolerance", "off")
    assert_ended_cleanly(out, second)
    done = done_digests(out)
    assert sorted(done) == sorted(map(sha256_bytes, contents))  # each once, over all journals
    assert set(analysed_first) <= set(done)


def completed_despite(tmp_path, faults: str, *, masters: int, workers: int,
                      children: bool = False, kill: tuple[int, ...] = ()):
    """A campaign of 40 seeds under ULFM with the fault plan `faults`, or the world ranks
    `kill` SIGKILLed at once from outside once 4 inputs are analysed (a node lost): it ends
    in the job, exit 0 and verify OK, every input analysed once over all the masters'
    journals. `children`: each input shorter than 8 bytes has one, itself and a "+" (staged
    packs a dead worker may leave behind)."""
    out = tmp_path / "out"
    contents = [b"seed %d" % number for number in range(40)]
    child = 'data=$(cat)\n[ ${#data} -lt 8 ] && printf "%s+" "$data" > "$SYMCC_OUTPUT_DIR/c"\n'
    target = script(tmp_path, "slow", "sleep 0.15\n" + (child if children else ""))
    arguments = ["--executor", "symcc", "--target", target, "--workers", workers, "--masters",
                 masters, "--fault-tolerance", "on", "--seeds", seeds_of(tmp_path, contents)]
    if kill:
        launcher = start_explore(out, *arguments, analysed=4)
        for pid in [rank_pid(out, rank) for rank in kill]:
            os.kill(pid, signal.SIGKILL)
        output, _ = launcher.communicate(timeout=600)
        process = subprocess.CompletedProcess(launcher.args, launcher.returncode, output, "")
    else:
        process = explore(out, *arguments, env=dict(os.environ, SYMCC_MPI_FAULTS=faults))
    assert_ended_cleanly(out, process)
    if children:  # 40 seeds, 40 children, 10 grandchildren ("seed 0++", ..., "seed 9++")
        contents += [c + b"+" for c in contents] + [c + b"++" for c in contents if len(c) < 7]
    assert sorted(done_digests(out)) == sorted(map(sha256_bytes, contents))  # once, none lost
    return out, process


@pytest.mark.parametrize(("masters", "workers", "faults", "dead"), [
    (2, 4, "4:die@2", [4]),  # ranks 0 and 3 are the masters, 1 2 and 4 5 their workers
    (3, 6, "1:die@2,7:die@3", [1, 7]),  # ranks 0, 3 and 6 the masters
], ids=["2-masters", "3-masters-2-workers-die"])
def test_under_ulfm_a_dead_worker_is_survived_by_its_master(tmp_path, masters, workers,
                                                             faults, dead):
    out, process = completed_despite(tmp_path, faults, masters=masters, workers=workers,
                                     children=True)
    failures = stats(out)["extra"]["failures"]
    assert sorted(int(f["failed"][0].split()[1]) for f in failures) == dead
    for failure in failures:  # each named, its work handed out again, and when
        assert failure["master"] == "kept" and failure["generation"] is None
        assert failure["first_dispatch"] >= failure["detected"]
    assert "failure → master" in process.stdout


@pytest.mark.parametrize(("masters", "workers", "faults", "dead_masters"), [
    # World ranks 0 and 3 are the masters; rank 4, a worker of master 1, takes its place.
    (2, 4, "3:die@3", [(1, 3)]),
    # Masters at 0, 3 and 6: masters 1 and 2 die, ranks 4 and 7 take their places.
    (3, 6, "3:die@3,6:die@5", [(1, 3), (2, 6)]),
    # Masters at 0 and 4: master 1 dies, rank 5 takes its place and dies in turn, then 6.
    (2, 6, "4:die@3,5:die@2=after-recovery", [(1, 4), (1, 5)]),
    # The first master: rank 1 takes its place, the AFL face and the end with it.
    (2, 4, "0:die@3", [(0, 0)]),
    # Masters at 0, 3 and 6: the first dies, then master 1.
    (3, 6, "0:die@3,3:die@6", [(0, 0), (1, 3)]),
    # Masters at 0 and 4: the first dies, rank 1 takes its place and dies in turn, then 2.
    (2, 6, "0:die@3,1:die@2=after-recovery", [(0, 0), (0, 1)]),
    # The same, rank 1 dying inside its takeover, the dead root's leases adopted.
    (2, 6, "0:die@3,1:die@1=recovery", [(0, 0), (0, 1)]),
], ids=["2-masters", "3-masters-2-die", "a-successor-dies-too", "the-first-master",
        "the-first-then-another", "the-first-and-its-successor", "a-death-in-a-takeover"])
def test_under_ulfm_a_dead_master_is_replaced_by_one_of_its_workers(
        tmp_path, masters, workers, faults, dead_masters):
    out, process = completed_despite(tmp_path, faults, masters=masters, workers=workers)
    failures = [f for f in stats(out)["extra"]["failures"] if f["master"] == "new"]
    assert sorted((f["master_index"], int(f["failed"][0].split()[1])) for f in failures) \
        == dead_masters
    # The last successor's first dispatch is in the figures; one that died in turn may have
    # died before its figures saying so reached the first master.
    assert failures[-1]["first_dispatch"] >= failures[-1]["detected"]
    for index, _ in dead_masters:
        assert f"failure → master {index}" in process.stdout
    # The AFL face moved without a gap or an id twice, and its run time is the campaign's.
    ids = sorted(int(name[3:9]) for name in os.listdir(out / "queue"))
    assert ids == list(range(len(ids)))
    assert stats(out)["start_time"] < failures[0]["detected"]


@pytest.mark.parametrize(("faults", "withdrawn", "failures"), [
    # Master 1's only worker: master 1 withdraws.
    ("3:die@2", [1], [(1, 3, "withdrawn")]),
    # The first master's only worker: it withdraws, and stays the AFL face and root.
    ("1:die@2", [0], [(0, 1, "withdrawn")]),
    # Master 1: rank 3 alone takes its place, then withdraws.
    ("2:die@3", [1], [(1, 2, "new")]),
    # The first master: rank 1 alone takes its place, then withdraws.
    ("0:die@3", [0], [(0, 0, "new")]),
    # Master 1's group, worker then master, is gone: no loss.
    ("3:die@2,2:die@1=withdrawn", [1], [(1, 2, "withdrawn"), (1, 3, "withdrawn")]),
    # Master 1's last rank dies inside its takeover, before it could withdraw: root
    # withdraws it in its place (having heard of the takeover first, or not).
    ("2:die@3,3:die@1=recovery", [], [(1, 2, "reclaimed")]),
], ids=["a-masters-last-worker", "the-first-masters-last-worker", "a-master-of-2-ranks",
        "the-first-master-of-2-ranks", "a-withdrawn-master-dies", "a-group-gone-in-its-takeover"])
def test_under_ulfm_a_master_left_with_no_worker_withdraws_and_the_others_finish(
        tmp_path, faults, withdrawn, failures):
    # Ranks 0 and 2 are the masters, 1 and 3 their workers (MPI_COMM_WORLD).
    out, process = completed_despite(tmp_path, faults, masters=2, workers=2, children=True)
    output = process.stdout + process.stderr
    for index in withdrawn:
        assert f"master {index} has no worker left: it withdraws from the work" in output
    found = sorted((f["master_index"], int(f["failed"][0].split()[1]), f["master"])
                   for f in stats(out)["extra"]["failures"])
    if faults == "2:die@3,3:die@1=recovery":  # the takeover is on record if root heard of it
        found = [f for f in found if f != (1, 2, "new")]  # before its successor's death
    assert found == failures
    ids = sorted(int(name[3:9]) for name in os.listdir(out / "queue"))
    assert ids == list(range(len(ids)))


def test_under_ulfm_a_group_that_dies_whole_is_withdrawn_by_the_first_master(tmp_path):
    """Masters at world ranks 0, 2 and 4, a worker each: master 1 and its worker are killed
    at once, and nobody of the group is left to take its place, or to withdraw it."""
    out, process = completed_despite(tmp_path, "", masters=3, workers=3, children=True,
                                     kill=(2, 3))
    failures = [(f["master_index"], f["master"]) for f in stats(out)["extra"]["failures"]]
    assert failures == [(1, "reclaimed")], failures
    assert "master 1 died with every rank of its group" in process.stdout
    ids = sorted(int(name[3:9]) for name in os.listdir(out / "queue"))
    assert ids == list(range(len(ids)))


@pytest.mark.parametrize(("masters", "workers"), [
    (2, 2),  # masters at world ranks 0 and 2, a worker each: master 1's group takes the place
    (3, 3),  # masters at 0, 2 and 4: master 1's group takes it, master 2 goes on as it was
], ids=["2-masters", "3-masters"])
def test_under_ulfm_the_first_masters_whole_group_lost_the_next_group_takes_its_place(
        tmp_path, masters, workers):
    """The first master and its worker are killed at once: nobody of its group is left. The
    next master hands its own work over (withdrawn, its share to the masters still working)
    and takes the first master's place with its workers: the AFL face moves without a gap or
    an id twice, and the campaign ends in the job."""
    out, process = completed_despite(tmp_path, "", masters=masters, workers=workers,
                                     children=True, kill=(1, 0))
    output = process.stdout + process.stderr
    assert "master 1 takes the first master's place" in output
    failures = stats(out)["extra"]["failures"]
    assert [(f["master_index"], f["master"]) for f in failures] == [(0, "new")], failures
    assert "the first master's whole group" in failures[0]["failed"][0]
    ids = sorted(int(name[3:9]) for name in os.listdir(out / "queue"))
    assert ids == list(range(len(ids)))


@pytest.mark.parametrize(("faults", "reason"), [
    # The first master withdrew, then died: nobody is left to decide the end.
    ("1:die@2,0:die@1=withdrawn", None),
], ids=["the-first-masters-group"])
def test_under_ulfm_a_group_gone_ends_the_campaign_cleanly_and_resume_finishes_it(
        tmp_path, faults, reason):
    # Ranks 0 and 2 are the masters, 1 and 3 their workers (MPI_COMM_WORLD).
    out = tmp_path / "out"
    contents = [b"seed %d" % number for number in range(24)]
    seeds = seeds_of(tmp_path, contents)
    target = script(tmp_path, "slow", "sleep 0.3\n")
    arguments = ["--executor", "symcc", "--target", target, "--workers", 2, "--masters", 2,
                 "--fault-tolerance", "on"]
    first = explore(out, *arguments, "--seeds", seeds,
                    env=dict(os.environ, SYMCC_MPI_FAULTS=faults))
    output = first.stdout + first.stderr
    assert first.returncode != 0, output
    assert "continue with --resume" in output
    if reason is None:
        assert "master 0 died and no worker of its is left" in output
    else:  # what the survivors committed is whole
        assert re.fullmatch(reason, stats(out)["extra"]["stop_reason"])
        assert stats(out)["extra"]["phase"] == "done"
    done_before = done_digests(out)
    assert len(done_before) == len(set(done_before))
    second = explore(out, "--resume", *arguments)
    assert_ended_cleanly(out, second)
    done = done_digests(out)
    assert sorted(done) == sorted(map(sha256_bytes, contents))  # each once, none lost
