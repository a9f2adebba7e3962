"""Master memory: bytes per known input in the master's per-input state, with a synthetic
million inputs, and the time of the Frontier's operations. Target: <= 64 bytes per input.

The mix, grown the way a campaign grows (each corpus input followed by its children):
- 1,000,000 known inputs in all;
- 250,000 corpus inputs, `add`ed, each with a depth and an AFL queue id;
- 750,000 generated children not kept, only `see`n (3 per corpus input);
- then half the corpus (125,000) taken, dispatched once (`note_dispatch`) and marked done,
  and a tenth of the corpus (25,000 of those) dispatched a second time; 125,000 stay pending.

Memory is what tracemalloc sees allocated by building the state (the digest strings the
benchmark feeds in are made on the fly and freed, unless the structure keeps them),
cross-checked with Frontier.memory_bytes(). The old representation (the Frontier's sets and
deque of hex strings, the master's `seen` set and `depth` dict, the corpus's `queue_ids`
dict, the coordinator's `dispatches` Counter) is measured the same way in the same run, one
string object per digest shared by every container (the old figure is thus a lower bound).
Times are measured in a separate pass without tracemalloc, phase by phase. Also timed: a
100,000-input Frontier built as `--resume` builds it (add(d, done=...)), and with add then
mark_done. Last line: one JSON object with the figures.
"""

from __future__ import annotations

import gc
import hashlib
import json
import sys
import time
import tracemalloc
from collections import Counter, deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from symcc_mpi.scheduling.digests import DigestTable  # noqa: E402
from symcc_mpi.scheduling.frontier import Frontier  # noqa: E402

CORPUS = 250_000
CHILDREN_PER_INPUT = 3
INPUTS = CORPUS * (1 + CHILDREN_PER_INPUT)
DONE = CORPUS // 2
AGAIN = CORPUS // 10
RESUME = 100_000
TARGET_BYTES = 64
RESUME_TARGET_SECONDS = 1.0


def corpus_digest(i: int) -> str:
    return hashlib.sha256(b"corpus %d" % i).hexdigest()


def child_digest(i: int) -> str:
    return hashlib.sha256(b"child %d" % i).hexdigest()


def depth_of(i: int) -> int:
    return 1 if i < 1000 else 2 + i % 29


# -- the mix, on both representations --------------------------------------------------------

def grow_new() -> Frontier:
    f = Frontier()
    for c in range(CORPUS):
        d = corpus_digest(c)
        f.add(d)
        f.set_depth(d, depth_of(c))
        f.set_queue_id(d, c)
        for k in range(c * CHILDREN_PER_INPUT, (c + 1) * CHILDREN_PER_INPUT):
            f.see(child_digest(k))
    for n in range(DONE):
        d = f.take()
        f.note_dispatch(d)
        if n < AGAIN:
            f.note_dispatch(d)
        f.mark_done(d)
    return f


def grow_old() -> tuple:
    known: set[str] = set()
    done: set[str] = set()
    pending: deque[str] = deque()
    seen: set[str] = set()
    depth: dict[str, int] = {}
    queue_ids: dict[str, int] = {}
    dispatches: Counter[str] = Counter()
    for c in range(CORPUS):
        d = corpus_digest(c)
        seen.add(d)  # the session put the corpus in `seen` too
        known.add(d)
        pending.append(d)
        depth[d] = depth_of(c)
        queue_ids[d] = c
        for k in range(c * CHILDREN_PER_INPUT, (c + 1) * CHILDREN_PER_INPUT):
            seen.add(child_digest(k))
    for n in range(DONE):
        d = pending.popleft()
        dispatches[d] += 1
        if n < AGAIN:
            dispatches[d] += 1
        done.add(d)
    return known, done, pending, seen, depth, queue_ids, dispatches


def traced_bytes(build) -> tuple[int, int, object]:
    """Bytes still allocated after `build()` (what it returns keeps), and the peak."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = build()
    gc.collect()
    after, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return after - before, peak - before, kept


# -- time per operation ----------------------------------------------------------------------

def timed(count: int, run) -> float:
    started = time.perf_counter()
    run()
    return (time.perf_counter() - started) / count * 1e9


def time_operations() -> tuple[dict[str, float], Frontier]:
    corpus = [corpus_digest(c) for c in range(CORPUS)]
    children = [child_digest(k) for k in range(CORPUS * CHILDREN_PER_INPUT)]
    absent = [hashlib.sha256(b"absent %d" % i).hexdigest() for i in range(100_000)]
    f = Frontier()
    ns: dict[str, float] = {}

    def adds():
        for d in corpus:
            f.add(d)

    def depths():
        for c, d in enumerate(corpus):
            f.set_depth(d, depth_of(c))

    def queue_ids():
        for c, d in enumerate(corpus):
            f.set_queue_id(d, c)

    def sees():
        for d in children:
            f.see(d)

    def takes():
        for _ in range(DONE):
            f.take()

    def dispatches():
        for d in corpus[:DONE]:
            f.note_dispatch(d)

    def dones():
        for d in corpus[:DONE]:
            f.mark_done(d)

    def hits():
        known = f.known
        for d in corpus:
            assert d in known

    def misses():
        known = f.known
        for d in absent:
            assert d not in known

    def seen_checks():
        for d in children:
            assert f.seen_before(d)

    ns["add (new, into a growing table)"] = timed(CORPUS, adds)
    ns["set_depth"] = timed(CORPUS, depths)
    ns["set_queue_id"] = timed(CORPUS, queue_ids)
    ns["see (new child)"] = timed(len(children), sees)
    ns["take"] = timed(DONE, takes)
    ns["note_dispatch"] = timed(DONE, dispatches)
    ns["mark_done"] = timed(DONE, dones)
    ns["find: digest in known (hit)"] = timed(CORPUS, hits)
    ns["find: digest in known (miss)"] = timed(len(absent), misses)
    ns["seen_before (hit)"] = timed(len(children), seen_checks)

    # The table alone, on raw digests: what the hex conversion and Frontier layer add.
    raw = [bytes.fromhex(d) for d in children]
    table = DigestTable()

    def table_adds():
        for key in raw:
            table.add(key)

    def table_finds():
        for key in raw:
            table.find(key)

    ns["DigestTable.add (raw bytes, growing)"] = timed(len(raw), table_adds)
    ns["DigestTable.find (raw bytes, hit)"] = timed(len(raw), table_finds)
    return ns, f


def time_resume() -> dict[str, float]:
    digests = [hashlib.sha256(b"resume %d" % i).hexdigest() for i in range(RESUME)]
    done = set(digests[::2])
    started = time.perf_counter()
    f = Frontier()
    for d in digests:  # as job/resume.py does on --resume
        f.add(d, done=d in done)
    as_session = time.perf_counter() - started
    started = time.perf_counter()
    g = Frontier()
    for d in digests:
        g.add(d)
    for d in digests:
        g.mark_done(d)
    add_then_done = time.perf_counter() - started
    assert len(f) == RESUME // 2 and len(g.done) == RESUME
    return {"resume_build_seconds": as_session, "add_then_mark_done_seconds": add_then_done}


def print_table(rows: list[tuple[str, str]]) -> None:
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {value:>14}")


def main() -> None:
    new_bytes, new_peak, frontier = traced_bytes(grow_new)
    stats = frontier.statistics()
    assert (stats.known, stats.done, stats.pending, stats.seen) == (
        CORPUS, DONE, CORPUS - DONE, INPUTS - CORPUS), stats
    assert len(frontier._table) == INPUTS
    del frontier
    old_bytes, old_peak, old = traced_bytes(grow_old)
    assert len(old[3]) == INPUTS
    del old
    gc.collect()

    ns, timed_frontier = time_operations()
    cross_check = timed_frontier.memory_bytes()
    del timed_frontier
    resume = time_resume()

    per_input = new_bytes / INPUTS
    old_per_input = old_bytes / INPUTS
    print(f"master memory: {INPUTS:,} known inputs ({CORPUS:,} corpus added, "
          f"{INPUTS - CORPUS:,} children seen, {DONE:,} done, {stats.pending:,} pending)")
    print_table([
        ("bytes/input, Frontier (tracemalloc)", f"{per_input:.1f}"),
        ("bytes/input, Frontier (memory_bytes)", f"{stats.memory_bytes / INPUTS:.1f}"),
        ("bytes/input, Frontier, phased build", f"{cross_check / INPUTS:.1f}"),
        ("bytes/input, old sets/dicts of hex", f"{old_per_input:.1f}"),
        ("peak bytes/input while growing, new", f"{new_peak / INPUTS:.1f}"),
        ("peak bytes/input while growing, old", f"{old_peak / INPUTS:.1f}"),
        ("MB in all, new", f"{new_bytes / 1e6:.1f}"),
        ("MB in all, old", f"{old_bytes / 1e6:.1f}"),
    ])
    print()
    print_table([(f"ns per {name}", f"{value:.0f}") for name, value in ns.items()])
    print()
    print_table([
        (f"{RESUME:,}-input resume build, add(done=) (s)", f"{resume['resume_build_seconds']:.3f}"),
        (f"{RESUME:,}-input build, add then mark_done (s)",
         f"{resume['add_then_mark_done_seconds']:.3f}"),
    ])
    verdict = "met" if per_input <= TARGET_BYTES else "MISSED"
    print(f"target: <= {TARGET_BYTES} bytes per input: {verdict} ({per_input:.1f}); "
          f"resume build < {RESUME_TARGET_SECONDS} s: "
          f"{'met' if resume['resume_build_seconds'] < RESUME_TARGET_SECONDS else 'MISSED'}")
    print(json.dumps({
        "benchmark": "master_memory",
        "inputs": INPUTS, "corpus": CORPUS, "seen_only": INPUTS - CORPUS, "done": DONE,
        "pending": stats.pending,
        "bytes_per_input": round(per_input, 2),
        "memory_bytes_per_input": round(stats.memory_bytes / INPUTS, 2),
        "old_bytes_per_input": round(old_per_input, 2),
        "peak_bytes_per_input": round(new_peak / INPUTS, 2),
        "target_bytes_per_input": TARGET_BYTES,
        "ns_per_op": {name: round(value, 1) for name, value in ns.items()},
        "resume_inputs": RESUME,
        "resume_build_seconds": round(resume["resume_build_seconds"], 4),
        "add_then_mark_done_seconds": round(resume["add_then_mark_done_seconds"], 4),
        "resume_target_seconds": RESUME_TARGET_SECONDS,
    }))


if __name__ == "__main__":
    main()
