"""One pass per RESULT, in order: decoded (by the channel, protocol.decode), its dispatch's
(the coordinator's tables: a stale or foreign one is dropped), its fields checked
(result_check.check_fields), its staged pack opened once (index checked, the children that
may be kept read and hashed: commit.Committer.check), then committed inside its dispatch
transaction (commit.Committer.commit), the manifest on record first under ULFM (F443).

A RESULT refused on the way (DESIGN §2) is counted under its field, its dispatch recovered
and its rank retired after too many; one whose worker says it did not analyse its input
gives the input back; neither blames the input."""

from __future__ import annotations

import errno
import logging
from collections import Counter
from collections.abc import Callable

from symcc_mpi.campaign.commit import Accepted, Committer, Refused, Unusable
from symcc_mpi.campaign.stats import MasterStats
from symcc_mpi.campaign.uploads import PackUploads
from symcc_mpi.dispatch.coordinator import DispatchCoordinator
from symcc_mpi.dispatch.tables import CommitStart, ResultClass
from symcc_mpi.durable.storage import storage_refused
from symcc_mpi.executors import Outcome
from symcc_mpi.roles.faults import FaultKind, Faults, die
from symcc_mpi.roles.records import WorkRecords
from symcc_mpi.roles.stopping import Stopping
from symcc_mpi.scheduling.splitting import TRACE, WorkSource, parse_work_id
from symcc_mpi.wire.protocol import INTERRUPTED, INVALID_INPUT, STORAGE_REFUSED, Result, ResultField

log = logging.getLogger("symcc_mpi.master")


class ResultJudge:
    def __init__(self, dispatch: DispatchCoordinator, committer: Committer, split: WorkSource,
                 records: WorkRecords, faults: Faults, stats: MasterStats, stopping: Stopping,
                 *, campaign, frontier, lower, federation, pruning,
                 count_doorbells: Callable[[], object], uploads: PackUploads):
        self.dispatch = dispatch
        self.uploads = uploads  # the packs that came over MPI
        self.committer = committer
        self.split = split
        self.records = records
        self.faults = faults
        self.stats = stats
        self.stopping = stopping
        self.campaign = campaign
        self.frontier = frontier
        self.lower = lower  # tiers.lower.LowerTiers, or None
        self.federation = federation  # federation.masters.Federation, or None
        self.pruning = pruning
        self.count_doorbells = count_doorbells
        self.commits_seen: Counter[str] = Counter()  # per point of the commit (faults)

    def handle(self, rank: int, result: Result) -> None:
        if not self._current(rank, result):
            return
        if (problem := self.uploads.problem(rank, result.token)) is not None:
            self.refuse(rank, result.token, ResultField.PACK, f"its pack over MPI: {problem}")
            return
        work = self.dispatch.work_of(rank)
        digest, part = parse_work_id(work) if work is not None else (None, None)
        accepted = self._checked(rank, result, digest)
        if accepted is not None:
            self._commit(rank, result, accepted, work, part)

    def undecodable(self, rank: int, field: ResultField, reason: str) -> None:
        """A RESULT that did not decode: its token is unknown, so the READY the worker sends
        next (echoing it) is joined with the dispatch, which is then recovered (F316)."""
        self.refuse(rank, None, field, reason)

    def _current(self, rank: int, result: Result) -> bool:
        """Whether the RESULT is for `rank`'s dispatch in flight, of this generation, and may
        be committed now."""
        if self.dispatch.classify(rank, result.token) is ResultClass.STALE:
            log.warning("stale or foreign RESULT from rank %d dropped (token %s)", rank,
                        result.token[:12])
            if not self.dispatch.holds_token(result.token):
                self.campaign.discard_staging(result.token)  # never another rank's live staging
            return False
        if result.generation != self.dispatch.generation:
            self.refuse(rank, result.token, ResultField.GENERATION,
                        f"generation {result.generation} in generation {self.dispatch.generation}")
            return False
        if result.outcome in (STORAGE_REFUSED, INTERRUPTED) or self.stopping.storage_problem:
            # Not the input's fault: it goes back to the frontier with no failure counted, and
            # nothing more is committed once OUT refused a write.
            self.dispatch.give_back(rank)
            if result.outcome == STORAGE_REFUSED:
                self.stopping.for_resources(f"rank {rank}: {result.message[:500]}")
            return False
        return True

    def _checked(self, rank: int, result: Result, digest: str | None) -> Accepted | None:
        """Its fields and its staged pack, checked once: what of it may be committed."""
        try:
            accepted = self.committer.check(result, digest)
        except Refused as refused:
            self.refuse(rank, result.token, refused.field, str(refused))
            return None
        except Unusable as problem:
            self.dispatch.note_valid_result(rank)
            log.warning("rank %d did not analyse %s: %s", rank, result.digest[:12], problem)
            if result.outcome == INVALID_INPUT and self.pruning is not None:
                self.pruning.forget(rank)  # it may have refused the map bits we sent
            self.dispatch.reject(rank, result.token)
            return None  # the worker removes its staging (worker.py), here as after a commit
        self.dispatch.note_valid_result(rank)
        return accepted

    def _commit(self, rank: int, result: Result, accepted: Accepted, work: str | None,
                part: int | None) -> None:
        if part == TRACE and result.outcome == Outcome.OK.value \
                and result.path_targets is None and self.split.split:
            log.warning("the workers' executor reports no branch targets: inputs are no "
                        "longer split")
            self.split.split = False
        completes = self.split.completes_input(work, result.path_targets)
        with self.stopping.guard, self.dispatch.boundary(rank):
            if self.dispatch.begin_commit(rank, result.token, completes_input=completes) \
                    is not CommitStart.COMMITTING:
                return
            try:
                if self.records.enabled:  # F443 §3 step 6: the manifest, then publication
                    self.records.commit(result, accepted, rank, part)
                    self._fault_in_commit("after-manifest")
                tier = self.frontier.tier_of(result.digest)
                found = self.committer.commit(rank, result, accepted, part=part,
                                              completes_input=completes)
                if self.lower is not None:
                    self.lower.schedule.committed(tier, finds=found.finds, edges=found.edges,
                                                  seconds=result.wall_time)
            except OSError as error:
                if storage_refused(error):
                    raise  # not this input's fault: the campaign stops (storage.py)
                self._on_commit_failure(rank, result, error)
                return
            self.dispatch.finish(rank, result.token, path_targets=result.path_targets,
                                 solved_targets=result.solved_targets, completes_input=completes)
            for digest in self.committer.repaired:
                self.dispatch.readmit(digest)
            if self.federation is not None:
                self.federation.published(self.committer.published)
            if self.records.enabled:
                self._fault_in_commit("after-publish")

    def _fault_in_commit(self, point: str) -> None:
        self.commits_seen[point] += 1
        if self.faults.fire_at(FaultKind.DIE, point, self.commits_seen[point]):
            die(f"fault: SIGKILL of the master {point} of commit #{self.commits_seen[point]}")

    def _on_commit_failure(self, rank: int, result: Result, error: OSError) -> None:
        """Publishing a result's children raised: its input is retried (deferred after
        repeated failures), never forgotten, and the loop goes on. `error.errno` says why."""
        outcome = self.dispatch.commit_failed(rank, result.token)
        log.warning("committing the result of %s from rank %d failed (%s): input %s",
                    result.digest[:12], rank,
                    errno.errorcode.get(error.errno, "no errno") + f": {error.strerror or error}",
                    outcome.action.value if outcome is not None else "already recovered")

    def refuse(self, rank: int, token: str | None, field: ResultField, reason: str) -> None:
        """An invalid RESULT (DESIGN §2): counted under its field; its dispatch is recovered at
        the join (input requeued, staging discarded); the rank retired after too many."""
        self.stats.invalid_results[field.value] += 1
        log.warning("invalid RESULT from rank %d refused, field %s: %s", rank, field.value,
                    reason)
        if token is not None:
            self.dispatch.reject(rank, token)
        for taken_back in self.dispatch.note_invalid_result(rank, f"{field.value}: {reason}"):
            self.campaign.discard_staging(taken_back)  # no join: its rank is retired
        self.count_doorbells()
        self.stopping.if_no_worker_left(f"every worker retired, last rank {rank}: {reason}")
