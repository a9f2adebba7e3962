"""Crash consistency of the journal (`durable.journal.LineLog`, the done journal's engine): a
child process is SIGKILLed at chosen points inside an append or a repair, or at a random moment
of an append loop; reopening must give every acknowledged record back, whole, and no record
that is unreadable.

A process kill keeps the page cache, so these tests cover torn writes and interrupted repairs,
not a machine losing unsynced data; fsync is on throughout anyway."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from symcc_mpi.durable.journal import DamageKind, LineLog
from symcc_mpi.durable.lines import encode_line

# The child: runs one scenario from JSON arguments, printing "ack ..." after every call that
# returned, and kills itself with SIGKILL at the chosen point.
CHILD = r"""
import json, os, signal, sys
from pathlib import Path
from symcc_mpi.durable.journal import LineLog
from symcc_mpi.durable.lines import write_all

args = json.loads(sys.argv[1])
path = Path(args["dir"]) / "done.jsonl"

def die():
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)

def ack(*items):
    print("ack", *items, flush=True)

def owner(writer=write_all):
    log = LineLog(path, writer=writer)
    log.load(lambda record: None)
    log.open_for_append()
    return log

scenario = args["scenario"]

if scenario == "append":
    armed = [False]
    def writer(fd, data):
        if armed[0]:
            cut = {"all": len(data), "no-newline": len(data) - 1,
                   "half": len(data) // 2}.get(args["cut"], args["cut"])
            os.write(fd, data[:cut])
            die()
        write_all(fd, data)
    log = owner(writer)
    for i in range(args["records"]):
        log.append({"work": f"w{i}"})
        ack(i)
    armed[0] = True
    log.extend([{"work": "victim"}, {"work": "victim-2"}])

elif scenario == "repair":
    # The load finds a corrupt middle line: a durable quarantine copy (rename 1), then the
    # live file rewritten without it (rename 2).
    real, calls = os.replace, [0]
    def replace(*a, **k):
        calls[0] += 1
        if calls[0] == args["nth"] and not args["after"]:
            die()
        real(*a, **k)
        if calls[0] == args["nth"]:
            die()
    os.replace = replace
    owner()

elif scenario == "loop":
    log = owner()
    ack("ready")
    i = 0
    while True:
        if i % 3:
            log.append({"work": f"w{i}"})
        else:
            log.extend([{"work": f"w{i}"}, {"work": f"w{i}-child"}])
        ack(i)
        i += 1
"""


def run_child(directory: Path, scenario: str, *, kill_after: float | None = None,
              **options) -> list[list[str]]:
    """Run the child until it dies; return its acknowledgements (split lines)."""
    arguments = json.dumps({"dir": str(directory), "scenario": scenario, **options})
    process = subprocess.Popen([sys.executable, "-c", CHILD, arguments],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if kill_after is not None:
        # Wait until the child is ready, then kill it at a random moment of its write loop.
        assert process.stdout is not None
        first = process.stdout.readline()
        time.sleep(kill_after)
        process.send_signal(signal.SIGKILL)
        out, err = process.communicate(timeout=30)
        out = first + out
    else:
        out, err = process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL, (process.returncode, err)
    # A line the kill cut short (no newline yet) was never acknowledged.
    complete = out.split("\n")[:-1]
    return [line.split()[1:] for line in complete if line.startswith("ack")]


def reopen(path: Path) -> tuple[LineLog, list[str], tuple]:
    works: list[str] = []
    log = LineLog(path)
    damage = log.load(lambda record: works.append(record["work"]))
    log.open_for_append()
    return log, works, damage


@pytest.mark.parametrize("cut", [0, 1, "half", "no-newline", "all"])
def test_killed_inside_an_append(tmp_path, cut):
    acks = run_child(tmp_path, "append", cut=cut, records=5)
    assert len(acks) == 5
    log, works, damage = reopen(tmp_path / "done.jsonl")
    assert works[:5] == [f"w{i}" for i in range(5)]  # every ack survived, in order
    # The group was never acknowledged: a kill inside its one write leaves a prefix of it
    # (whole records only; each is valid alone), then at most one torn line.
    group = works[5:]
    assert group == ["victim", "victim-2"][:len(group)]
    if cut not in (0, "all"):
        (torn,) = damage
        assert torn.kind is DamageKind.TORN_TAIL and torn.line == 6 + len(group)
        fragment = torn.kept_at.read_bytes()  # the fragment, kept
        assert fragment and not fragment.endswith(b"\n")
    else:
        assert damage == () and len(group) == (0 if cut == 0 else 2)
    log.append({"work": "after"})  # appends go on after the repair
    log.close()
    _, works, damage = reopen(tmp_path / "done.jsonl")
    assert damage == () and works[-1] == "after"


@pytest.mark.parametrize(("nth", "after"), [(1, False), (1, True), (2, False), (2, True)])
def test_killed_inside_a_repair(tmp_path, nth, after):
    path = tmp_path / "done.jsonl"
    lines = [encode_line({"work": f"w{i}"}) for i in range(4)]
    path.write_bytes(lines[0] + b"garbage\n" + b"".join(lines[1:]))
    run_child(tmp_path, "repair", nth=nth, after=after)
    # Killed before the live file's rename: the file is as it was and the repair is done
    # again (the bad line is quarantined once more); after it: the repaired file. Never a mix.
    repaired = (nth, after) == (2, True)
    log, works, damage = reopen(path)
    assert works == [f"w{i}" for i in range(4)]
    assert [d.kind for d in damage] == ([] if repaired else [DamageKind.CORRUPT_LINE])
    kept = [p.read_bytes() for p in (tmp_path / "quarantine").glob("done.jsonl.line2.*")]
    assert kept and set(kept) == {b"garbage\n"}  # the bad bytes were never lost
    assert list(tmp_path.glob(".tmp-*")) == []  # the dead repair's temporary was swept
    assert path.read_bytes() == b"".join(lines)


@pytest.mark.slow
def test_killed_at_random_moments(tmp_path):
    rng = random.Random(443)
    path = tmp_path / "done.jsonl"
    for round_ in range(10):
        acks = run_child(tmp_path, "loop", kill_after=rng.uniform(0.01, 0.15))
        log, works, damage = reopen(path)
        assert all(d.kind is DamageKind.TORN_TAIL for d in damage), round_
        written = [w for i in range(len(works) + 1)
                   for w in ([f"w{i}", f"w{i}-child"] if i % 3 == 0 else [f"w{i}"])]
        assert works == written[:len(works)], round_  # in order, no gap, nothing half
        acknowledged = [int(a[0]) for a in acks if a != ["ready"]]
        if acknowledged:  # every acknowledged append (a group: all of it) survived
            last = acknowledged[-1]
            assert (f"w{last}-child" if last % 3 == 0 else f"w{last}") in works, round_
        log.close()
        path.unlink()
