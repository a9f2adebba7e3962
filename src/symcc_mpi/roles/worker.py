"""The worker loop: READY, receive WORK, verify and run the input, stage, RESULT; until STOP."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import secrets
import shutil
import signal
import socket
import threading
from collections import Counter
from pathlib import Path

import msgspec

from ..config import CampaignConfig, UsageError
from ..corpus import sha256_bytes
from ..dispatch.objects import OBJECT_CACHE_CAPACITY
from ..durable.clock import SYSTEM_CLOCK
from ..executors import ExecutorError
from ..faults import HOSTILE_MARK, Faults, die, stop_self
from ..host import MACHINE, Host
from ..protocol import (
    INTERRUPTED,
    INVALID_INPUT,
    STORAGE_REFUSED,
    WORKER_ERROR,
    ConfigVerdict,
    Fatal,
    Ready,
    Result,
    ResultOutcome,
    StagedFile,
    Stop,
    StopAck,
    Tag,
    Work,
)
from ..pruning import MalformedDelta, WorkerMap
from ..regular import NotRegularFile, open_regular
from ..scratch import make_scratch
from ..storage import describe, storage_refused
from ..transport import Channel, RankFailure
from ..triage import FileCoverage

log = logging.getLogger("symcc_mpi.worker")
MASTER = 0


EXECUTION_POLL = 0.05  # under ULFM: how often a worker busy executing asks MPI for failures
# Set by SIGTERM. A scheduler ending the job (scancel, preemption, the time limit) signals
# every process of it at once: the master stops the campaign and sends STOP, so a worker only
# notes it, and a run the signal cut short (its target got SIGTERM too) is not a crash.
TERMINATING = threading.Event()


def note_termination(signum, frame) -> None:
    if not TERMINATING.is_set():
        TERMINATING.set()
        log.info("SIGTERM: waiting for the master's STOP")


class Worker:
    """One worker rank's executor and scratch space, kept across the generations of the job
    (ulfm/): `serve` runs the worker loop on one generation's channel."""

    def __init__(self, rank: int, config: CampaignConfig, *, fault_rank: int | None = None,
                 host: Host = MACHINE):
        self.rank = rank
        self.config = config
        self.scratch: Path | None = None
        self.qsym_map = None
        self.objects = None
        self.host = host
        self.executor = None
        self.probe = None
        self.problem = ""  # why this rank cannot work, if it cannot
        try:
            # Node-local (--scratch), so made here, on this rank's node (scratch.py).
            self.scratch = make_scratch(config.scratch, f"symcc-mpi-w{rank}-")
            # QSYM rewrites the whole map file at every interesting branch.
            self.qsym_map = WorkerMap(self.scratch / "qsym.map") if config.prunes else None
            self.objects = ObjectStore(self.scratch / "objects")
            self.executor = host.executor(config, scratch=self.scratch,
                                          coverage_map=self.qsym_map.path
                                          if self.qsym_map else None)
            self.probe = _make_probe(config, self.scratch)
        except (UsageError, ExecutorError, OSError) as error:
            self.problem = str(error)
        self.faults = Faults(rank if fault_rank is None else fault_rank)
        self.skipped = SkippedEntries(rank)
        self.executions = 0
        self.executor_time = 0.0
        self.generation = 0

    def serve(self, channel: Channel, *, watch_during_runs: bool = False) -> int:
        """The worker loop of one generation, from rank 0's CONFIG to its STOP. A failure of
        the generation (transport.RankFailure) propagates; the staging this rank wrote in it
        is left to the next master, which discards or commits it (roles/master.py)."""
        config = self.config
        verdict = _wait_for(channel, Tag.CONFIG)
        if not isinstance(verdict, ConfigVerdict) or not verdict.ok:
            return 2
        self.generation = verdict.generation
        if self.problem:
            channel.send(MASTER, Tag.FATAL, Fatal(socket.gethostname(), self.problem))
            _wait_for(channel, Tag.STOP)
            channel.send(MASTER, Tag.STOP_ACK, StopAck(0, 0.0))
            _wait_for(channel, Tag.RELEASE)
            return 1
        doorbell = self.host.ringer(verdict.doorbell)
        if doorbell.reachable:
            channel.ring_after_sends(MASTER, doorbell)
        last_token = None
        # This rank removes its own staging, off the master's path: once the master sends the
        # next WORK it has handled the RESULT before it (MPI keeps RESULT ahead of READY), and
        # the removal runs while the master handles the following RESULT.
        finished_staging: list[Path] = []
        try:
            while True:
                channel.send(MASTER, Tag.READY, Ready(last_token, rings=doorbell.reachable))
                for stage in finished_staging:
                    shutil.rmtree(stage, ignore_errors=True)
                finished_staging.clear()
                message = _wait_for(channel, Tag.WORK, Tag.STOP)
                if isinstance(message, Stop):
                    break
                received = SYSTEM_CLOCK.monotonic()
                if last_token is not None:
                    finished_staging.append(config.out / ".staging" / last_token)
                if message.generation != self.generation:
                    result = _failed(message, message.input_hash, INVALID_INPUT,
                                     f"WORK of generation {message.generation} in generation "
                                     f"{self.generation}")
                else:
                    result = self._run(channel, message, watch_during_runs)
                self.executions += 1
                previous_token, last_token = last_token, message.token
                if self._misbehave(channel, result, previous_token, received):
                    continue
                channel.send(MASTER, Tag.RESULT, result)
                self.executor_time += result.wall_time
            if last_token is not None:  # STOP comes after the master is done with it
                shutil.rmtree(config.out / ".staging" / last_token, ignore_errors=True)
            channel.send(MASTER, Tag.STOP_ACK, StopAck(self.executions, self.executor_time))
            _wait_for(channel, Tag.RELEASE)
        finally:
            doorbell.close()
        return 0

    def _run(self, channel: Channel, work: Work, watch: bool) -> Result:
        if self.faults.fire("die", self.executions + 1):
            die(f"rank {self.rank}: fault: SIGKILL during its execution #{self.executions + 1}")
        run = functools.partial(execute, work, self.config, self.executor, self.probe,
                                self.scratch, self.objects, self.skipped, self.qsym_map)
        try:
            result = _watching(channel, run, self.executor) if watch else run()
        except RankFailure:
            raise
        except Exception as error:  # noqa: BLE001 - reported to the master as data
            return _failed_around(self.rank, work, self.config, error)
        if TERMINATING.is_set() and result.outcome != ResultOutcome.OK:
            return _failed(work, work.input_hash, INTERRUPTED,
                           f"rank {self.rank}: SIGTERM reached the job during the run "
                           f"({result.outcome}, exit status {result.exit_status})")
        return result

    def _misbehave(self, channel: Channel, result: Result, previous_token: str | None,
                   received: float) -> bool:
        """The worker faults of faults.py; True when the real RESULT is not to be sent."""
        faults, number = self.faults, self.executions
        if faults.fire("foreign-result", number):
            _send_unowned_result(channel, self.config, result, secrets.token_hex(16))
        if faults.fire("stale-result", number) and previous_token is not None:
            _send_unowned_result(channel, self.config, result, previous_token)
        if faults.fire("stop", number):
            stop_self(until=received + faults.stop_seconds(number))
        if hostile := faults.hostile_field(number):
            channel.send_raw(MASTER, Tag.RESULT, _hostile_result(self.config, result, hostile))
            return True
        if faults.fire("malformed-result", number):
            channel.send_raw(MASTER, Tag.RESULT, b"\xc1 not msgpack")
            return True
        return False

    def close(self) -> None:
        if self.skipped.counts:
            log.warning("rank %d: skipped in output directories, not regular files: %s",
                        self.rank, self.skipped.summary())
        if self.executor is not None:
            self.executor.close()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


def run_worker(channel: Channel, config: CampaignConfig, *, fault_rank: int | None = None,
               outlive_master: bool = False, host: Host = MACHINE) -> int:
    """A worker for the whole job, when the job has one generation. `fault_rank`: the rank
    its fault plan names (its rank in MPI_COMM_WORLD, with several masters).
    `outlive_master` (ULFM, several masters): it watches its master while it executes, and
    if the master dies it ends quietly; the other masters end the campaign."""
    # Ctrl-C on a terminal reaches every rank; only the master decides when work stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker = Worker(channel.rank, config, fault_rank=fault_rank, host=host)
    try:
        return worker.serve(channel, watch_during_runs=outlive_master)
    except RankFailure as failure:
        if not outlive_master:
            raise
        log.warning("rank %d: its master is gone (%s): exiting", channel.rank, failure)
        return 1
    finally:
        worker.close()


def _watching(channel: Channel, run, executor):
    """`run()` in a thread while this one polls MPI: a rank busy executing learns of a dead
    rank or a revoked communicator within EXECUTION_POLL, cancels the execution (its work is
    replayed by the next generation) and raises RankFailure, instead of holding the survivors'
    repair (a collective) for as long as the execution would have lasted."""
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["result"] = run()
        except BaseException as error:  # noqa: BLE001 - handed to the polling thread
            outcome["error"] = error

    thread = threading.Thread(target=target, name="execution", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(EXECUTION_POLL)
            channel.check_master(MASTER)
    except RankFailure:
        if executor is not None:
            executor.cancel()
        thread.join()
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def execute(work: Work, config: CampaignConfig, executor, probe, scratch: Path,
            objects: ObjectStore, skipped: SkippedEntries,
            qsym_map: WorkerMap | None = None) -> Result:
    """Run one input: keep the objects and map bits WORK carries, verify the input's bytes,
    run it, stage its children named by SHA-256, report what it added to the QSYM map.
    Output entries that are not regular files are tallied in `skipped`."""
    if qsym_map is not None:
        try:
            qsym_map.receive(work.pruning)
        except MalformedDelta as error:
            return _failed(work, work.input_hash, INVALID_INPUT, str(error))
    for object_id, content in work.objects.items():
        if sha256_bytes(content) != object_id:
            return _failed(work, work.input_hash, INVALID_INPUT,
                           f"object {object_id[:12]} arrived damaged")
        objects.put(object_id, content)
    data = work.objects.get(work.input_hash)
    if data is None:
        try:
            data = objects.get(work.input_hash)
        except FileNotFoundError:
            return _failed(work, work.input_hash, INVALID_INPUT,
                           "the input was neither sent with the WORK nor held by this worker")
    actual = sha256_bytes(data)
    if actual != work.input_hash:
        return _failed(work, actual, INVALID_INPUT, "input bytes do not match their SHA-256")
    local_input = scratch / "input"
    local_input.write_bytes(data)
    stage = config.out / ".staging" / work.token
    raw = scratch / "generated"
    shutil.rmtree(raw, ignore_errors=True)
    raw.mkdir()
    if qsym_map is not None:
        qsym_map.prepare()
    # An executor that cannot be targeted runs the whole input and reports no path: the
    # master then stops splitting.
    targets = None if work.targets is None or not executor.targetable \
        else frozenset(work.targets)
    outcome = executor.run(local_input, raw, targets)
    staged, refused = stage_generated(outcome.generated, stage, work.input_hash)
    skipped.note(outcome.skipped)
    skipped.note(refused.items())
    entries = _describe(staged, probe)
    return Result(
        token=work.token, input_hash=actual, outcome=outcome.outcome.value,
        exit_status=outcome.exit_status, wall_time=outcome.wall_time,
        solver_time=outcome.solver_time, staged=entries, generated=len(outcome.generated),
        message=outcome.message, pruning=qsym_map.contribution() if qsym_map else b"",
        solver_queries=outcome.solver_queries, queries_skipped=outcome.queries_skipped,
        generation=work.generation,
        path_targets=None if outcome.path_targets is None else list(outcome.path_targets),
        solved_targets=list(outcome.solved_targets),
    )


def stage_generated(paths, stage: Path, input_hash: str) -> tuple[dict[str, Path], Counter]:
    """Copy each generated file into `stage`, named by the SHA-256 of the bytes copied; return
    the staged files by digest, and the entries refused as not regular files, by kind.

    The executor listed regular files only, but the target's directory is the target's: an
    entry may have been swapped since. Each is opened without following a link nor waiting
    on a FIFO, checked on its descriptor (regular.open_regular), and the bytes hashed are the
    bytes written, read once from that descriptor. A copy, not a rename: a renamed inode is
    still the one anything left holding it open can change after it was hashed.
    """
    stage.mkdir(parents=True, exist_ok=True)
    staged: dict[str, Path] = {}
    refused: Counter = Counter()
    partial = stage / ".partial"  # never in a manifest: names there are SHA-256 digests
    for path in paths:
        try:
            fd, _ = open_regular(path)
        except NotRegularFile as not_regular:
            refused[not_regular.kind] += 1
            continue
        digest = hashlib.sha256()
        with os.fdopen(fd, "rb") as source, open(partial, "wb") as copy:
            for block in iter(lambda: source.read(1 << 20), b""):
                digest.update(block)
                copy.write(block)
        name = digest.hexdigest()
        if name in staged or name == input_hash:
            partial.unlink()
            continue
        os.replace(partial, stage / name)
        staged[name] = stage / name
    return staged, refused


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


class ObjectStore:
    """The objects this worker received, the last OBJECT_CACHE_CAPACITY of them: the window
    the master's ObjectTransferCache believes it holds (see dispatch/objects.py)."""

    def __init__(self, directory: Path, capacity: int = OBJECT_CACHE_CAPACITY):
        self.directory = directory
        self.capacity = capacity
        self.held: dict[str, None] = {}  # insertion-ordered: oldest first
        directory.mkdir()

    def put(self, object_id: str, content: bytes) -> None:
        (self.directory / object_id).write_bytes(content)
        self.held.pop(object_id, None)  # received again: as young as the master thinks
        self.held[object_id] = None
        while len(self.held) > self.capacity:
            oldest = next(iter(self.held))
            del self.held[oldest]
            (self.directory / oldest).unlink(missing_ok=True)

    def get(self, object_id: str) -> bytes:
        return (self.directory / object_id).read_bytes()


def _describe(staged: dict[str, Path], probe) -> list[StagedFile]:
    if not staged:
        return []
    digests = list(staged)
    if probe is None:
        return [StagedFile(d, os.path.getsize(staged[d])) for d in digests]
    coverages = probe.probe([staged[d] for d in digests])
    return [
        StagedFile(d, os.path.getsize(staged[d]), coverage=c.pack(), status=c.status.value)
        for d, c in zip(digests, coverages, strict=True)
    ]


def _make_probe(config: CampaignConfig, scratch: Path):
    if not config.afl_target:
        return None
    from ..triage import CoverageProbe

    # Without --scratch the probe keeps to tmpfs (/dev/shm), ~3x faster per input than disk.
    return CoverageProbe(list(config.afl_target), timeout=config.timeout,
                         memory_limit_mb=config.memory_limit_mb,
                         scratch_dir=scratch if config.scratch is not None else None)


def _failed(work: Work, actual: str, outcome: str, reason: str) -> Result:
    """A RESULT saying the input was not analysed: the master gives it to someone again."""
    return Result(token=work.token, input_hash=actual, outcome=outcome, exit_status=None,
                  wall_time=0.0, solver_time=0.0, staged=[], generated=0, message=reason,
                  generation=work.generation)


def _failed_around(rank: int, work: Work, config: CampaignConfig, error: Exception) -> Result:
    """The RESULT for a run that raised around the executor. A filesystem that refuses
    writes is said once, by the master, for the whole campaign: no traceback per run here."""
    if storage_refused(error):
        where = describe(error, config.out / ".staging" / work.token)
        return _failed(work, work.input_hash, STORAGE_REFUSED, where)
    log.exception("rank %d: executing %s failed", rank, work.input_hash[:12])
    return _failed(work, work.input_hash, WORKER_ERROR, f"{type(error).__name__}: {error}")


def _send_unowned_result(channel: Channel, config: CampaignConfig, real: Result,
                         token: str) -> None:
    """A RESULT under a token this rank does not hold now, with a real staged file."""
    stage = config.out / ".staging" / token
    stage.mkdir(parents=True, exist_ok=True)
    data = b"unowned result: must never reach the corpus " + secrets.token_bytes(8)
    digest = sha256_bytes(data)
    (stage / digest).write_bytes(data)
    forged = Result(token=token, input_hash=real.input_hash, outcome="ok", exit_status=0,
                    wall_time=0.0, solver_time=0.0, staged=[StagedFile(digest, len(data))],
                    generated=1)
    channel.send(MASTER, Tag.RESULT, forged)


def _hostile_result(config: CampaignConfig, real: Result, field: str) -> bytes:
    """The RESULT of `real`'s dispatch with `field` made hostile (faults.py), as raw msgpack:
    around a file planted in its staging directory, listed beside the real children."""
    stage = config.out / ".staging" / real.token
    stage.mkdir(parents=True, exist_ok=True)
    data = HOSTILE_MARK + secrets.token_bytes(8)
    digest = sha256_bytes(data)
    (stage / digest).write_bytes(data)
    planted = {"sha256": digest, "size": len(data), "coverage": None, "status": "ok"}
    message = msgspec.to_builtins(real, builtin_types=(bytes,))
    if config.afl_target:  # the campaign triages: an honest summary (no edge) to spoil
        planted["coverage"] = FileCoverage.from_pairs([]).pack()
    entries = [planted]
    if field == "outcome":
        message["outcome"] = "pwned"
    elif field == "status":
        planted["status"] = "pwned"
    elif field == "coverage":
        # Valid alone, but an edge one past the map: the master must not grow its maps.
        planted["coverage"] = FileCoverage.from_pairs([(1 << 16, 1)], map_size=1 << 16).pack()
    elif field == "manifest-length":
        message["generated"] = len(real.staged)  # one entry more than it generated
    elif field == "size":
        planted["size"] = -1
    elif field == "name":
        (stage / digest).rename(stage / digest.upper())
        planted["sha256"] = digest.upper()
    elif field == "duplicate":
        entries.append(dict(planted))
    elif field == "missing-file":
        (stage / digest).unlink()
    elif field == "not-regular":
        (stage / digest).unlink()
        os.mkfifo(stage / digest)  # opening it for reading would block the master for ever
    elif field == "staged-bytes":
        (stage / digest).write_bytes(data[::-1])
    elif field == "figures":
        message["wall_time"] = -1.0
    elif field == "input-hash":
        message["input_hash"] = sha256_bytes(data)
    elif field == "pruning":
        message["pruning"] = b"\xc1 not a delta"
    elif field == "generation":
        message["generation"] += 1
    elif field == "targets":
        message["path_targets"] = [0, -1]  # targets are positive
    if field != "manifest-length":
        message["generated"] += len(entries)
    message["staged"] = entries + message["staged"]
    return msgspec.msgpack.encode(message)


def _wait_for(channel: Channel, *tags: Tag):
    """The next message from the master with one of `tags`; others are not expected."""
    while True:
        incoming = channel.wait(source=MASTER)  # not blind to its master for another's death
        if incoming.source == MASTER and incoming.tag in tags and incoming.message is not None:
            return incoming.message
        log.warning("rank %d: unexpected message tag %s from %d %s", channel.rank,
                    incoming.tag, incoming.source, incoming.error)
