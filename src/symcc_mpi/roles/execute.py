"""One input's run on a worker: the objects and map bits its WORK carries kept, its bytes
verified, the executor run, a crash or hang confirmed, the children staged in one pack and
probed, the time of each phase counted: `execute` returns the RESULT to send."""

from __future__ import annotations

import logging
import os
import shutil
from collections import Counter
from pathlib import Path

from symcc_mpi.campaign.corpus import sha256_bytes
from symcc_mpi.config import CampaignConfig
from symcc_mpi.coverage.pruning import MalformedDelta, WorkerMap
from symcc_mpi.dispatch.objects import ObjectStore
from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.durable.storage import describe, storage_refused
from symcc_mpi.executors.witness import Witness
from symcc_mpi.wire.protocol import (
    INVALID_INPUT,
    PHASES,
    STORAGE_REFUSED,
    WORKER_ERROR,
    Result,
    StagedFile,
    TaskPhases,
    Work,
)
from symcc_mpi.wire.staging import Staged, read_child, write_pack

log = logging.getLogger("symcc_mpi.worker")


class PhaseClock:
    """Adds a worker's time up by phase (protocol.TaskPhases), lap by lap: `lap(phase)` gives
    the time since the previous lap to `phase`; `take` returns a task's figures and starts
    the next task's."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.mark = SYSTEM_CLOCK.monotonic()

    def lap(self, phase: str) -> float:
        now = SYSTEM_CLOCK.monotonic()
        spent = now - self.mark
        self.seconds[phase] += spent
        self.mark = now
        return spent

    def move(self, source: str, target: str, seconds: float) -> None:
        """Count `seconds` of what went to `source` as `target`'s (the solver's share of the
        target process)."""
        seconds = min(max(seconds, 0.0), self.seconds[source])
        self.seconds[source] -= seconds
        self.seconds[target] += seconds

    def take(self) -> TaskPhases:
        phases = TaskPhases(**self.seconds)
        self.seconds = dict.fromkeys(PHASES, 0.0)
        return phases


def execute(work: Work, config: CampaignConfig, executor, probe, scratch: Path, pack: Path,
            objects: ObjectStore, skipped: SkippedEntries,
            qsym_map: WorkerMap | None = None, clock: PhaseClock | None = None,
            witness: Witness | None = None) -> Result:
    """Run one input: keep the objects and map bits WORK carries, verify the input's bytes,
    run it, have `witness` confirm a crash or a hang, stage its children in one pack at `pack`
    (staging.py), report what it added to the QSYM map. Output entries that are not regular
    files are tallied in `skipped`; the time of each phase goes to `clock`."""
    clock = clock or PhaseClock()
    if qsym_map is not None:
        try:
            qsym_map.receive(work.pruning, work.epoch)
        except MalformedDelta as error:
            return failed(work, work.digest, INVALID_INPUT, str(error))
    for digest, content in work.objects.items():
        if sha256_bytes(content) != digest:
            return failed(work, work.digest, INVALID_INPUT,
                          f"object {digest[:12]} arrived damaged")
        objects.put(digest, content)
    data = work.objects.get(work.digest)
    if data is None:
        try:
            data = objects.get(work.digest)
        except FileNotFoundError:
            return failed(work, work.digest, INVALID_INPUT,
                          "the input was neither sent with the WORK nor held by this worker")
    actual = sha256_bytes(data)
    if actual != work.digest:
        return failed(work, actual, INVALID_INPUT, "input bytes do not match their SHA-256")
    local_input = scratch / "input"
    local_input.write_bytes(data)
    raw = scratch / "generated"
    _emptied(raw)
    if qsym_map is not None:
        qsym_map.prepare()
    # An executor that cannot be targeted runs the whole input and reports no path: the
    # master then stops splitting.
    targets = None if work.targets is None or not executor.targetable \
        else frozenset(work.targets)
    clock.lap("other")
    outcome = executor.run(local_input, raw, targets, pruned=work.pruned)
    clock.lap("target")
    clock.move("target", "solver", outcome.solver_time)
    if witness is not None:  # it re-runs a crash or a hang only
        outcome = witness.judge(outcome, data, local_input, executor.name, config.timeout)
        clock.lap("probe")
    staged, refused = write_pack(outcome.generated, pack, work.digest)
    skipped.note(outcome.skipped)
    skipped.note(refused.items())
    clock.lap("staging")
    entries = _describe(staged, pack, probe)
    clock.lap("probe")
    return Result(
        token=work.token, digest=actual, outcome=outcome.outcome.value,
        exit_status=outcome.exit_status, wall_time=outcome.wall_time,
        solver_time=outcome.solver_time, staged=entries, generated=len(outcome.generated),
        message=outcome.message, pruning=qsym_map.contribution() if qsym_map else b"",
        solver_queries=outcome.solver_queries, queries_skipped=outcome.queries_skipped,
        generation=work.generation,
        # Only a split input's master reads the path (splitting.py): a whole input's, thousands
        # of targets on larger inputs, would be encoded, sent and checked for nothing.
        path_targets=None if outcome.path_targets is None or work.targets is None
        else list(outcome.path_targets),
        solved_targets=list(outcome.solved_targets),
    )


def _emptied(directory: Path) -> None:
    """`directory`, there and empty: what the last run left is removed, the directory kept
    (making one costs more than emptying it, on some filesystems ten times more)."""
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        directory.mkdir()
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            os.unlink(entry.path)


class SkippedEntries:
    """Output-directory entries that were not test cases (symlinks, FIFOs, devices, ...),
    over this worker's whole run: one warning the first time a kind appears, the totals at
    STOP, so that a user can tell without a line per execution."""

    def __init__(self, rank: int):
        self.rank = rank
        self.counts: Counter = Counter()

    def note(self, kinds) -> None:
        """`kinds`: (kind, count) pairs."""
        for kind, count in kinds:
            if count and not self.counts[kind]:
                log.warning("rank %d: the target left a %s in its output directory; skipped "
                            "unread (only regular files are test cases), further ones are "
                            "counted", self.rank, kind)
            self.counts[kind] += count

    def summary(self) -> str:
        return ", ".join(f"{count} {kind}" for kind, count in sorted(self.counts.items()))


def _describe(staged: list[Staged], pack: Path, probe) -> list[StagedFile]:
    if probe is None or not staged:
        return [StagedFile(entry.digest, entry.size) for entry in staged]
    described = []
    for entry in staged:  # the bytes probed are the bytes packed
        coverage = probe.probe_bytes(read_child(pack, entry))
        described.append(StagedFile(entry.digest, entry.size, coverage=coverage.pack(),
                                    status=coverage.status.value))
    return described


def failed(work: Work, actual: str, outcome: str, reason: str) -> Result:
    """A RESULT saying the input was not analysed: the master gives it to someone again."""
    return Result(token=work.token, digest=actual, outcome=outcome, exit_status=None,
                  wall_time=0.0, solver_time=0.0, staged=[], generated=0, message=reason,
                  generation=work.generation)


def failed_around(rank: int, work: Work, pack: Path, error: Exception) -> Result:
    """The RESULT for a run that raised around the executor (its children to go to `pack`). A
    filesystem that refuses writes is said once, by the master, for the whole campaign: no
    traceback per run here."""
    if storage_refused(error):
        where = describe(error, pack)
        return failed(work, work.digest, STORAGE_REFUSED, where)
    log.exception("rank %d: executing %s failed", rank, work.digest[:12])
    return failed(work, work.digest, WORKER_ERROR, f"{type(error).__name__}: {error}")
