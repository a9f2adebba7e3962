"""The master's dispatch path, composed and free of MPI: frontier → transaction → commit.

`DispatchCoordinator` owns everything the master knows about work in flight and about its
workers, built from the parts of this package:

- every dispatch is a `DispatchTransaction` in the preparing/active/committing tables, made
  inside the tables' exception boundary (F313 D8), with the frontier entry as its reservation
  (before the send: put back in front, exactly; after it: the recovery below decides);
- the input's bytes travel with WORK as a content-addressed object, and only when the
  worker is not known to hold them; the cache learns that it does once the send returned
  (F313 §3.5, D7); the QSYM map bits the worker lacks travel the same way (`pruning.py`);
- a RESULT is current only for the exact token of its rank's ACTIVE dispatch (F315); one that
  is current but unusable, or a READY echoing a dispatch whose RESULT never came, is joined
  and recovered (F316); an ACTIVE dispatch past its deadline is rolled back and its rank
  parked until a READY carries exactly the retired token (F317). Both recoveries go through
  one `ProtocolRecovery`: requeue by the input's hash, then defer to the journal;
- the commit is fenced: an input already analysed is never committed again.

A worker rank is always in exactly one of these states: waiting for its first READY, idle,
holding one transaction, parked, or retired (FATAL, `max_send_failures` sends in a row
raised, or `max_invalid_results` RESULTs in a row were invalid). Only an idle rank gets
work, and `DispatchTables.begin` refuses a parked one anyway.

The master's round (F317 §4.2): handle every message in arrival order (`ready`, `classify`,
`reject`, `begin_commit` … `finish`), then `join`, then `dispatch`, then `sweep`. MPI keeps
one sender's messages in order, so a RESULT is seen before the READY its worker sent next;
the join runs before the deadline sweep (W3), and before the dispatch so that a rank it frees
gets work in the same round.
"""

from __future__ import annotations

import logging
import secrets
from collections import Counter, deque
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Protocol

from symcc_mpi.coverage.pruning import PruningLedger
from symcc_mpi.dispatch.objects import OBJECT_CACHE_CAPACITY, ObjectMismatch, ObjectTransferCache
from symcc_mpi.dispatch.statistics import DispatchStatistics
from symcc_mpi.dispatch.tables import CommitStart, DispatchTables, ResultClass, SweepReport, Table
from symcc_mpi.dispatch.transaction import SendPhase
from symcc_mpi.dispatch.watchdog import (
    DeferralSink,
    DispatchWatchdog,
    JoinReport,
    ProtocolRecovery,
    ReadyVerdict,
    Recovery,
    RecoveryOutcome,
    RecoverySource,
    RetiredDispatchGate,
    WatchdogConfig,
)
from symcc_mpi.durable.clock import SYSTEM_CLOCK, Clock
from symcc_mpi.scheduling.frontier import Frontier
from symcc_mpi.scheduling.splitting import (
    SPLIT_ANEW,
    TRACE,
    Job,
    WorkSource,
    keep_targets,
    parse_work_id,
)
from symcc_mpi.wire.protocol import Work

log = logging.getLogger("symcc_mpi.dispatch")

FRONTIER_ENTRY = "frontier-entry"
UNREADABLE_SOURCE = "unreadable-input"
MAX_SEND_FAILURES = 3  # in a row, to one rank: then it is retired
MAX_INVALID_RESULTS = 3  # in a row, from one rank (result_check.py): then it is retired
CLAIM_AHEAD = 2  # with several masters: leases claimed ahead, per idle worker or per worker

Send = Callable[[int, Work], object]
Adjuster = Callable[[int, Job], Job]  # (rank, job) -> the job as it goes to that rank


class Admission(Protocol):
    """Several masters share the frontier (federation.Federation): an input is dispatched
    only by the master that wins its shared lease, and its result counts only while the
    lease is still that master's."""

    def claim_ahead(self, pending: Iterable[str], count: int) -> None: ...
    def admit(self, digest: str) -> bool: ...
    def holds(self, digest: str) -> bool: ...
    def begin_commit(self, digest: str, pending: Iterable[str] = (), count: int = 0
                     ) -> bool: ...
    def fence(self, digests: Iterable[str], pending: Iterable[str] = (),
              count: int = 0) -> frozenset[str]: ...
    def complete(self, digest: str) -> None: ...
    def abandon(self, digest: str) -> None: ...


class DispatchCoordinator:
    def __init__(self, frontier: Frontier, *, watchdog: WatchdogConfig,
                 deferrals: DeferralSink | None, load: Callable[[str], bytes],
                 pruning: PruningLedger | None = None, clock: Clock = SYSTEM_CLOCK,
                 max_send_failures: int = MAX_SEND_FAILURES,
                 max_invalid_results: int = MAX_INVALID_RESULTS,
                 object_capacity: int = OBJECT_CACHE_CAPACITY,
                 on_requeue: Callable[[str, str], object] | None = None,
                 fatal: tuple[type[BaseException], ...] = (),
                 admission: Admission | None = None, source: WorkSource | None = None):
        """`on_requeue(input, why)` hears of every input that went out and is put back in
        the frontier to go out again (the master journals it: verify's re-execution oracle).
        `fatal`: errors of a send that end the master's communicator rather than tell
        anything of the rank (transport.RankFailure): compensated, then raised.
        `admission`: with several masters (federation.py), who may dispatch and commit what.
        `source`: the frontier with the parts of split inputs (splitting.py); by default
        whole inputs only. Work ids are its: an input's digest, or a part's id."""
        self.frontier = frontier
        self.source = source if source is not None else WorkSource(frontier)
        self.adjusters: list[Adjuster] = [self._ship_map_bits, self._seed_unpruned] \
            if pruning is not None else []
        self.seeds: set[str] = set()  # the campaign's seeds (--seeds): see _seed_unpruned
        self.workers = 0  # worker ranks, retired included: the master keeps it current
        self.admission = admission
        self.on_requeue = on_requeue
        self.fatal = fatal
        self.gate = RetiredDispatchGate()
        self.tables = DispatchTables(clock=clock, gate=self.gate)
        self.recovery = ProtocolRecovery(requeue=lambda work: self._requeue(work, "protocol"),
                                         sink=_InputDeferrals(deferrals, self.source, on_requeue)
                                         if deferrals is not None else None,
                                         retries=watchdog.protocol_retries)
        self.watchdog = DispatchWatchdog(self.tables, self.gate, self.recovery,
                                         seconds=watchdog.seconds)
        self.objects = ObjectTransferCache(object_capacity)
        self.pruning = pruning
        self.deferrals = deferrals
        self.load = load
        self.max_send_failures = max_send_failures
        self.max_invalid_results = max_invalid_results
        self.idle: deque[int] = deque()
        self.retired: set[int] = set()
        self.unreadable: set[str] = set()
        self.send_failures: Counter[int] = Counter()  # in a row, per rank
        self.invalid_results: Counter[int] = Counter()  # in a row, per rank
        self.counts: Counter[str] = Counter()
        self.generation = 0  # of the communicator WORK goes out on (ulfm/)
        self.epoch = 0  # of the pruning map WORK goes out under (tiers/schedule.py)

    # -- reading -------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self.tables)

    @property
    def exhausted(self) -> bool:
        return not self.source.has_pending and not self.in_flight

    def holds_token(self, token: str) -> bool:
        return any(tx.token == token for _, tx in self.tables.transactions())

    def work_of(self, rank: int, *, preparing: bool = False) -> str | None:
        """The work id of `rank`'s ACTIVE (or PREPARING) dispatch."""
        tx = self.tables.get(Table.PREPARING if preparing else Table.ACTIVE, rank)
        return tx.work_id if tx is not None else None

    @property
    def free_workers(self) -> int:
        """Workers neither retired nor holding a dispatch."""
        return max(0, self.workers - len(self.retired) - self.in_flight)

    def parked(self) -> list[int]:
        return sorted(self.gate.parked())

    # -- round step 1: messages ----------------------------------------------------------

    def ready(self, rank: int, token: str | None, *,
              malformed: bool = False) -> ReadyVerdict | None:
        """A READY (or an undecodable one) from `rank`; None if the rank is retired."""
        if rank in self.retired:
            return None
        verdict = self.watchdog.on_ready(rank, token, malformed=malformed)
        if verdict in (ReadyVerdict.IDLE, ReadyVerdict.RECOVERED):
            self._make_idle(rank)
        elif verdict is ReadyVerdict.STALE:
            self.counts["stale_ready"] += 1
        return verdict

    def classify(self, rank: int, token: str) -> ResultClass:
        return self.watchdog.on_result(rank, token)

    def reject(self, rank: int, token: str) -> bool:
        """A current RESULT that cannot be used: its dispatch is recovered at the join."""
        accepted = self.watchdog.note_invalid_result(rank, token)
        self.counts["invalid_results"] += int(accepted)
        return accepted

    def note_invalid_result(self, rank: int, reason: str) -> tuple[str, ...]:
        """`rank` sent a RESULT with a field that cannot be believed (rejected, or not even
        decodable). After `max_invalid_results` in a row it is retired: the tokens of the
        dispatches that took back, whose staging the caller discards."""
        self.invalid_results[rank] += 1
        if self.invalid_results[rank] < self.max_invalid_results:
            return ()
        return self.retire(rank, f"{self.invalid_results[rank]} invalid results in a row, "
                                 f"last: {reason}")

    def note_valid_result(self, rank: int) -> None:
        """A RESULT whose every field held: the run of invalid ones is broken."""
        self.invalid_results.pop(rank, None)

    def begin_commit(self, rank: int, token: str, *, completes_input: bool = True
                     ) -> CommitStart:
        """Fence the commit: work already done is dropped after-send (F313 D4). With several
        masters the input's shared lease fences it too: moved to `committing` by the commit
        that completes the input, only checked as still held by a part's before it."""
        found = self.tables.find(rank)
        work_id = found[1].work_id if found else ""
        digest, part = parse_work_id(work_id)
        stale = False

        def fence() -> bool:
            nonlocal stale
            if self.source.is_done(work_id):
                return False
            if self.admission is not None:
                stale = not (self.admission.begin_commit(digest, self.frontier.pending.head(),
                                                         self._ahead)
                             if completes_input else self.admission.holds(digest))
            return not stale

        start = self.tables.begin_commit(rank, token, fence)
        if start is CommitStart.FENCED:
            why = "whose lease another master took over" if stale else "already done"
            log.warning("rank %d analysed %s, %s: result dropped", rank, work_id[:12], why)
            if self.on_requeue is not None:  # this dispatch is given up, on record (F443)
                self.on_requeue(work_id, f"analysed, {why}")
            if stale and part is not None:  # the other master analyses the input
                _take_back_committed_parts(self.source, work_id, self.on_requeue)
                self.source.set_aside(work_id)
        return start

    def fence(self, results: list[tuple[int, str]]) -> None:
        """With several masters: the shared leases of the whole inputs whose RESULTs (`(rank,
        token)`) are in hand are fenced in one write, with the claims of the inputs to go out
        next (each commit's `begin_commit` then finds its input's fenced already). Fencing
        early is safe: a fenced lease stays this master's, and an input whose result is then
        refused goes out again from here under it."""
        digests = []
        for rank, token in results:
            found = self.tables.find(rank)
            if found is not None and found[1].token == token:
                digest, part = parse_work_id(found[1].work_id)
                if part is None and not self.source.is_done(digest):
                    digests.append(digest)
        if len(digests) > 1:
            self.admission.fence(digests, self.frontier.pending.head(), self._ahead)

    @property
    def _ahead(self) -> int:
        """How many inputs a master holds the leases of before it dispatches them."""
        return CLAIM_AHEAD * max(1, self.workers)

    def finish(self, rank: int, token: str, *, path_targets=None, solved_targets=(),
               completes_input: bool = True) -> None:
        """The commit went through (the caller journalled the input as done, or its part)."""
        tx = self.tables.finish(rank, token)
        self.source.finish(tx.work_id, path_targets, solved_targets, self.free_workers)
        if self.admission is not None and completes_input:
            self.admission.complete(parse_work_id(tx.work_id)[0])

    def commit_failed(self, rank: int, token: str) -> RecoveryOutcome | None:
        """The commit of `rank`'s dispatch raised before it finished: roll the dispatch back
        and send its input through the retry/defer path, as a bad RESULT's is. What was
        published before the failure stays; the retried run offers the rest again (its
        children were not marked seen). None if that dispatch is not committing."""
        found = self.tables.find(rank)
        if found is None or found[0] is not Table.COMMITTING or found[1].token != token:
            return None
        self.tables.abort(rank, token)
        self.counts["commit_failures"] += 1
        return self.recovery.recover(found[1].work_id, RecoverySource.COMMIT_FAILED)

    @contextmanager
    def boundary(self, rank: int) -> Iterator[None]:
        """Around a commit: whatever raises, the rank's transactions are compensated (D8) and,
        as on `retire` and `shutdown`, an input that was sent goes back to the frontier."""
        try:
            yield
        except BaseException:
            self._requeue_swept(self.tables.sweep(rank))
            raise

    def give_back(self, rank: int) -> None:
        """`rank`'s dispatch failed for a reason that is not its input's (OUT refuses
        writes): compensated, and its input requeued with no failure counted against it."""
        self._requeue_swept(self.tables.sweep(rank))

    def retire(self, rank: int, reason: str) -> tuple[str, ...]:
        """No more work to `rank`; what it held goes back to the frontier. Returns the tokens
        of the dispatches taken back."""
        if rank in self.retired:
            return ()
        self.retired.add(rank)
        if rank in self.idle:
            self.idle.remove(rank)
        swept = self.tables.sweep(rank)
        self._requeue_swept(swept)
        log.error("rank %d gets no more work: %s", rank, reason)
        return tuple(rollback.token for rollback in swept.rollbacks)

    # -- round steps 2-4 -----------------------------------------------------------------

    def join(self) -> JoinReport:
        report = self.watchdog.join()
        for rank in report.ready:
            if rank not in self.retired and not self.tables.holds(rank):
                self._make_idle(rank)
        return report

    def dispatch(self, send: Send) -> int:
        """Hand frontier inputs to idle ranks; return how many WORK sends returned."""
        sent = 0
        if self.admission is not None and self.idle:
            self.admission.claim_ahead(self.frontier.pending.head(),
                                       CLAIM_AHEAD * len(self.idle))
        while self.idle:
            work_id = self.source.peek(max(self.free_workers, len(self.idle)), self.idle[0])
            if work_id is None:
                break
            if self._dispatch_one(self.idle.popleft(), work_id, send):
                sent += 1
        return sent

    def sweep(self) -> tuple[Recovery, ...]:
        return self.watchdog.sweep()

    def shutdown(self) -> tuple[SweepReport, ...]:
        """Compensate whatever is still in flight; its inputs stay pending for --resume."""
        reports = self.tables.sweep_all()
        for report in reports:
            self._requeue_swept(report)
        return reports

    def begin_generation(self, generation: int, failed: Collection[int],
                         retired: Collection[int]) -> list[str]:
        """The communicator was repaired (ulfm/): every dispatch in flight is taken back (F443
        §4 step 4, conservative replay: the old generation's RESULTs can no longer arrive),
        the inputs of the `failed` ranks first in line, then the others. Rank-keyed state is
        dropped: the new generation numbers its ranks anew, `retired` (in the new numbering)
        stay retired. Returns the inputs requeued, in the order they go out again."""
        requeued: list[str] = []
        # The frontier's front is a stack: what is requeued last goes out first.
        for report in sorted(self.tables.sweep_all(), key=lambda r: r.worker in failed):
            for rollback in report.rollbacks:
                if rollback.phase is SendPhase.AFTER_SEND:
                    self.source.requeue(rollback.work_id)
                    requeued.insert(0, rollback.work_id)
        self.generation = generation
        self.watchdog.forget_ranks()
        self.objects.forget_all()
        if self.pruning is not None:
            self.pruning.forget_all()
        self.idle.clear()
        self.retired = set(retired)
        self.send_failures.clear()
        self.invalid_results.clear()
        self.counts["generation_requeued"] += len(requeued)
        return requeued

    # -- machinery -----------------------------------------------------------------------

    def _dispatch_one(self, rank: int, work_id: str, send: Send) -> bool:
        digest, targets = self.source.job(work_id)
        at_frontier = parse_work_id(work_id)[1] in (None, TRACE)  # else a group of a split input
        if at_frontier and self.admission is not None and not self.admission.admit(digest):
            self.frontier.take()  # another master's: it analyses it
            self.idle.appendleft(rank)
            return False
        try:
            plan = self.objects.plan(rank, [digest], self.load)
        except (OSError, ObjectMismatch) as error:
            self.source.discard(work_id)
            self._set_aside_unreadable(digest, error)
            self.idle.appendleft(rank)
            return False
        job = Job(work_id, digest, targets)
        for adjust in self.adjusters:
            job = adjust(rank, job)
        job = keep_targets(job, targets)
        shipment = job.shipment
        token = secrets.token_hex(16)
        try:
            with self.tables.boundary(rank):
                tx = self.tables.begin(rank, work_id, token)
                self.source.take(work_id)
                tx.register(FRONTIER_ENTRY, before_send=lambda: self.source.put_back(work_id),
                            after_send=lambda: None)  # after the send, recovery decides
                send(rank, Work(token, digest, dict(plan.contents),
                                pruning=shipment.payload if shipment else b"",
                                generation=self.generation, epoch=self.epoch,
                                targets=None if job.targets is None else list(job.targets),
                                pruned=job.pruned))
                self.tables.sent(rank, token)
                self.objects.confirm(plan)
                if shipment is not None:
                    self.pruning.confirm(shipment)
        except self.fatal:
            raise  # the boundary compensated: the input is first in line again
        except Exception as error:  # noqa: BLE001 - the boundary compensated; the rank decides
            self._send_failed(rank, error)
            return False
        if self.source.note_dispatch(work_id) == 2:  # here: a report must not walk the corpus
            self.counts["inputs_dispatched_again"] += 1
        self.send_failures.pop(rank, None)  # a send returned: the run of failures is broken
        return True

    def _ship_map_bits(self, rank: int, job: Job) -> Job:
        return replace(job, shipment=self.pruning.plan(rank))

    def _seed_unpruned(self, rank: int, job: Job) -> Job:
        """A seed's first analysis, whole, solves every branch, as SymCC's bare loop does:
        with QSYM's map and linearization on, one run of a large seed skips most of its
        branches as seen already (toml-large: the bare loop's first runs reached 1932 edges,
        a pruned campaign 1845 in 120 s). Its children are pruned as usual."""
        if job.targets is None and self.epoch == 0 and job.digest in self.seeds:
            return replace(job, pruned=False)
        return job

    def _send_failed(self, rank: int, error: Exception) -> None:
        self.objects.forget(rank)  # it may have delivered: the windows would drift apart
        self.counts["send_failures"] += 1
        self.send_failures[rank] += 1
        failures = self.send_failures[rank]
        log.warning("dispatch to rank %d failed (%d in a row), rolled back before send: %s",
                    rank, failures, error)
        if failures >= self.max_send_failures:
            self.retire(rank, f"{failures} sends in a row failed, last: {error}")
        else:
            self._make_idle(rank)

    def readmit(self, digest: str) -> None:
        """`digest`'s bytes are published again (commit.py): set aside as unreadable, it
        goes out again."""
        if digest in self.unreadable:
            self.unreadable.discard(digest)
            self.frontier.requeue(digest)

    def _set_aside_unreadable(self, digest: str, error: Exception) -> None:
        self.unreadable.add(digest)
        if self.admission is not None:
            self.admission.abandon(digest)
        log.error("corpus input %s cannot be sent (%s): set aside in the deferred journal",
                  digest[:12], error)
        if self.deferrals is not None:
            self.deferrals.defer(digest, source=UNREADABLE_SOURCE, attempts=0)

    def _requeue_swept(self, report: SweepReport) -> None:
        for rollback in report.rollbacks:
            if rollback.phase is SendPhase.AFTER_SEND:
                self._requeue(rollback.work_id, "taken back")

    def _requeue(self, work_id: str, why: str) -> None:
        self.source.requeue(work_id)
        if self.on_requeue is not None:
            self.on_requeue(work_id, why)

    def _make_idle(self, rank: int) -> None:
        if rank not in self.idle:
            self.idle.append(rank)

    def statistics(self) -> DispatchStatistics:
        watchdog = self.watchdog.statistics()
        tables = self.tables.statistics()
        objects = self.objects.statistics()
        recovery = self.recovery.statistics()
        return DispatchStatistics(
            watchdog_seconds=watchdog.seconds,
            watchdog_timeouts=watchdog.timeouts,
            worker_recoveries=watchdog.worker_recoveries,
            protocol_requeued=watchdog.protocol_requeued,
            protocol_deferred=watchdog.protocol_deferred,
            deferred_in_memory=recovery.deferred_in_memory,
            recoveries_by_source=dict(recovery.by_source),
            invalid_results=self.counts["invalid_results"],
            commit_failures=self.counts["commit_failures"],
            invalid_joins=watchdog.invalid_joins,
            stale_results=watchdog.stale_results,
            stale_ready=self.counts["stale_ready"],
            ready_quarantined=(watchdog.ready_missing + watchdog.ready_malformed
                                  + watchdog.ready_stale),
            parked=self.parked(),
            retired=sorted(self.retired),
            retired_for_invalid_results=sorted(
                rank for rank in self.retired
                if self.invalid_results[rank] >= self.max_invalid_results),
            send_failures=self.counts["send_failures"],
            unreadable_inputs=len(self.unreadable),
            dispatched=tables.sent,
            inputs_dispatched_again=self.counts["inputs_dispatched_again"],
            committed=tables.committed,
            fenced=tables.fenced,
            rolled_back_before_send=tables.rolled_back_before_send,
            rolled_back_after_send=tables.rolled_back_after_send,
            compensation_failures=tables.compensation_failures,
            preparing=tables.preparing,
            active=tables.active,
            committing=tables.committing,
            objects_shipped=objects.shipped_objects,
            object_bytes_shipped=objects.shipped_bytes,
            object_hits=objects.hits,
        )


class _InputDeferrals:
    """The deferral sink, by input: a part deferred sets its whole input aside (splitting.py).
    `announce` (on_requeue) hears that the dispatch was taken back, and so were the parts of
    its input committed already: it may go out again (on --resume), to be split anew."""

    def __init__(self, sink: DeferralSink, source: WorkSource,
                 announce: Callable[[str, str], object] | None):
        self.sink = sink
        self.source = source
        self.announce = announce

    def defer(self, work_id: str, *, source: str, attempts: int) -> object:
        if self.announce is not None:
            self.announce(work_id, "deferred")
        _take_back_committed_parts(self.source, work_id, self.announce)
        return self.sink.defer(self.source.set_aside(work_id), source=source, attempts=attempts)

    def is_persisted(self, work_id: str) -> bool:
        return self.sink.is_persisted(parse_work_id(work_id)[0])


def _take_back_committed_parts(source: WorkSource, work_id: str,
                               announce: Callable[[str, str], object] | None) -> None:
    """The parts of `work_id`'s input committed already, declared taken back (F443): its
    split is set aside, and should the input come back it is split anew."""
    if announce is not None:
        for part in source.committed_parts(work_id):
            announce(part, SPLIT_ANEW)
