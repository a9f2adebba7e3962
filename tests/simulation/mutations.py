"""Deliberately broken variants of the code under simulation, each breaking one rule the
simulation must catch (issue 14). A variant is the real source of one function with one
edit, compiled where the function lives and patched in for the duration of `apply(name)`:
the same textual mutation a mutation-testing tool would make."""

from __future__ import annotations
import __future__

import contextlib
import inspect
import textwrap
from dataclasses import dataclass
from types import ModuleType

from symcc_mpi.campaign.checkpoint import Checkpointer
from symcc_mpi.campaign.done_log import DoneLog
from symcc_mpi.coverage.pruning import WorkerMap
from symcc_mpi.dispatch.coordinator import DispatchCoordinator
from symcc_mpi.dispatch.tables import DispatchTables
from symcc_mpi.dispatch.watchdog import DispatchWatchdog, ProtocolRecovery
from symcc_mpi.durable import atomic
from symcc_mpi.federation.work_leases import WorkLease
from symcc_mpi.roles.master import Master
from symcc_mpi.roles.results import ResultJudge
from symcc_mpi.roles.stopping import Stopping
from symcc_mpi.scheduling.splitting import WorkSource


@dataclass(frozen=True)
class Edit:
    owner: type | ModuleType  # a module's function is changed in place: its importers see it
    function: str
    old: str
    new: str


@dataclass(frozen=True)
class Mutation:
    rule: str
    what: str
    edits: tuple[Edit, ...]


MUTATIONS = {
    "cache-before-send": Mutation(
        "F313 D7",
        "the object cache is updated before the WORK send, and a failed send does not undo "
        "it (its rollback, forgetting the rank's cache, alone would mask the reordering)",
        (Edit(DispatchCoordinator, "_dispatch_one",
              "                send(rank, Work(",
              "                self.objects.confirm(plan)\n                send(rank, Work("),
         Edit(DispatchCoordinator, "_dispatch_one",
              "                self.tables.sent(rank, token)\n"
              "                self.objects.confirm(plan)\n",
              "                self.tables.sent(rank, token)\n"),
         Edit(DispatchCoordinator, "_send_failed",
              "        self.objects.forget(rank)", "        pass"))),
    "active-popped-before-begin-commit": Mutation(
        "F313 D5",
        "the transaction leaves `active` before `begin_commit`'s fence runs",
        (Edit(DispatchTables, "begin_commit",
              "        if not fence():",
              "        del self._tables[Table.ACTIVE][worker]\n        if not fence():"),
         Edit(DispatchTables, "begin_commit",
              "        self._tables[Table.COMMITTING][worker] = tx\n"
              "        del self._tables[Table.ACTIVE][worker]",
              "        self._tables[Table.COMMITTING][worker] = tx"))),
    "committing-stolen-by-age": Mutation(
        "F321",
        "a `committing` work lease expires like a `leased` one",
        (Edit(WorkLease, "expired", 'self.status == "leased"',
              'self.status in ("leased", "committing")'),)),
    "older-generation-accepted": Mutation(
        "F443",
        "a RESULT of an older generation is judged and committed",
        (Edit(ResultJudge, "_current", "if result.generation != self.dispatch.generation:",
              "if result.generation > self.dispatch.generation:"),)),
    "idle-master-exits": Mutation(
        "F320",
        "a master whose own frontier is exhausted ends the campaign without the COMMIT round",
        (Edit(Stopping, "reason",
              "if self.dispatch.exhausted and federation is None and self.importer is None:",
              "if self.dispatch.exhausted and self.importer is None:"),
         Edit(Stopping, "reason",
              "            if not federation.root:\n                return \"\"\n",
              ""))),
    "fence-ignored": Mutation(
        "F320 fence",
        "a commit goes on when its fence says another master took the lease over",
        (Edit(DispatchTables, "begin_commit", "        if not fence():",
              "        if not (fence() or True):"),)),
    "put-back-lost": Mutation(
        "F313 D5",
        "a dispatch taken back (its worker died, retired or OUT refused) is not requeued",
        (Edit(DispatchCoordinator, "_requeue_swept",
              '                self._requeue(rollback.work_id, "taken back")',
              "                pass"),)),
    "reservation-uncompensated": Mutation(
        "F313 D2",
        "the frontier entry a dispatch takes registers no compensation",
        (Edit(DispatchCoordinator, "_dispatch_one",
              "                tx.register(FRONTIER_ENTRY, before_send=lambda: "
              "self.source.put_back(work_id),\n"
              "                            after_send=lambda: None)",
              "                pass"),)),
    "failed-send-counted": Mutation(
        "F313 D3",
        "a dispatch is counted before its WORK send, so a send that fails counts one",
        (Edit(DispatchCoordinator, "_dispatch_one",
              "                send(rank, Work(",
              "                dispatches = self.source.note_dispatch(work_id)\n"
              "                send(rank, Work("),
         Edit(DispatchCoordinator, "_dispatch_one",
              "        if self.source.note_dispatch(work_id) == 2:",
              "        if dispatches == 2:"))),
    "discard-uncounts-the-dispatch": Mutation(
        "F313 D4",
        "a group dispatch taken back after its send is uncounted, as if it never went out",
        (Edit(WorkSource, "requeue",
              "        self._unreserve(work_id)\n        self.waiting.appendleft(work_id)",
              "        self._unreserve(work_id)\n        self.stats.split_dispatches -= 1\n"
              "        self.waiting.appendleft(work_id)"),)),
    "targets-held-after-commit": Mutation(
        "F313 D6",
        "a committed group keeps its targets reserved: the dispatch's compensations are "
        "dropped before its targets are released",
        (Edit(WorkSource, "finish",
              "            self._unreserve(work_id)\n            self.groups.pop(work_id, None)",
              "            self.groups.pop(work_id, None)"),)),
    "commit-boundary-leaks": Mutation(
        "F313 D8",
        "a commit that raises leaves its dispatch in `committing`, uncompensated",
        (Edit(DispatchCoordinator, "boundary",
              "            self._requeue_swept(self.tables.sweep(rank))\n            raise",
              "            raise"),)),
    "watchdog-on-wall-clock": Mutation(
        "F317 W2",
        "the watchdog's sweep reads the wall clock, not the monotonic one",
        (Edit(DispatchWatchdog, "sweep", "self.clock.monotonic()", "self.clock.time()"),)),
    "sweep-before-results": Mutation(
        "F317 W3",
        "the master's round sweeps the deadlines before it handles the messages it received",
        (Edit(Master, "_round",
              "            for recovery in self.dispatch.sweep():\n"
              "                self.times.sends.pop(recovery.token, None)  # its staging may "
              "still grow\n", ""),
         Edit(Master, "_round",
              "        if self.federation is not None and len(arrived) > 1:",
              "        self.dispatch.sweep()\n"
              "        if self.federation is not None and len(arrived) > 1:"))),
    "timeout-parks-on-the-work-id": Mutation(
        "F317 W4",
        "a timeout parks the rank on its work's id, not on the exact dispatch token",
        (Edit(DispatchWatchdog, "sweep", "            self.gate.park(rank, token)",
              "            self.gate.park(rank, self.tables.find(rank)[1].work_id)"),)),
    "timeout-not-requeued": Mutation(
        "F317 W5",
        "a work recovered after a protocol failure or a timeout is counted but not requeued",
        (Edit(ProtocolRecovery, "recover", "            self._requeue(work_id)\n", ""),)),
    "parked-rank-freed-by-its-result": Mutation(
        "F317 W7",
        "a parked rank's late RESULT is admitted at the gate as its READY would be: it "
        "unparks the rank before its READY says its old dispatch ended",
        (Edit(DispatchWatchdog, "on_result",
              "        verdict = self.tables.classify(rank, token)",
              "        self.gate.admit(rank, token)\n"
              "        verdict = self.tables.classify(rank, token)"),)),
    "late-result-taken-as-current": Mutation(
        "F317 W8",
        "a parked rank's late RESULT of its retired token is classified current",
        (Edit(DispatchWatchdog, "on_result",
              "        verdict = self.tables.classify(rank, token)",
              "        if self.gate.parked().get(rank) == token:\n"
              "            return ResultClass.CURRENT\n"
              "        verdict = self.tables.classify(rank, token)"),)),
    "timeouts-uncounted": Mutation(
        "F317 W9",
        "a watchdog timeout is not counted in the master's figures",
        (Edit(DispatchWatchdog, "sweep", '            self._counts["timeouts"] += 1\n', ""),)),
    "worker-keeps-its-own-bits": Mutation(
        "QSYM pruning: only committed runs prune",
        "a worker folds its run's QSYM map bits into its base map before its master commits "
        "the run (a dropped RESULT's bits then prune the run that redoes it)",
        (Edit(WorkerMap, "contribution",
              "        return encode(difference(self.base, after))",
              "        delta = difference(self.base, after)\n"
              "        apply(self.base, delta)\n"
              "        return encode(delta)"),)),
    # Found only by the disk that forgets (disk.py): without it nothing written is lost.
    "pruning-saved-before-sync": Mutation(
        "checkpoint: maps saved after the done records are durable",
        "the QSYM pruning maps are saved before the group commit that makes the runs whose "
        "bits they hold durable",
        (Edit(Checkpointer, "after_round", "        self.campaign.sync_done()\n",
              "        if self.pruning is not None and self.pruning.dirty:\n"
              "            self.save_pruning()\n"
              "        self.campaign.sync_done()\n"),)),
    "cursors-saved-before-sync": Mutation(
        "hybrid: the fleet's cursors saved after their imports are durable",
        "the cursors into the fuzzers' queues are saved before the group commit that makes "
        "the entries they passed durable",
        (Edit(Checkpointer, "after_round", "        self.campaign.sync_done()\n",
              "        if self.importer is not None:\n"
              "            self.importer.save()\n"
              "        self.campaign.sync_done()\n"),)),
    "children-unsynced-before-done": Mutation(
        "group commit: children durable before their done record",
        "the group commit appends the done records without fsyncing the published children",
        (Edit(DoneLog, "sync", "            fsync_once(path, synced)", "            pass"),)),
    "directories-unsynced-before-done": Mutation(
        "group commit: children's names durable before their done record",
        "the group commit appends the done records without fsyncing the children's "
        "directories",
        (Edit(DoneLog, "sync", "            fsync_directory(directory)", "            pass"),)),
    "directory-made-unsynced": Mutation(
        "a directory made is durable",
        "a directory the campaign makes (OUT, its state) is not fsynced into its parent",
        (Edit(atomic, "make_directories", "        fsync_directory(directory.parent)",
              "        pass"),)),
}


def _mutated(owner: type | ModuleType, function: str, edits: list[Edit]):
    original = owner.__dict__[function]
    source = inspect.getsource(original)  # indented as in its class, as the edits are
    for edit in edits:
        if edit.old not in source:
            raise LookupError(f"mutation of {owner.__name__}.{function}: {edit.old!r} is no "
                              "longer in its source")
        source = source.replace(edit.old, edit.new, 1)
    source = textwrap.dedent(source)
    namespace: dict = {}
    code = compile(source, inspect.getsourcefile(original), "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, original.__globals__, namespace)  # noqa: S102
    return original, namespace[function]


@contextlib.contextmanager
def apply(name: str):
    """The variant `name` in place of the real code, within the block."""
    by_function: dict[tuple[type | ModuleType, str], list[Edit]] = {}
    for edit in MUTATIONS[name].edits:
        by_function.setdefault((edit.owner, edit.function), []).append(edit)
    saved = []
    try:
        for (owner, function), edits in by_function.items():
            original, variant = _mutated(owner, function, edits)
            if isinstance(owner, ModuleType):
                saved.append((original, "__code__", original.__code__))
                original.__code__ = variant.__code__
            else:
                saved.append((owner, function, original))
                setattr(owner, function, variant)
        yield MUTATIONS[name]
    finally:
        for owner, attribute, original in reversed(saved):
            setattr(owner, attribute, original)
