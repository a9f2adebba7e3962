"""The worker loop: READY, receive WORK, verify and run the input, stage, RESULT; until STOP."""

from __future__ import annotations

import functools
import logging
import signal
import socket
import threading
from pathlib import Path

import msgspec

from symcc_mpi.config import CampaignConfig, UsageError
from symcc_mpi.coverage.pruning import WorkerMap
from symcc_mpi.dispatch.objects import ObjectStore
from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.executors import ExecutorError
from symcc_mpi.executors.witness import make_witness
from symcc_mpi.processes.scratch import make_scratch, remove_scratch
from symcc_mpi.roles.execute import PhaseClock, SkippedEntries, execute, failed, failed_around
from symcc_mpi.roles.faults import FaultKind, Faults, die
from symcc_mpi.roles.host import MACHINE, Host
from symcc_mpi.roles.hostile import misbehave
from symcc_mpi.wire.protocol import (
    INTERRUPTED,
    INVALID_INPUT,
    PACK_CHUNK,
    UPLOAD_WINDOW,
    ConfigVerdict,
    Fatal,
    PackChunk,
    Ready,
    Result,
    ResultOutcome,
    Stop,
    StopAck,
    Tag,
    Work,
)
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
                 host: Host = MACHINE, serves: int = 0):
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
            self.scratch = make_scratch(config.scratch, f"w{rank}-")
            # QSYM rewrites the whole map file at every interesting branch.
            self.qsym_map = WorkerMap(self.scratch / "qsym.map") if config.prunes else None
            self.objects = ObjectStore(self.scratch / "objects")
            self.executor = host.executor(config, scratch=self.scratch,
                                          coverage_map=self.qsym_map.path
                                          if self.qsym_map else None)
            self.probe = host.probe(config, self.scratch) if config.afl_target else None
            self.witness = make_witness(config, self.executor.name, self.probe, self.scratch)
        except (UsageError, ExecutorError, OSError) as error:
            self.problem = str(error)
        self.faults = Faults(rank if fault_rank is None else fault_rank)
        self.skipped = SkippedEntries(rank)
        self.executions = 0
        self.executor_time = 0.0
        self.generation = 0
        # With several masters, the index of the master it serves: its own group's, until a
        # CONFIG says another's (its group took the first master's place)
        self.serves = serves
        self.sees_out = True  # its node sees its master's OUT (its last CONFIG said)
        self.stopped = False  # its master sent STOP: the campaign's end has begun
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
        self.serves = verdict.master
        over_mpi, problem = self._results_path(verdict.staging_marker)
        if problem := self.problem or problem:
            channel.send(MASTER, Tag.FATAL, Fatal(socket.gethostname(), problem))
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
                    self.stopped = True
                    break
                received = SYSTEM_CLOCK.monotonic()
                if last_token is not None and not over_mpi:
                    finished_staging.append(config.out / ".staging" / last_token)
                pack = self.scratch / "pack" if over_mpi \
                    else config.out / ".staging" / message.token
                if message.generation != self.generation:
                    result = failed(message, message.digest, INVALID_INPUT,
                                    f"WORK of generation {message.generation} in generation "
                                    f"{self.generation}")
                else:
                    result = self._run(channel, message, pack, watch_during_runs)
                clock.lap("other")
                result = msgspec.structs.replace(result, phases=clock.take())
                self.executions += 1
                previous_token, last_token = last_token, message.token
                if misbehave(channel, config, self.faults, self.executions, result,
                             previous_token, received):
                    continue
                if over_mpi and result.staged:
                    upload(channel, MASTER, message.token, pack)
                channel.send(MASTER, Tag.RESULT, result, ring=False)  # the READY rings
                clock.lap("messages")
                self.executor_time += result.wall_time
            if last_token is not None and not over_mpi:  # the master is done with it
                (config.out / ".staging" / last_token).unlink(missing_ok=True)
            channel.send(MASTER, Tag.STOP_ACK, StopAck(self.executions, self.executor_time))
            _wait_for(channel, Tag.RELEASE)
        finally:
            doorbell.close()
        return 0

    def _results_path(self, marker: str) -> tuple[bool, str]:
        """(whether this rank sends its packs over MPI, why it cannot work if it cannot):
        over MPI if asked to (--results-via mpi), or if it does not see the master's marker
        in OUT/.staging/ (--results-via auto): OUT is not shared with its node."""
        via = self.config.results_via
        sees = self.sees_out = bool(marker) and (self.config.out / ".staging" / marker).is_file()
        if via == "files" and not sees:
            return False, (f"rank {self.rank} does not see --out {self.config.out} as its "
                           "master does (--results-via files); leave --results-via at auto "
                           "for its results to travel over MPI")
        over_mpi = via == "mpi" or not sees
        if over_mpi and self.generation == 0:
            log.info("rank %d sends its results over MPI (%s)", self.rank,
                     "--results-via mpi" if via == "mpi" else "it does not see --out")
        return over_mpi, ""

    def _run(self, channel: Channel, work: Work, pack: Path, watch: bool) -> Result:
        if self.faults.fire(FaultKind.DIE, self.executions + 1):
            die(f"rank {self.rank}: fault: SIGKILL during its execution #{self.executions + 1}")
        run = functools.partial(execute, work, self.config, self.executor, self.probe,
                                self.scratch, pack, self.objects, self.skipped, self.qsym_map,
                                self.phases, self.witness)
        try:
            result = _watching(channel, run, self.executor) if watch else run()
        except RankFailure:
            raise
        except Exception as error:  # noqa: BLE001 - reported to the master as data
            return failed_around(self.rank, work, pack, error)
        if TERMINATING.is_set() and result.outcome != ResultOutcome.OK:
            return failed(work, work.digest, INTERRUPTED,
                          f"rank {self.rank}: SIGTERM reached the job during the run "
                          f"({result.outcome}, exit status {result.exit_status})")
        return result

    def close(self) -> None:
        if self.skipped.counts:
            log.warning("rank %d: skipped in output directories, not regular files: %s",
                        self.rank, self.skipped.summary())
        if self.executor is not None:
            self.executor.close()
        if self.probe is not None:
            self.probe.close()
        if self.scratch is not None:
            remove_scratch(self.scratch)


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


def upload(channel: Channel, master: int, token: str, pack: Path) -> None:
    """The pack of dispatch `token`, to `master` in pieces (campaign/uploads.py), at most
    UPLOAD_WINDOW of them in memory and in flight."""
    with open(pack, "rb") as handle:
        offset = 0
        data = handle.read(PACK_CHUNK)
        while True:
            following = handle.read(PACK_CHUNK)
            channel.send(master, Tag.PACK, PackChunk(token, offset, data, last=not following),
                         ring=False)
            if not following:
                return
            channel.wait_sends(keep=UPLOAD_WINDOW - 1, ring=master)
            offset += len(data)
            data = following


def _wait_for(channel: Channel, *tags: Tag):
    """The next message from the master with one of `tags`; others are not expected."""
    while True:
        incoming = channel.wait(source=MASTER)  # not blind to its master for another's death
        if incoming.source == MASTER and incoming.tag in tags and incoming.message is not None:
            return incoming.message
        log.warning("rank %d: unexpected message tag %s from %d %s", channel.rank,
                    incoming.tag, incoming.source, incoming.error)
