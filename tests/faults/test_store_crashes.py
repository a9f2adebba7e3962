"""Crash consistency: a child process is SIGKILLed at chosen points inside a write (or at a
random moment of a write loop); reopening must give a consistent, recoverable state in which
every acknowledged record is present and no record is unreadable.

A process kill keeps the page cache, so these tests cover torn writes and interrupted
multi-step protocols, not a machine losing unsynced data; fsync is on throughout anyway."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from symcc_mpi.durable.journal import DamageKind, LeaseState, WorkLeaseJournal
from symcc_mpi.durable.querystore import QueryStore
from symcc_mpi.durable.wal import WorkState, WorkWAL

# The child: runs one scenario from JSON arguments, printing "ack ..." after every call that
# returned, and kills itself with SIGKILL at the chosen point.
CHILD = r"""
import hashlib, json, os, signal, sys
from pathlib import Path

args = json.loads(sys.argv[1])
directory = Path(args["dir"])

def die():
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)

def ack(*items):
    print("ack", *items, flush=True)

def kill_on(module, name, nth, after=False):
    real = getattr(module, name)
    calls = [0]
    def wrapper(*a, **k):
        calls[0] += 1
        if calls[0] == nth and not after:
            die()
        result = real(*a, **k)
        if calls[0] == nth and after:
            die()
        return result
    setattr(module, name, wrapper)

scenario = args["scenario"]

if scenario == "journal-append":
    from symcc_mpi.durable.journal import WorkLeaseJournal, write_all
    armed = [False]
    def writer(fd, data):
        if armed[0]:
            cut = {"all": len(data), "no-newline": len(data) - 1,
                   "half": len(data) // 2}.get(args["cut"], args["cut"])
            os.write(fd, data[:cut])
            die()
        write_all(fd, data)
    journal = WorkLeaseJournal(directory / "leases.jsonl", writer=writer)
    for i in range(args["events"]):
        journal.lease(f"w{i}", "t")
        ack(i)
    armed[0] = True
    journal.lease("victim", "t")

elif scenario == "journal-compaction":
    from symcc_mpi.durable.journal import WorkLeaseJournal
    journal = WorkLeaseJournal(directory / "leases.jsonl", compact_after=1_000_000)
    for i in range(10):
        journal.lease(f"w{i}", "t")
        journal.reclaim(f"w{i}", "t") if i % 2 else journal.done(f"w{i}", "t")
    ack("written")
    kill_on(os, "replace", 1, after=args["after"])
    journal.compact()

elif scenario == "journal-loop":
    from symcc_mpi.durable.journal import WorkLeaseJournal
    journal = WorkLeaseJournal(directory / "leases.jsonl", compact_after=64)
    ack("ready")
    i = 0
    while True:
        journal.lease(f"w{i}", "t")
        ack("lease", i)
        if i % 3:
            journal.done(f"w{i}", "t")
            ack("done", i)
        i += 1

elif scenario == "wal-commit":
    from symcc_mpi.durable.wal import Manifest, WorkWAL
    staging = directory / "staging" / "r1"
    staging.mkdir(parents=True)
    digests = []
    for i in range(3):
        data = f"child {i}".encode() * (i + 1)
        digest = hashlib.sha256(data).hexdigest()
        (staging / digest).write_bytes(data)
        digests.append(digest)
    wal = WorkWAL(directory / "wal", directory / "corpus")
    wal.begin("done-before", "t0")
    wal.commit_manifest("done-before", "t0", Manifest(staging, tuple(digests[:1])))
    wal.publish("done-before", "t0")
    wal.done("done-before", "t0")
    ack("setup")
    function, nth, after = args["point"]
    kill_on(os, function, nth, after)
    wal.begin("work", "t1"); ack("begin")
    wal.commit_manifest("work", "t1", Manifest(staging, tuple(digests))); ack("manifest")
    wal.publish("work", "t1"); ack("publish")
    wal.done("work", "t1"); ack("done")
    die()

elif scenario in ("querystore-commit", "querystore-progress", "querystore-loop"):
    from symcc_mpi.durable.querystore import QueryStore
    store = QueryStore(directory / "querystore.sqlite")
    if not store.initialized:
        store.initialize(["m", "w1", "w2"], 4)
    ack("open", store.state_ordinal)
    if scenario == "querystore-commit":
        commits = [0]
        def trace(statement):
            if statement == "COMMIT":
                commits[0] += 1
                if commits[0] == args["nth"]:
                    die()  # the COMMIT statement has started but not run
        store._db.set_trace_callback(trace)
    elif scenario == "querystore-progress":
        store._db.set_progress_handler(die, args["ops"])
    i = 0
    while True:
        work = f"work-{os.getpid()}-{i}"  # unique across the runs sharing one store
        fence = store.dispatch(work, "w1")
        ack("dispatch", fence.lease)
        ack("finish", store.finish(fence, work, "w1"))
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


def assert_no_temporaries(root: Path) -> None:
    leftovers = [p for p in root.rglob(".tmp-*")]
    assert leftovers == [], leftovers


# -- the work-lease journal ---------------------------------------------------------------------

@pytest.mark.parametrize("cut", [0, 1, "half", "no-newline", "all"])
def test_journal_killed_inside_an_append(tmp_path, cut):
    acks = run_child(tmp_path, "journal-append", cut=cut, events=5)
    assert len(acks) == 5
    journal = WorkLeaseJournal(tmp_path / "leases.jsonl")
    assert {f"w{i}" for i in range(5)} <= set(journal.leases())  # every ack survived
    if cut not in (0, "all"):
        (damage,) = journal.damage
        assert damage.kind is DamageKind.TORN_TAIL and damage.line == 6
        fragment = damage.kept_at.read_bytes()  # the fragment, kept
        assert fragment and not fragment.endswith(b"\n")
        assert journal.state("victim") is LeaseState.FREE
    else:
        assert journal.damage == ()
        # A whole line whose writer died before fsync returned: it may count, never half.
        assert journal.state("victim") is (LeaseState.LEASED if cut == "all"
                                           else LeaseState.FREE)
    assert journal.lease("after", "t") is True  # appends go on after the repair
    journal.close()
    again = WorkLeaseJournal(tmp_path / "leases.jsonl")
    assert again.damage == () and "after" in again.leases()


@pytest.mark.parametrize("after", [False, True])
def test_journal_killed_inside_a_compaction(tmp_path, after):
    run_child(tmp_path, "journal-compaction", after=after)
    journal = WorkLeaseJournal(tmp_path / "leases.jsonl")
    assert journal.damage == ()
    assert journal.done_ids() == {f"w{i}" for i in range(0, 10, 2)}
    assert journal.leases() == {}
    assert_no_temporaries(tmp_path)


@pytest.mark.slow
def test_journal_killed_at_random_moments(tmp_path):
    rng = random.Random(313)
    for round_ in range(10):
        acks = run_child(tmp_path, "journal-loop", kill_after=rng.uniform(0.01, 0.15))
        journal = WorkLeaseJournal(tmp_path / "leases.jsonl")
        assert all(d.kind is DamageKind.TORN_TAIL for d in journal.damage)
        state = {w: journal.state(w) for w in journal.leases()} | \
            {w: LeaseState.DONE for w in journal.done_ids()}
        for kind, index in (a for a in acks if len(a) == 2):
            work = f"w{index}"
            if kind == "done":
                assert state.get(work) is LeaseState.DONE, (round_, work)
            else:
                assert work in state, (round_, work)
        journal.close()
        (tmp_path / "leases.jsonl").unlink()


# -- the shared work WAL -------------------------------------------------------------------------

# (os function, nth call, kill after the call rather than before), counted from the first WAL
# call after setup: begin = replace 1, manifest = replace 2, publish = link 1..3, done =
# replace 3. "After a rename" is the window before write_durable's directory fsync.
WAL_POINTS = {
    "begin-before-rename": ("replace", 1, False),
    "begin-before-dir-fsync": ("replace", 1, True),
    "manifest-before-rename": ("replace", 2, False),
    "manifest-before-dir-fsync": ("replace", 2, True),
    "publish-before-first-link": ("link", 1, False),
    "publish-after-first-link": ("link", 1, True),
    "publish-after-last-link": ("link", 3, True),
    "done-before-rename": ("replace", 3, False),
    "done-after-rename": ("replace", 3, True),
}


@pytest.mark.parametrize("point", sorted(WAL_POINTS))
def test_wal_killed_inside_a_commit(tmp_path, point):
    acks = [a[0] for a in run_child(tmp_path, "wal-commit", point=WAL_POINTS[point])]
    corpus = tmp_path / "corpus"
    wal = WorkWAL(tmp_path / "wal", corpus)
    before = wal.get("work")
    recovery = wal.recover()
    assert recovery.failed == () and recovery.quarantined == ()
    assert_no_temporaries(tmp_path / "wal")
    after = wal.get("work")
    if before is None or before.state is WorkState.LEASED:
        assert "manifest" not in acks
        assert after is None  # reclaimed (or never begun): dispatch it again
        assert recovery.reclaimed == (() if before is None else ("work",))
    else:
        assert after.state is WorkState.DONE and after.token == "t1"
        assert recovery.redone == (("work",) if before.state is WorkState.COMMITTING else ())
        for digest in after.manifest.objects:
            assert hashlib.sha256((corpus / digest).read_bytes()).hexdigest() == digest
    assert wal.get("done-before").state is WorkState.DONE
    for path in corpus.iterdir():  # nothing public under a wrong name
        assert hashlib.sha256(path.read_bytes()).hexdigest() == path.name
    assert wal.recover().redone == ()


# -- the QueryStore -------------------------------------------------------------------------------


def check_querystore(directory: Path, acks: list[list[str]]) -> int:
    """Reopen (which runs quick_check and the invariants) and compare with the acks; then
    cancel what the crash left leased, as recovery would, and go on."""
    store = QueryStore(directory / "querystore.sqlite")
    last_kind, last = acks[-1][0], int(acks[-1][1])
    ordinal = store.state_ordinal
    assert last <= ordinal <= last + 1  # nothing acknowledged is lost; at most one more
    # Which call applied last: the acknowledged one, or the one in flight after it.
    dispatched_last = (last_kind == "dispatch") == (ordinal == last)
    leases = store.active_leases()
    if dispatched_last and last_kind != "open":
        assert [lease.lease for lease in leases] == [ordinal]
        store.cancel(leases[0].fence, leases[0].work_id, leases[0].worker)
    else:
        assert leases == ()
    fence = store.dispatch(f"after-restart-{ordinal}", "w2")  # and it goes on from there
    assert fence.lease == store.state_ordinal
    store.finish(fence, f"after-restart-{ordinal}", "w2")
    store.close()
    return ordinal


@pytest.mark.parametrize("nth", [1, 2, 7])
def test_querystore_killed_before_commit_runs(tmp_path, nth):
    acks = run_child(tmp_path, "querystore-commit", nth=nth)
    ordinal = check_querystore(tmp_path, acks)
    assert ordinal == int(acks[-1][1])  # killed before its COMMIT ran: not applied


@pytest.mark.parametrize("ops", [200, 1000, 5000])
def test_querystore_killed_mid_transaction(tmp_path, ops):
    check_querystore(tmp_path, run_child(tmp_path, "querystore-commit", nth=10))  # a store
    acks = run_child(tmp_path, "querystore-progress", ops=ops)
    check_querystore(tmp_path, acks)


@pytest.mark.slow
def test_querystore_killed_at_random_moments(tmp_path):
    rng = random.Random(443)
    for _ in range(10):
        acks = run_child(tmp_path, "querystore-loop", kill_after=rng.uniform(0.01, 0.2))
        check_querystore(tmp_path, acks)


def test_querystore_torn_wal_file_reopens_to_a_committed_prefix(tmp_path):
    # A kill inside SQLite's own write leaves a WAL file cut anywhere; emulate every such cut.
    live = tmp_path / "live"
    store = QueryStore(live / "querystore.sqlite")
    store.initialize(["m", "w1"], 2)
    store.close()  # checkpointed: the main file holds generation 0
    store = QueryStore(live / "querystore.sqlite")
    snapshots = [store.snapshot()]
    for i in range(12):
        fence = store.dispatch(f"w{i}", "w1")
        snapshots.append(store.snapshot())
        if i % 2:
            store.finish(fence, f"w{i}", "w1")
            snapshots.append(store.snapshot())
    wal_bytes = (live / "querystore.sqlite-wal").read_bytes()
    main_bytes = (live / "querystore.sqlite").read_bytes()
    store.close()
    rng = random.Random(5)
    cuts = sorted({0, len(wal_bytes), *(rng.randrange(len(wal_bytes)) for _ in range(10))})
    seen = set()
    for cut in cuts:
        copy = tmp_path / f"cut{cut}"
        copy.mkdir()
        (copy / "querystore.sqlite").write_bytes(main_bytes)
        (copy / "querystore.sqlite-wal").write_bytes(wal_bytes[:cut])
        reopened = QueryStore(copy / "querystore.sqlite")
        snapshot = reopened.snapshot()
        assert snapshot in snapshots, cut
        seen.add(snapshot.state_ordinal)
        reopened.close()
        shutil.rmtree(copy)
    assert snapshots[-1].state_ordinal in seen and 0 in seen
    os.sync()
