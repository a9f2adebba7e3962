"""Committing one analysed input: which children to read, verify, triage and promote, the
QSYM map bits to merge, the done record, and the campaign's figures. Pure of MPI.

The master calls `check` on a current RESULT, then `commit` inside the dispatch
transaction's exception boundary. Commit order: promote children into corpus/ and the AFL
queues, then append the input to the done journal (durable at the round's group commit); a
crash anywhere before that leaves the input to be analysed again on --resume and loses no
child already promoted.
"""

from __future__ import annotations

import base64
import logging
import re
from dataclasses import dataclass, field

import msgspec

from symcc_mpi.campaign.result_check import InvalidResult, check_fields
from symcc_mpi.coverage.edges import FileCoverage
from symcc_mpi.coverage.edges import Status as CoverageStatus
from symcc_mpi.coverage.pruning import Delta, MalformedDelta
from symcc_mpi.coverage.pruning import decode as decode_delta
from symcc_mpi.coverage.triage import path_key, with_bits
from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.executors import Outcome
from symcc_mpi.wire.protocol import (
    NOT_ANALYSED,
    PHASES,
    MalformedMessage,
    Result,
    ResultField,
    ResultOutcome,
    StagedFile,
    Tag,
    decode,
)
from symcc_mpi.wire.staging import PackRejected, Staged

log = logging.getLogger("symcc_mpi.campaign.commit")

MANIFEST_MESSAGE = 240  # characters of an executor's message a commit manifest keeps
ALL_FAILED_AFTER = 5  # runs, all executor failures, after which the campaign says so once
MAX_FAILURE_REASONS = 50  # distinct reasons counted apart; the rest under OTHER_REASONS
OTHER_REASONS = "other reasons"
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


class Unusable(Exception):
    """Why a current RESULT cannot be committed: its input goes back to the frontier."""


class Refused(Unusable):
    """A current RESULT with a field that cannot be believed (result_check.InvalidResult):
    its rank is counted towards retirement as well."""

    def __init__(self, invalid: InvalidResult):
        super().__init__(str(invalid))
        self.field = invalid.field


@dataclass(frozen=True)
class Child:
    """A generated input new to the campaign, with its decoded coverage summary (if any)."""

    staged: StagedFile
    coverage: FileCoverage | None
    may_keep: bool  # its bytes were verified: it is kept if it still adds coverage
    rarity: int = 0  # a normal run's, as the map was when the RESULT came (tiers/pool.py)


@dataclass(frozen=True)
class Accepted:
    children: list[Child]
    map_bits: Delta
    verified: dict[str, bytes]  # the bytes of each child that may be kept, as hashed
    keep: frozenset[str] = frozenset()  # the children the commit adds to the corpus
    packed: dict[str, Staged] = field(default_factory=dict)  # every child, in its pack

    def published(self) -> list[StagedFile]:
        """The children the commit publishes: those it keeps, and crashes and hangs."""
        return [c.staged for c in self.children if c.may_keep
                and (c.staged.digest in self.keep or _status(c) is not CoverageStatus.OK)]


@dataclass(frozen=True)
class Found:
    """What one commit found: children kept and new unique crashes; edges they added."""

    finds: int
    edges: int


def _status(child: Child) -> CoverageStatus:
    """How the child's probe run ended: its summary says, or (without one: a manifest being
    redone, or no triage) its staged entry."""
    return child.coverage.status if child.coverage is not None \
        else CoverageStatus(child.staged.status)


def encode_manifest(result: Result, accepted: Accepted) -> dict:
    """The commit manifest of F443 §3 step 6, as fields of the journal's commit record
    (corpus.py, which holds the input, token and generation beside them): what a master
    taking over needs to redo the commit (`Committer.check` and `commit` again) from the
    staged pack, and nothing more. The children it publishes, each as [digest, size, probe
    status] without its coverage summary (the takeover's replay of queue/ merges theirs),
    and the outcome. The run's figures, its path's branch targets (a redone part's input is
    split anew), its QSYM map bits and the children it sets aside are not redone: a redone
    commit only loses their help."""
    fields = {"outcome": result.outcome, "exit_status": result.exit_status,
              "publish": [[staged.digest, staged.size, staged.status]
                          for staged in accepted.published()]}
    if result.outcome == Outcome.ERROR.value:
        fields["message"] = result.message[:MANIFEST_MESSAGE]
    return fields


def decode_manifest(record: dict) -> Result:
    """The RESULT a commit record's manifest stands for, strictly decoded as a worker's
    would be; raises MalformedMessage (a ValueError) if it is not one. A record of an
    earlier version holds the whole RESULT, base64-encoded msgpack, under "result"."""
    if "result" in record:
        try:
            payload = base64.b64decode(record["result"], validate=True)
        except (ValueError, TypeError) as error:
            raise MalformedMessage(f"manifest is not base64: {error}") from None
        return decode(Tag.RESULT, _named_by_digest(payload))
    try:
        staged = [{"digest": digest, "size": size, "status": status}
                  for digest, size, status in record["publish"]]
        fields = {"token": record["token"], "digest": record["digest"],
                  "outcome": record["outcome"], "exit_status": record["exit_status"],
                  "wall_time": 0.0, "solver_time": 0.0, "staged": staged,
                  "generated": len(staged), "message": record.get("message", ""),
                  "generation": record["generation"]}
    except (KeyError, TypeError, ValueError) as error:
        raise MalformedMessage(f"manifest: {error!r}") from None
    return decode(Tag.RESULT, msgspec.msgpack.encode(fields))


def _named_by_digest(payload: bytes) -> bytes:
    """A RESULT as versions before the digest naming encoded it (`input_hash`, a staged
    file's `sha256`), re-encoded with today's names; anything else unchanged."""
    try:
        fields = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError:
        return payload  # decode() says what is wrong with it
    if not isinstance(fields, dict) or "input_hash" not in fields:
        return payload
    fields["digest"] = fields.pop("input_hash")
    for staged in fields.get("staged") or ():
        if isinstance(staged, dict) and "sha256" in staged:
            staged["digest"] = staged.pop("sha256")
    return msgspec.msgpack.encode(fields)


class Committer:
    def __init__(self, campaign, frontier, stats, *, triage, pruning, checkpoint,
                 shared_corpus: bool = False, pool=None):
        self.campaign = campaign  # corpus.CampaignDir
        self.shared_corpus = shared_corpus  # other masters publish into corpus/ too
        self.frontier = frontier
        self.stats = stats  # stats.MasterStats: updated as results commit
        self.triage = triage  # triage.CoverageMap, or None: novelty by content hash alone
        self.pruning = pruning  # pruning.PruningLedger, or None
        self.checkpoint = checkpoint
        self.pool = pool  # tiers.pool.AsidePool, or None: what triage drops is forgotten
        self.published: list[str] = []  # children the commit in progress added to corpus/
        self.repaired: list[str] = []  # of which known before (CampaignDir.damaged)

    def check(self, result: Result, sent_input: str | None) -> Accepted:
        """What of a current RESULT can be committed: the staged children not known yet
        (those that may be kept verified file by file) and the run's QSYM map bits. Raises
        Refused when a field of it cannot be believed, Unusable when the worker says it did
        not analyse its input (either way the input goes back to the frontier)."""
        try:
            return self._check(result, sent_input)
        except InvalidResult as invalid:
            raise Refused(invalid) from None

    def _check(self, result: Result, sent_input: str | None) -> Accepted:
        coverages = check_fields(
            result, map_size=self.triage.map_size if self.triage is not None else None,
            known=self._known)
        if result.outcome in NOT_ANALYSED:
            raise Unusable(result.message or ResultOutcome(result.outcome).value)
        if result.digest != sent_input:
            raise InvalidResult(ResultField.DIGEST, "it ran other bytes than it was sent")
        try:
            map_bits = decode_delta(result.pruning)
        except MalformedDelta as error:
            raise InvalidResult(ResultField.PRUNING, str(error)) from None
        # Only the bytes of a child that may be kept are read (F320: verified before it is
        # promoted): one already known, or whose coverage adds nothing, is dropped unread.
        # Hashing every generated file was the master's biggest cost per result.
        fresh = [(staged, coverage) for staged, coverage in zip(result.staged, coverages,
                                                                  strict=True)
                 if not self._known(staged.digest)]
        normal = [coverage for _, coverage in fresh
                  if coverage is not None and coverage.status is CoverageStatus.OK]
        assessed = iter(self.triage.assess(normal) if normal else ())
        children = []
        for staged, coverage in fresh:
            if coverage is None or coverage.status is not CoverageStatus.OK:
                children.append(Child(staged, coverage, True))
            else:
                children.append(Child(staged, coverage, *next(assessed)))
        verified: dict[str, bytes] = {}
        packed: dict[str, Staged] = {}
        # The pack is opened only for a child to read or to set aside: a commit redone after
        # its children were published (and its pack removed by its worker) needs none.
        if any(c.may_keep or self.pool is not None for c in children):
            try:
                with self.campaign.open_staged(result.token) as pack:
                    pack.check([(staged.digest, staged.size) for staged in result.staged])
                    verified = {c.staged.digest: pack.read(c.staged.digest)
                                for c in children if c.may_keep}
                    packed = pack.by_digest
            except PackRejected as rejected:
                self.stats.staging_rejected += 1
                raise InvalidResult(rejected.field,
                                    f"staged results rejected: {rejected}") from None
        return Accepted(children, map_bits, verified, self._to_keep(children), packed)

    def _known(self, digest: str) -> bool:
        """Seen before, and its bytes not lost: an input whose corpus file was found damaged
        is offered again by the parent that yields it again."""
        return self.frontier.seen_before(digest) and digest not in self.campaign.damaged

    def _to_keep(self, children: list[Child]) -> frozenset[str]:
        """The normal children that add coverage, each beyond the map and the children before
        it in the RESULT: decided before anything is published, so that the manifest says
        exactly what the commit publishes."""
        keep: set[str] = set()
        beyond = None  # the bits the children kept so far add
        for child in children:
            if not child.may_keep or _status(child) is not CoverageStatus.OK:
                continue
            coverage = child.coverage
            if coverage is None:
                keep.add(child.staged.digest)
            elif self.triage.adds_coverage(coverage, beyond):
                keep.add(child.staged.digest)
                beyond = with_bits(beyond, coverage)
        return frozenset(keep)

    def commit(self, rank: int | None, result: Result, accepted: Accepted, *,
               part: int | None = None, completes_input: bool = True) -> Found:
        """Triage and promote the children, set aside what triage does not keep, merge the
        map bits, record the input as done (or, for a part of a split input that does not
        complete it, the part)."""
        now = SYSTEM_CLOCK.time()
        parent = result.digest
        self.published = []
        self.repaired = []
        finds_before = self.stats.interesting + self.stats.crashes
        edges_before = self.triage.edges_covered if self.triage is not None else 0
        for child in accepted.children:
            self._triage_child(child, accepted, parent, now)
        if self.pool is not None:
            for digest in self.pool.adopt(result.token, self.campaign.staged_pack(result.token)):
                self.frontier.set_aside(digest)
        if self.pruning is not None:
            self.pruning.merge(rank, accepted.map_bits)
        outcome = Outcome(result.outcome)  # check() let through analysed outcomes only
        if outcome is Outcome.CRASH:
            signal_number = -result.exit_status if (result.exit_status or 0) < 0 else None
            self._save_crash(parent, parent, signal_number, now)
        elif outcome is Outcome.TIMEOUT:
            self._save_hang(parent, parent, now)
        elif outcome is Outcome.ERROR:
            self._executor_failed(parent, result.message, rank)
        if completes_input:
            if self.shared_corpus:
                # Another master may have published it, not synced yet: the done record must
                # not vouch for an input a power failure can leave with a name and no bytes
                # (nothing would run its parent again to write them back).
                self.campaign.sync_at_next_commit(parent)
            self.campaign.record_done(parent, result.token, outcome.value, result.generation,
                                      self.published, tier=self.frontier.tier_of(parent))
        else:
            self.campaign.record_part(parent, part, result.token, outcome.value,
                                      self.published)
        self.stats.executions += 1
        if self.stats.executions == ALL_FAILED_AFTER == self.stats.executor_errors:
            self._warn_all_failed()
        self.stats.generated += result.generated
        self.stats.executor_time += result.wall_time
        self.stats.solver_time += result.solver_time
        self.stats.solver_queries += result.solver_queries
        if result.queries_skipped is None:
            self.stats.runs_without_counts += 1
        else:
            self.stats.queries_skipped += result.queries_skipped
        for phase, seconds in zip(PHASES, msgspec.structs.astuple(result.phases), strict=True):
            self.stats.phases[phase] += seconds
        worker = self.stats.per_worker.get(rank)
        if worker is not None:  # None: a dead master's commit, redone (job/resume.py)
            worker.executions += 1
            worker.executor_time += result.wall_time
        edges = self.triage.edges_covered - edges_before if self.triage is not None else 0
        return Found(self.stats.interesting + self.stats.crashes - finds_before, edges)

    def _triage_child(self, child: Child, accepted: Accepted, parent: str, now: float) -> None:
        """Publish what the child asked for (a crash, a hang, an input the commit keeps), or
        offer it to the aside pool.

        The child is noted as seen only after what it asked for is published: a promotion
        that raises leaves it unseen, so the run of its parent, retried, offers it again. The
        coverage map learns its bits after the promotion for the same reason (a child whose
        bits were merged would be dropped by the retry as adding nothing)."""
        digest = child.staged.digest
        coverage = child.coverage
        data = accepted.verified.get(digest)
        status = _status(child)
        if child.may_keep and status is CoverageStatus.CRASH:
            self._save_crash(digest, parent, None, now, data=data)
        elif child.may_keep and status is CoverageStatus.HANG:
            self._save_hang(digest, parent, now, data=data)
        elif digest in accepted.keep:
            self._keep(digest, data, parent, now)
            if coverage is not None:
                self.triage.merge_novelty(coverage)
                self.checkpoint.triage_dirty = True
        elif self.pool is not None and coverage is not None and digest in accepted.packed:
            triage = self.triage
            key = path_key(coverage)
            self.pool.offer(accepted.packed[digest], self.pool.promise(
                path_key=key, known_path=triage.knows_path(coverage),
                rarity=child.rarity, size=child.staged.size), key)
        self.frontier.see(digest)
        self.stats.unique += 1

    def _keep(self, digest: str, data: bytes, parent: str, now: float) -> None:
        repaired = digest in self.campaign.damaged
        if repaired:
            self.campaign.damaged.discard(digest)
            self.repaired.append(digest)
        if not self.campaign.promote(digest, data) and self.shared_corpus:
            # Another master generated it too and published it first (or this master's dead
            # predecessor did): its find, which its owner will analyse; queued once. (A lone
            # master meets its own file only when its earlier commit of this result failed
            # after the promotion: then it queues it now.) Its bytes may still be only in
            # the page cache of the one that published it: this commit's done record must
            # not vouch for a child a power failure can leave with a name and no bytes.
            self.campaign.sync_at_next_commit(digest)
            self.campaign.queue_once(digest, parent)
            self.frontier.add(digest)
            return
        self.campaign.add_to_queue(digest, parent)  # its damaged entry relinked (queues.py)
        self.published.append(digest)
        if repaired:
            return  # known already: its depth, its place in the frontier, its count
        depth = (self.frontier.depth(parent) or 1) + 1  # AFL counts seeds as depth 1
        self.frontier.set_depth(digest, depth)
        self.stats.max_depth = max(self.stats.max_depth, depth)
        self.frontier.add(digest)
        self.stats.interesting += 1
        self.stats.last_find = now

    def _executor_failed(self, parent: str, reason: str, rank: int | None) -> None:
        """Count a run the executor failed (witness.py: a death or timeout the target's own
        run does not repeat is one), grouped by its reason, with the first input as example."""
        stats = self.stats
        stats.executor_errors += 1
        reason = _ADDRESS.sub("0x…", reason) or "no reason given"  # "stopped at 0x4011d6"
        groups = stats.executor_failures
        if reason not in groups and len(groups) >= MAX_FAILURE_REASONS:
            reason = OTHER_REASONS
        group = groups.get(reason)
        if group is not None:
            group["count"] += 1
            return
        groups[reason] = {"count": 1, "example": parent}
        log.warning("the executor failed on %s (rank %s), not the target: %s (what the run "
                    "wrote is still explored; further failures for this reason are counted)",
                    parent[:12], rank, reason)

    def _warn_all_failed(self) -> None:
        groups = self.stats.executor_failures
        reason = max(groups, key=lambda r: groups[r]["count"])
        log.warning("all of the first %d runs failed in the executor, none in the target (most "
                    "often: %s): this target may not suit the executor; what the runs wrote is "
                    "still explored", ALL_FAILED_AFTER, reason)

    def _save_crash(self, digest: str, parent: str, signal_number: int | None, now: float,
                    *, data: bytes | None = None) -> None:
        self.stats.crashing_runs += 1
        if self.campaign.save_finding("crashes", digest, parent, signal_number, data=data):
            self.stats.crashes += 1
            self.stats.last_crash = self.stats.last_find = now
            if self.stats.first_crash_seconds is None:
                self.stats.first_crash_seconds = now - self.stats.start_time

    def _save_hang(self, digest: str, parent: str, now: float, *,
                   data: bytes | None = None) -> None:
        self.stats.hanging_runs += 1
        if self.campaign.save_finding("hangs", digest, parent, data=data):
            self.stats.hangs += 1
            self.stats.last_hang = now
