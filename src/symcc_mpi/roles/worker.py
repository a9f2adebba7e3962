"""The worker loop: READY, receive WORK, verify and run the input, stage, RESULT; until STOP."""

from __future__ import annotations

import functools
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

from symcc_mpi.campaign.layout import sha256_bytes
from symcc_mpi.config import CampaignConfig, UsageError
from symcc_mpi.coverage.pruning import MalformedDelta, WorkerMap
from symcc_mpi.coverage.triage import FileCoverage
from symcc_mpi.dispatch.objects import OBJECT_CACHE_CAPACITY
from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.durable.storage import describe, storage_refused
from symcc_mpi.executors import ExecutorError
from symcc_mpi.executors.witness import Witness, make_witness
from symcc_mpi.processes.scratch import make_scratch
from symcc_mpi.roles.faults import HOSTILE_MARK, Faults, die, stop_self
from symcc_mpi.roles.host import MACHINE, Host
from symcc_mpi.wire.protocol import (
    INTERRUPTED,
    INVALID_INPUT,
    PHASES,
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
    TaskPhases,
    Work,
)
from symcc_mpi.wire.staging import Pack, Staged, read_child, write_entries, write_pack
from symcc_mpi.wire.transport import Channel, RankFailure

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
        self.witness = None
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
            self.witness = make_witness(config, self.executor.name, self.probe, self.scratch)
        except (UsageError, ExecutorError, OSError) as error:
            self.problem = str(error)
        self.faults = Faults(rank if fault_rank is None else fault_rank)
        self.skipped = SkippedEntries(rank)
        self.executions = 0
        self.executor_time = 0.0
        self.generation = 0
        self.phases = PhaseClock()

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
        clock = self.phases = PhaseClock()
        try:
            while True:
                channel.send(MASTER, Tag.READY, Ready(last_token, rings=doorbell.reachable))
                clock.lap("messages")
                for pack in finished_staging:
                    pack.unlink(missing_ok=True)  # or the master moved it (tiers/pool.py)
                finished_staging.clear()
                clock.lap("other")
                message = _wait_for(channel, Tag.WORK, Tag.STOP)
                clock.lap("wait")
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
                clock.lap("other")
                result = msgspec.structs.replace(result, phases=clock.take())
                self.executions += 1
                previous_token, last_token = last_token, message.token
                if self._misbehave(channel, result, previous_token, received):
                    continue
                channel.send(MASTER, Tag.RESULT, result)
                clock.lap("messages")
                self.executor_time += result.wall_time
            if last_token is not None:  # STOP comes after the master is done with it
                (config.out / ".staging" / last_token).unlink(missing_ok=True)
            channel.send(MASTER, Tag.STOP_ACK, StopAck(self.executions, self.executor_time))
            _wait_for(channel, Tag.RELEASE)
        finally:
            doorbell.close()
        return 0

    def _run(self, channel: Channel, work: Work, watch: bool) -> Result:
        if self.faults.fire("die", self.executions + 1):
            die(f"rank {self.rank}: fault: SIGKILL during its execution #{self.executions + 1}")
        run = functools.partial(execute, work, self.config, self.executor, self.probe,
                                self.scratch, self.objects, self.skipped, self.qsym_map,
                                self.phases, self.witness)
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
        if self.probe is not None:
            self.probe.close()
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


def execute(work: Work, config: CampaignConfig, executor, probe, scratch: Path,
            objects: ObjectStore, skipped: SkippedEntries,
            qsym_map: WorkerMap | None = None, clock: PhaseClock | None = None,
            witness: Witness | None = None) -> Result:
    """Run one input: keep the objects and map bits WORK carries, verify the input's bytes,
    run it, have `witness` confirm a crash or a hang, stage its children in one pack (staging.py),
    report what it added to the QSYM map. Output entries that are not regular files are
    tallied in `skipped`; the time of each phase goes to `clock`."""
    clock = clock or PhaseClock()
    if qsym_map is not None:
        try:
            qsym_map.receive(work.pruning, work.epoch)
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
    stage = config.out / ".staging" / work.token  # the pack of this dispatch's children
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
    staged, refused = write_pack(outcome.generated, stage, work.input_hash)
    skipped.note(outcome.skipped)
    skipped.note(refused.items())
    clock.lap("staging")
    entries = _describe(staged, stage, probe)
    clock.lap("probe")
    return Result(
        token=work.token, input_hash=actual, outcome=outcome.outcome.value,
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


def _describe(staged: list[Staged], pack: Path, probe) -> list[StagedFile]:
    if probe is None or not staged:
        return [StagedFile(entry.digest, entry.size) for entry in staged]
    described = []
    for entry in staged:  # the bytes probed are the bytes packed
        coverage = probe.probe_bytes(read_child(pack, entry))
        described.append(StagedFile(entry.digest, entry.size, coverage=coverage.pack(),
                                    status=coverage.status.value))
    return described


def _make_probe(config: CampaignConfig, scratch: Path):
    if not config.afl_target:
        return None
    from symcc_mpi.coverage.forkserver import ForkserverProbe

    return ForkserverProbe(list(config.afl_target), timeout=config.timeout,
                           memory_limit_mb=config.memory_limit_mb, scratch_dir=scratch)


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
    """A RESULT under a token this rank does not hold now, with a real staged pack."""
    data = b"unowned result: must never reach the corpus " + secrets.token_bytes(8)
    planted = _plant(config.out / ".staging" / token, data)
    forged = Result(token=token, input_hash=real.input_hash, outcome="ok", exit_status=0,
                    wall_time=0.0, solver_time=0.0,
                    staged=[StagedFile(planted.digest, planted.size)], generated=1)
    channel.send(MASTER, Tag.RESULT, forged)


def _plant(pack: Path, data: bytes, *, corrupt: bool = False) -> Staged:
    """Add `data` as the last child of the pack `pack` (made if there is none). `corrupt`:
    the bytes packed are not those the index names."""
    children = []
    if pack.exists():
        with Pack(str(pack)) as existing:
            children = [(entry.digest, existing.read(entry.digest))
                        for entry in existing.entries]
    digest = sha256_bytes(data)
    offset = sum(len(content) for _, content in children)
    write_entries(pack, [*children, (digest, data[::-1] if corrupt else data)])
    return Staged(digest, offset, len(data))


def _hostile_result(config: CampaignConfig, real: Result, field: str) -> bytes:
    """The RESULT of `real`'s dispatch with `field` made hostile (faults.py), as raw msgpack:
    around a child planted in its staged pack, listed after the real children."""
    pack = config.out / ".staging" / real.token
    data = HOSTILE_MARK + secrets.token_bytes(8)
    if field == "missing-file":
        digest = sha256_bytes(data)  # listed, never packed
    else:
        digest = _plant(pack, data, corrupt=field == "staged-bytes").digest
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
        planted["sha256"] = digest.upper()
    elif field == "duplicate":
        entries.append(dict(planted))
    elif field == "not-regular":
        pack.unlink()
        os.mkfifo(pack)  # opening it for reading would block the master for ever
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
    message["staged"] = message["staged"] + entries  # the pack's index has it last
    return msgspec.msgpack.encode(message)


def _wait_for(channel: Channel, *tags: Tag):
    """The next message from the master with one of `tags`; others are not expected."""
    while True:
        incoming = channel.wait(source=MASTER)  # not blind to its master for another's death
        if incoming.source == MASTER and incoming.tag in tags and incoming.message is not None:
            return incoming.message
        log.warning("rank %d: unexpected message tag %s from %d %s", channel.rank,
                    incoming.tag, incoming.source, incoming.error)
