"""QSYM pruning shared across workers (`pruning.py`) under random dispatches, runs and faults.

The machine plays the master's ledger (`--pruning shared` or `local`) and three workers, each
a real `WorkerMap` whose map file lives in a temporary directory. A dispatch plans what the
worker lacks, then the send returns (the worker receives it, the ledger confirms), raises
before delivering (nothing), or raises after delivering (the worker receives and runs it, the
ledger never confirms and the RESULT is never committed). A run ORs random bits into the map
file after `prepare`, from a few small index ranges in both halves of the map so that workers
find the same bits; its RESULT is then committed (its contribution merged) or dropped (stale,
timed out). The master may also be restarted from its saved maps (`--resume`): the workers
start again with empty maps. The ledger's log cap is sometimes shrunk so that segments fall
off the log and whole maps ship.

Properties: nothing uncommitted ever prunes (every worker's base is inside its scope's map);
a confirmed dispatch leaves the worker lacking nothing committed before it (its base is then
exactly its scope's map); each scope's map is the OR of its committed contributions; a
contribution holds only bits beyond the worker's base; merging a contribution again adds
nothing.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from symcc_mpi.coverage import pruning
from symcc_mpi.coverage.pruning import (
    MAP_SIZE,
    PruningLedger,
    PruningMode,
    WorkerMap,
    decode,
)

RANKS = (1, 2, 3)
# A few indices in the trace half, the context half and the map's last byte: runs collide.
INDICES = (*range(0, 6), 65535, *range(65536, 65540), MAP_SIZE - 1)
BITS = st.lists(st.tuples(st.sampled_from(INDICES), st.sampled_from([1 << k for k in range(8)])),
                min_size=0, max_size=6)
SEND = st.sampled_from(["ok"] * 4 + ["lost", "delivered"])
ZERO = bytes(MAP_SIZE)
NONE = (0,) * len(INDICES)
Bits = tuple  # a map's bytes at INDICES (every other byte is zero)


def view(data: bytes) -> Bits:
    """A whole map's bytes at INDICES, after checking that it has no bit anywhere else."""
    values = tuple(data[i] for i in INDICES)
    assert MAP_SIZE - data.count(0) == sum(1 for v in values if v), "a bit outside INDICES"
    return values


def delta_view(delta) -> Bits:
    values = dict.fromkeys(INDICES, 0)
    for index, byte in zip(memoryview(delta.indices).cast("I"), delta.bits, strict=True):
        values[index] |= byte
    return tuple(values[i] for i in INDICES)


def union(a: Bits, b: Bits) -> Bits:
    return tuple(x | y for x, y in zip(a, b, strict=True))


def minus(a: Bits, b: Bits) -> Bits:
    return tuple(x & ~y for x, y in zip(a, b, strict=True))


def entries(a: Bits) -> int:
    return sum(1 for x in a if x)


@dataclass
class Worker:
    wmap: WorkerMap
    state: str = "idle"  # idle, then busy (WORK received), then ran (RESULT pending)
    committable: bool = False  # the master confirmed the WORK: its RESULT may be committed
    base_at_run: Bits = NONE
    added: Bits = NONE  # the bits the run wrote into its map file


class PruningMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)
        self.saved_cap = pruning._LOG_CAP

    @initialize(mode=st.sampled_from([PruningMode.SHARED, PruningMode.LOCAL]),
                cap=st.sampled_from([pruning._LOG_CAP, 3, 8]))
    def start(self, mode, cap):
        pruning._LOG_CAP = cap  # read by merge at each call: small, segments fall off the log
        self.mode = mode
        self.ledger = PruningLedger(mode)
        self.workers = {r: Worker(WorkerMap(self.dir / f"rank-{r}.map")) for r in RANKS}
        self.committed: dict[str, Bits] = {}  # scope -> OR of its committed contributions
        self.last_commit: tuple[int, bytes] | None = None
        self.restarts = 0
        self.forgotten = 0
        self.commits = 0

    def teardown(self):
        pruning._LOG_CAP = self.saved_cap
        self.tmp.cleanup()

    # -- helpers

    def scope_map(self, rank: int) -> Bits:
        return view(self.ledger.maps().get(self.ledger.scope_of(rank), ZERO))

    def in_state(self, state):
        return [r for r, w in self.workers.items() if w.state == state]

    # -- rules

    @precondition(lambda self: self.in_state("idle"))
    @rule(data=st.data(), send=SEND)
    def dispatch(self, data, send):
        rank = data.draw(st.sampled_from(self.in_state("idle")), label="rank")
        worker = self.workers[rank]
        before_maps = _nonempty(self.ledger.maps())
        before = self.scope_map(rank)
        shipment = self.ledger.plan(rank)
        # Planning changes no bits (it may open the rank's scope, empty).
        assert _nonempty(self.ledger.maps()) == before_maps
        kind = "whole" if shipment.whole else "segments" if shipment.payload else "empty"
        event(f"{send} shipment {kind}")
        if send == "lost":  # the send raised before delivering
            return
        worker.wmap.receive(shipment.payload)
        worker.state = "busy"
        worker.committable = send == "ok"
        if send == "ok":
            self.ledger.confirm(shipment)
            base = view(worker.wmap.base)
            # It lacks nothing committed before its dispatch (and by the invariant holds
            # nothing uncommitted: its base is exactly its scope's map).
            assert minus(before, base) == NONE
            assert base == before
            assert self.ledger.plan(rank).payload == b""  # nothing more to ship until a merge

    @precondition(lambda self: self.in_state("busy"))
    @rule(data=st.data(), bits=BITS)
    def run(self, data, bits):
        rank = data.draw(st.sampled_from(self.in_state("busy")), label="rank")
        worker = self.workers[rank]
        worker.wmap.prepare()  # whatever the last run left in the file
        content = bytearray(worker.wmap.path.read_bytes())
        assert content == worker.wmap.base
        added = dict.fromkeys(INDICES, 0)
        for index, bit in bits:  # QSYM only ever ORs bits in
            content[index] |= bit
            added[index] |= bit
        worker.wmap.path.write_bytes(content)
        worker.base_at_run = view(worker.wmap.base)
        worker.added = tuple(added[i] for i in INDICES)
        worker.state = "ran"

    @precondition(lambda self: self.in_state("ran"))
    @rule(data=st.data(), commit=st.sampled_from([True, True, True, False]))
    def finish(self, data, commit):
        rank = data.draw(st.sampled_from(self.in_state("ran")), label="rank")
        worker = self.workers[rank]
        contribution = worker.wmap.contribution()
        delta = decode(contribution)
        assert not delta.full
        bits = delta_view(delta)
        assert bits == minus(worker.added, worker.base_at_run)  # only what the run added
        # The base never takes the run's own bits: a dropped run's redo is not pruned by it.
        assert view(worker.wmap.base) == worker.base_at_run
        worker.state = "idle"
        if not (commit and worker.committable):
            event("result dropped")
            return
        event("result committed" if bits != NONE else "result committed, nothing added")
        scope = self.ledger.scope_of(rank)
        known = self.committed.get(scope, NONE)
        assert self.ledger.merge(rank, delta) == entries(minus(bits, known))
        self.committed[scope] = union(known, bits)
        self.last_commit = (rank, contribution)
        self.commits += 1

    @precondition(lambda self: self.last_commit is not None)
    @rule()
    def merge_again(self):
        rank, contribution = self.last_commit
        plans = {r: self.ledger.plan(r) for r in RANKS}  # (may open empty scopes)
        maps = self.ledger.maps()
        assert self.ledger.merge(rank, decode(contribution)) == 0
        assert self.ledger.maps() == maps
        assert {r: self.ledger.plan(r) for r in RANKS} == plans  # no segment logged

    @precondition(lambda self: self.forgotten < 2)
    @rule(rank=st.sampled_from(RANKS))
    def forget(self, rank):
        self.forgotten += 1
        self.ledger.forget(rank)
        shipment = self.ledger.plan(rank)
        if self.scope_map(rank) != NONE:
            assert shipment.payload  # it ships from the start again

    @precondition(lambda self: self.commits and self.restarts < 1)  # once, with bits to save
    @rule()
    def resume(self):
        """The master restarts from its saved maps (`save_maps`/`load_maps` are tested in
        tests/unit/test_pruning.py; their fsyncs would slow the machine); the workers start
        again with empty maps."""
        self.restarts += 1
        self.ledger = PruningLedger(self.mode, self.ledger.maps())
        for rank in RANKS:
            self.workers[rank] = Worker(WorkerMap(self.dir / f"rank-{rank}-{self.restarts}.map"))
        event("resumed")

    # -- invariants

    @invariant()
    def events(self):
        event(f"commits: {min(self.commits, 5)}{'+' if self.commits >= 5 else ''}")

    @invariant()
    def maps_and_bases(self):
        maps = self.ledger.maps()
        views = {scope: view(data) for scope, data in maps.items()}
        # Each scope's map is the OR of its committed contributions (no map: no bits yet).
        for scope, bits in self.committed.items():
            assert views.get(scope, NONE) == bits, scope
        for scope, bits in views.items():
            if scope not in self.committed:
                assert bits == NONE, scope
        if self.mode is PruningMode.SHARED:
            assert set(maps) <= {pruning.SHARED_SCOPE}
        # Nothing uncommitted ever prunes: a worker's base is inside its scope's map.
        for rank, worker in self.workers.items():
            scope_bits = views.get(self.ledger.scope_of(rank), NONE)
            assert minus(view(worker.wmap.base), scope_bits) == NONE, rank
        stats = self.ledger.statistics()
        assert stats.map_bytes_set == sum(entries(b) for b in self.committed.values())


def _nonempty(maps: dict[str, bytes]) -> dict[str, bytes]:
    return {scope: data for scope, data in maps.items() if data != ZERO}


TestPruningMachine = PruningMachine.TestCase
TestPruningMachine.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
