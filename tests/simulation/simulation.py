"""One schedule: a whole campaign (a job, then `--resume` jobs until it is complete) run by the
real session code in the simulated world, its invariants checked after every turn.

A schedule is a seed and a list of faults, each at a virtual time. The seed draws the faults
(`Schedule.generate`) and, during the run, every delay, interleaving and tie; so the same
schedule gives the same run, turn for turn (`Outcome.trace`). Shrinking (shrink.py) removes
faults and workers while the failure persists.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import logging
import os
import random
import shutil
import signal
import tempfile
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from symcc_mpi.campaign import afl_sync, checkpoint, snapshot
from symcc_mpi.campaign.stop import request_stop
from symcc_mpi.config import RUN_ID_ENV, WATCHDOG_ENV, WORK_LEASE_TTL_ENV, CampaignConfig
from symcc_mpi.durable.atomic import SYSTEM_DISK
from symcc_mpi.durable.clock import SYSTEM_CLOCK
from symcc_mpi.executors.symcc import SYMCC_RUNTIME_SYMBOL
from symcc_mpi.job.session import run_rank
from symcc_mpi.roles.faults import FaultKind

from .disk import ForgettingDisk
from .fleet import CAMPAIGN_NAME, SCAN_INTERVALS, Fleet
from .invariants import Checker, Violation
from .world import (
    COMMITTING,
    LEASES,
    Group,
    JobAborted,
    Process,
    Scheduler,
    SimDisk,
    children_of,
    close_orphaned,
    sim_host,
)

WATCHDOG_SECONDS = 0.5
LEASE_TTL = 1.0  # the masters' work leases (F320), seconds
ENVIRONMENT = {WATCHDOG_ENV: str(WATCHDOG_SECONDS), WORK_LEASE_TTL_ENV: str(LEASE_TTL)}
EXECUTION_TIMEOUT = 0.25  # the campaign's --timeout: the master drains for it + 10 s
HORIZON = 400.0  # virtual seconds a job may take before it counts as hung
MAX_TURNS = 1_000_000  # turns a job may take (time that stands still is a livelock)
EXPOSURE_SLACK = 2 * max(WATCHDOG_SECONDS, LEASE_TTL)  # a fault's effects outlast it so long
FAULT_WINDOW = 0.8  # faults fall in the first virtual seconds, while work is in flight

K = FaultKind
# What may be drawn for a schedule, and whom it strikes: a worker (the rank drawn), a master
# (the rank drawn, modulo the masters alive), or the machine. Each schedule may draw from
# some of them only (FAULT_KIND_CHANCE each): its own fault mix.
FAULT_KINDS = ((K.DIE, "worker"), (K.DIE, "master"), (K.PAUSE, "worker"), (K.PAUSE, "master"),
               (K.SLOW_LINK, "worker"), (K.CLOCK_JUMP, "machine"), (K.SUSPEND, "machine"),
               (K.STALE_GENERATION, "worker"), (K.SEND_FAIL, "master"),
               (K.DISK_ERROR, "master"), (K.DISK_FULL, "master"), (K.TORN_WRITE, "master"),
               (K.SLOW_DISK, "master"))
LEASE_FAULTS = ((K.LEASE_WRITE_ERROR, "master"), (K.SLOW_LEASE_WRITE, "master"),
                (K.STALL_IN_COMMIT, "master"))  # with more than one master
WINDOW_FAULTS = {K.PAUSE, K.SLOW_LINK, K.SUSPEND, K.SLOW_DISK, K.SLOW_LEASE_WRITE,
                 K.STALL_IN_COMMIT}
LASTING_FAULTS = {K.SLOW_LINK, K.DISK_FULL}  # until the job ends
# A machine's death comes at one of its ranks' next fsyncs (SECONDS counts them, 0: at once),
# the moments at which what is durable changes, often inside a commit.
CRASH_CHANCE = 0.35
FAULT_KIND_CHANCE = 0.5
SPLIT_CHANCE = 0.4
TRIAGE_CHANCE = 0.4
PRUNING_DRAWS = ("off", "off", "shared", "local")  # --pruning: QSYM's map shared, per worker
HYBRID_CHANCE = 0.5  # of the schedules with one master and triage: beside AFL++ instances
# A hybrid campaign waits for the fuzzers until it is stopped: the simulation asks it to stop
# (OUT/.stop-request, as the launcher does on Ctrl-C) once it has done all there is, looking
# every STOP_CHECK virtual seconds, or after STOP_PATIENCE if it never does (the oracles then
# say what is missing).
STOP_CHECK = 0.25
STOP_PATIENCE = 60.0
# A knob the schedule draws, as FoundationDB's simulation randomises its knobs: how often the
# maps and the fleet's cursors are saved (checkpoint.SAVE_INTERVAL), so that saves fall among
# the faults of the first virtual second too.
SAVE_INTERVALS = (checkpoint.SAVE_INTERVAL, 0.5, 0.2)
MACHINE_LAYOUTS = (1, 1, 2, 3)  # how many machines the ranks are dealt over


@dataclass(frozen=True)
class Fault:
    at: float  # virtual seconds since the job began
    kind: FaultKind
    rank: int = 0  # a world rank (a worker's), where the kind names one
    seconds: float = 0.0
    whom: str = "worker"  # "worker", "master" or "machine"

    def __post_init__(self):
        object.__setattr__(self, "kind", FaultKind(self.kind))  # as JSON replays give it

    @property
    def name(self) -> str:
        if self.kind is K.MACHINE_CRASH:
            return f"{self.kind.value} ({'every machine' if self.rank < 0 else 'one machine'})"
        return self.kind.value if self.whom == "machine" else f"{self.kind.value} ({self.whom})"

    def __str__(self) -> str:
        who = f" rank {self.rank}" if self.whom == "worker" else ""
        if self.kind is K.MACHINE_CRASH:
            who = " of every machine" if self.rank < 0 else f" of machine {self.rank}"
        return f"{self.name}{who} at {self.at:.3f} s ({self.seconds:+.2f} s)"


@dataclass(frozen=True)
class Schedule:
    seed: int
    workers: int = 3  # in all, over the masters
    masters: int = 1
    seeds: int = 2
    faults: tuple[Fault, ...] = ()
    machines: int = 1  # rank i runs on machine i % machines
    split: bool = False  # --split (splitting.py): the executor can be targeted
    triage: bool = False  # --afl-target: the workers probe children, the masters triage
    pruning: str = "off"  # --pruning (pruning.py): the executor honours QSYM's map
    hybrid: bool = False  # --afl-sync beside simulated AFL++ instances (fleet.py)
    save_interval: float = checkpoint.SAVE_INTERVAL  # seconds between saves of the maps
    fanout: int = 2
    depth: int = 3
    space: int = 10
    execution_seconds: tuple[float, float] = (0.005, 0.06)
    delays: tuple[float, float] = (0.00005, 0.004)

    @classmethod
    def generate(cls, seed: int) -> Schedule:
        """A swarm configuration (its sizes, its features, the fault kinds it may draw
        from), then its faults: configurations that differ find what one tuned does not."""
        rng = random.Random(f"schedule-{seed}")
        masters = rng.choice((1, 1, 1, 2, 2, 3, 4))
        workers = rng.choice((1, 2, 3, 4, 4, 6, 8, 16)) if masters == 1 else \
            masters * rng.choice((1, 1, 2, 2, 3, 4))
        seeds = rng.choice((1, 2, 3, 3, 5, 8, 20, 100))
        split, triage = rng.random() < SPLIT_CHANCE, rng.random() < TRIAGE_CHANCE
        kinds = [kind for kind in FAULT_KINDS + (LEASE_FAULTS if masters > 1 else ())
                 if rng.random() < FAULT_KIND_CHANCE]
        faults = []
        for _ in range(rng.choice((0, 1, 1, 2, 2, 3, 4, 6)) if kinds else 0):
            kind, whom = rng.choice(kinds)
            at = rng.uniform(0.0, FAULT_WINDOW)
            rank = rng.randint(1, workers)
            seconds = {
                (K.PAUSE, "worker"): lambda: rng.uniform(0.2, 3.0) * WATCHDOG_SECONDS,
                (K.PAUSE, "master"): lambda: rng.uniform(0.2, 3.0) * WATCHDOG_SECONDS,
                (K.SLOW_LINK, "worker"): lambda: rng.uniform(0.5, 2.5) * WATCHDOG_SECONDS,
                (K.CLOCK_JUMP, "machine"): lambda: rng.choice((-1, 1)) * rng.uniform(1, 3600),
                (K.SUSPEND, "machine"): lambda: rng.uniform(0.5, 3.0) * WATCHDOG_SECONDS,
                (K.SLOW_DISK, "master"): lambda: rng.uniform(0.5, 3.0) * LEASE_TTL,
                (K.SLOW_LEASE_WRITE, "master"): lambda: rng.uniform(1.0, 3.0) * LEASE_TTL,
                (K.STALL_IN_COMMIT, "master"): lambda: rng.uniform(1.0, 3.0) * LEASE_TTL,
                (K.LEASE_WRITE_ERROR, "master"): lambda: rng.randint(1, 2),
                (K.DISK_ERROR, "master"): lambda: rng.randint(1, 3),
                (K.SEND_FAIL, "master"): lambda: rng.randint(1, 3),
            }.get((kind, whom), lambda: 0.0)()
            faults.append(Fault(round(at, 4), kind, rank, round(seconds, 3), whom))
        machines = min(masters + workers, rng.choice(MACHINE_LAYOUTS))
        if rng.random() < CRASH_CHANCE:  # machine -1: every one, a power failure
            faults.append(Fault(round(rng.uniform(0.0, FAULT_WINDOW), 4), K.MACHINE_CRASH,
                                rng.randrange(machines + 1) - 1 if machines > 1 else -1,
                                rng.randint(0, 4), "machine"))
        # Drawn last, so that the draws above stay those of the schedules found before.
        pruning = rng.choice(PRUNING_DRAWS)
        hybrid = masters == 1 and triage and rng.random() < HYBRID_CHANCE
        save_interval = rng.choice(SAVE_INTERVALS)
        faults.sort(key=lambda f: f.at)
        return cls(seed, workers=workers, masters=masters, seeds=seeds, faults=tuple(faults),
                   machines=machines, split=split, triage=triage, pruning=pruning,
                   hybrid=hybrid, save_interval=save_interval)

    @classmethod
    def from_plain(cls, plain: dict) -> Schedule:
        """A schedule from its JSON (as --shrink prints it; fields left out take their
        defaults)."""
        plain = {**plain, "faults": tuple(Fault(**f) for f in plain.get("faults", ()))}
        for name in ("execution_seconds", "delays"):
            if name in plain:
                plain[name] = tuple(plain[name])
        return cls(**plain)

    def describe(self) -> str:
        faults = "; ".join(map(str, self.faults)) or "no fault"
        masters = f"{self.masters} masters, " if self.masters > 1 else ""
        machines = f" on {self.machines} machines" if self.machines > 1 else ""
        features = "".join(f", {name}" for name, on in (
            ("split", self.split), ("triage", self.triage), ("hybrid", self.hybrid),
            (f"{self.pruning} pruning", self.pruning != "off")) if on)
        return f"seed {self.seed}: {masters}{self.workers} workers{machines}, " \
               f"{self.seeds} seeds{features}, {faults}"


@dataclass
class Outcome:
    schedule: Schedule
    violation: Violation | None = None
    jobs: int = 0
    turns: int = 0
    checked_turns: int = 0  # turns after which the invariants were checked
    virtual_seconds: float = 0.0
    faults: Counter = field(default_factory=Counter)  # injected, by kind
    checks: Counter = field(default_factory=Counter)  # evaluated, by invariant
    executions: int = 0
    inputs: int = 0
    forgotten: Counter = field(default_factory=Counter)  # what machines' deaths took
    trace: str = ""  # a digest of every turn: equal traces, equal runs

    @property
    def failed(self) -> bool:
        return self.violation is not None


class Simulation:
    def __init__(self, schedule: Schedule, *, root: Path | None = None):
        self.schedule = schedule
        self.rng = random.Random(f"run-{schedule.seed}")
        self.scheduler: Scheduler | None = None
        self.schedulers: list[Scheduler] = []  # one per job
        self.directory = Path(tempfile.mkdtemp(prefix="symcc-mpi-sim-", dir=root or _scratch()))
        self.out = self.directory / "out"
        self.fleet = None
        if schedule.hybrid:  # the campaign is AFL_OUT's instance CAMPAIGN_NAME
            self.fleet = Fleet(schedule.seed, self.directory / "afl-out")
            self.out = self.fleet.sync_dir / CAMPAIGN_NAME
        self.executions: Counter[str] = Counter()
        self.outcome = Outcome(schedule)
        self.trace = hashlib.sha256()
        self.jobs_run = 0
        self.begun = 0.0  # the campaign's first job's virtual start
        self.checker: Checker | None = None
        self.exposure_slack = EXPOSURE_SLACK
        self.disk = ForgettingDisk(self.directory, lambda: self._machine_now() is not None)
        self.crash: tuple[int, int] | None = None  # a machine's death armed: (machine, fsyncs)
        self.boots: Counter[int] = Counter()  # per machine: how many times it started again

    # -- what the executor reports -------------------------------------------------------

    def pruned(self, data: bytes, skipped: set[int]) -> None:
        """A pruned run of `data` skipped the branches `skipped` (QSYM's map held them)."""
        if skipped:
            self.checker.pruned_runs.append((data, skipped))
        self.trace.update(f"p{len(skipped)}".encode())

    def executed(self, digest: str, targets: frozenset[int] | None, process: Process) -> None:
        """A run of `digest`, solving `targets` (None: every branch): one part of a split
        input runs again only as the whole input would."""
        work = digest if targets is None else f"{digest}#{','.join(map(str, sorted(targets)))}"
        self.executions[work] += 1
        self.trace.update(f"x{digest[:8]}{process.index}".encode())

    # -- a campaign ----------------------------------------------------------------------

    def run(self) -> Outcome:
        saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        saved_env = {name: os.environ.get(name) for name in (*ENVIRONMENT, RUN_ID_ENV)}
        os.environ.update(ENVIRONMENT)
        real_boot_id = snapshot.boot_id
        snapshot.boot_id = self._boot_id  # a machine that died starts again, as another boot
        checkpoint.SAVE_INTERVAL = self.schedule.save_interval
        if self.fleet is not None:
            afl_sync.SCAN_INTERVAL = self.fleet.scan_interval
        try:
            with self.disk.installed():
                self._campaign()
        except Violation as violation:
            self.outcome.violation = violation
        finally:
            if self.checker is not None:
                logging.getLogger("symcc_mpi").removeHandler(self.checker.tracebacks)
            for s, handler in saved.items():
                signal.signal(s, handler)
            for name, value in saved_env.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            SYSTEM_CLOCK.source = _real_time()
            SYSTEM_DISK.source = os
            snapshot.boot_id = real_boot_id
            checkpoint.SAVE_INTERVAL = SAVE_INTERVALS[0]
            afl_sync.SCAN_INTERVAL = SCAN_INTERVALS[0]
            shutil.rmtree(self.directory, ignore_errors=True)
            self._forget_the_ranks()
        self.outcome.executions = sum(self.executions.values())
        self.outcome.forgotten = self.disk.forgotten
        self.outcome.trace = self.trace.hexdigest()[:16]
        return self.outcome

    def _forget_the_ranks(self) -> None:
        """Drop every reference to the ranks' objects, then close the descriptors the dead
        ones left behind."""
        orphaned = set()
        for scheduler in self.schedulers:
            orphaned |= scheduler.orphaned
        self.schedulers.clear()
        self.scheduler = self.checker = None
        violation = self.outcome.violation
        if violation is not None:  # its traceback's frames hold the ranks' objects
            violation.__traceback__ = violation.__cause__ = violation.__context__ = None
        gc.collect()
        close_orphaned(orphaned)

    def _campaign(self) -> None:
        """A job, then `--resume` jobs until the campaign is complete; then its oracles."""
        seeds = self._write_seeds()
        schedule = self.schedule
        target = "simulated" if schedule.pruning == "off" else str(self._symcc_build())
        config = CampaignConfig(target=(target, "@@"), seeds=seeds, out=self.out,
                                workers=schedule.workers, masters=schedule.masters,
                                # QSYM's map is SymCC's: its runs are the ones pruned
                                executor="noop" if schedule.pruning == "off" else "symcc",
                                pruning=schedule.pruning,
                                timeout=EXECUTION_TIMEOUT, live=False,
                                fault_tolerance="on", split=schedule.split,
                                afl_target=(str(self._afl_build()), "@@")
                                if schedule.triage else None,
                                afl_sync=self.fleet.sync_dir if self.fleet else None)
        checker = self.checker = Checker(self)
        logging.getLogger("symcc_mpi").addHandler(checker.tracebacks)
        faults = self.schedule.faults
        for _ in range(4):
            clean = self._job(config, faults, checker)
            if clean and checker.campaign_complete():
                break
            config, faults = replace(config, resume=True), ()  # as a user would go on
        else:
            if self.fleet is not None:
                checker.final()  # says what is missing
            raise Violation("the campaign is not complete after three --resume runs",
                            self.scheduler.steps if self.scheduler else 0)
        checker.final()

    def _afl_build(self) -> Path:
        """What --afl-target's check accepts; the host's probe (SimProbe) never runs it."""
        build = self.directory / "afl-build"
        build.write_bytes(b"\x7fELF" + b"__AFL_SHM_ID\x00")
        build.chmod(0o755)
        return build

    def _symcc_build(self) -> Path:
        """What --executor symcc's check accepts; the host's executor (SimExecutor) never
        runs it."""
        build = self.directory / "symcc-build"
        build.write_bytes(b"\x7fELF\x00" + SYMCC_RUNTIME_SYMBOL + b"\x00")
        build.chmod(0o755)
        return build

    def _write_seeds(self) -> Path:
        seeds = self.directory / "seeds"
        seeds.mkdir()
        for number in range(self.schedule.seeds):
            (seeds / f"seed{number}").write_bytes(bytes([0, number, 0]))
        return seeds

    def inputs(self, deferred: set[str] = frozenset(),
               kept: set[str] | None = None) -> dict[str, bytes]:
        """Every input the campaign must analyse or set aside, by digest: the seeds' closure
        under the executor, through every input but those `deferred` (never run, so no
        children) and through the children triage `kept` only (None: every one)."""
        schedule = self.schedule
        todo = [bytes([0, n, 0]) for n in range(schedule.seeds)]
        todo += self.fleet.roots() if self.fleet is not None else []
        seen = {hashlib.sha256(d).hexdigest(): d for d in todo}
        while todo:
            data = todo.pop()
            if hashlib.sha256(data).hexdigest() in deferred:
                continue
            for child in children_of(data, fanout=schedule.fanout, depth=schedule.depth,
                                     space=schedule.space):
                digest = hashlib.sha256(child).hexdigest()
                if digest not in seen and (kept is None or digest in kept):
                    seen[digest] = child
                    todo.append(child)
        return seen

    def reachable(self, deferred: set[str] = frozenset(),
                  kept: set[str] | None = None) -> set[str]:
        return set(self.inputs(deferred, kept))

    def _job(self, config: CampaignConfig, faults: tuple[Fault, ...], checker: Checker) -> bool:
        """One mpiexec of the campaign; True if every rank ended with status 0 (else the
        user is told to go on with --resume, and the simulation does)."""
        self.jobs_run += 1
        self.outcome.jobs += 1
        scheduler = Scheduler(self.rng, delays=self.schedule.delays)
        if self.scheduler is not None:  # virtual time goes on across jobs
            scheduler.now = self.scheduler.now
            scheduler.wall_offset = self.scheduler.wall_offset
        self.scheduler = scheduler
        self.schedulers.append(scheduler)
        SYSTEM_CLOCK.source = scheduler
        SYSTEM_DISK.source = SimDisk(scheduler)
        scheduler.struck = lambda seconds: checker.fault_injected(
            scheduler.now + seconds + EXPOSURE_SLACK)
        scheduler.slowed = checker.dispatch_slowed
        scheduler.work_sent = checker.work_sent
        scheduler.received = checker.message_received
        Group.every = []
        processes = [Process(i, f"simhost/{self.jobs_run}{i:02d}/0",
                             machine=i % self.schedule.machines)
                     for i in range(config.workers + config.masters)]
        self.disk.before_sync = lambda: self._crash_at_sync(processes)
        world = Group(scheduler, processes)
        for process in processes:
            host = sim_host(self, process, world)
            scheduler.spawn(process, lambda host=host: run_rank(config, host))
        begun = scheduler.now
        if self.jobs_run == 1:
            self.begun = begun
        pending = sorted(faults, key=lambda f: f.at)
        checker.begin_job(processes)
        os.environ[RUN_ID_ENV] = run_id = f"simulated-{self.jobs_run}"
        stop_check = begun if self.fleet is not None else float("inf")
        try:
            while True:
                while pending and pending[0].at + begun <= scheduler.now:
                    self._inject(pending.pop(0), processes)
                if self.fleet is not None:
                    if self.fleet.write_due(scheduler.now - self.begun, scheduler.time()):
                        self.trace.update(f"afl{len(self.fleet.written)}".encode())
                    if scheduler.now >= stop_check:
                        stop_check = scheduler.now + STOP_CHECK
                        if self.out.is_dir() and (scheduler.now - begun >= STOP_PATIENCE or (
                                not self.fleet.pending and checker.campaign_complete())):
                            request_stop(self.out, run_id)
                            stop_check = float("inf")
                process = scheduler.next_turn()
                if process is None:
                    break
                if pending and pending[0].at + begun < scheduler.now:
                    scheduler.wake(process, scheduler.now)  # its turn after the fault
                    scheduler.now = pending[0].at + begun
                    continue
                if scheduler.steps > MAX_TURNS:
                    raise Violation(f"the job took {MAX_TURNS} turns without ending "
                                    f"(ranks still running: {_running(processes)})",
                                    scheduler.steps)
                if scheduler.now - begun > HORIZON:
                    raise Violation(f"the job did not end within {HORIZON:g} virtual seconds "
                                    f"(ranks still running: {_running(processes)})",
                                    scheduler.steps)
                try:
                    scheduler.run_turn(process)
                except JobAborted:  # F320 §6: a conflict after COMMIT ends so, by design
                    checker.no_traceback()
                    break
                except Violation:
                    raise
                except Exception as error:  # noqa: BLE001 - a rank's traceback is a finding
                    raise Violation(f"rank {process.index} raised {type(error).__name__}: "
                                    f"{error}", scheduler.steps) from error
                self.trace.update(f"t{process.index}{scheduler.now:.9f}".encode())
                checker.after_turn(process)
        finally:
            self.outcome.turns += scheduler.steps
            self.outcome.virtual_seconds = scheduler.now
            checker.tracebacks.judging = False
            scheduler.free()
            # The dead ranks' files close now, not when a later schedule's collection
            # happens to free them (and their numbers, reused within one turn, would hide
            # from the descriptor tracking).
            gc.collect()
            checker.tracebacks.judging = True
        self.crash = None  # a fault of this job, as every fault is
        checker.end_job(processes, aborted=scheduler.aborted)
        return scheduler.aborted is None and all(p.alive and p.status == 0 for p in processes)

    def _inject(self, fault: Fault, processes: list[Process]) -> None:
        scheduler = self.scheduler
        self.outcome.faults[fault.name] += 1
        self.trace.update(str(fault).encode())
        lasts = float("inf") if fault.kind in LASTING_FAULTS else \
            fault.seconds if fault.kind in WINDOW_FAULTS else 0.0
        self.checker.fault_injected(scheduler.now + lasts + EXPOSURE_SLACK)
        if fault.whom == "worker":
            process = processes[fault.rank] if fault.rank < len(processes) else None
            if process is None or self.checker_role(process) == "master":
                return  # that rank took the campaign over: the fault names a worker
        elif fault.whom == "master":
            masters = [p for p in processes if p.alive and self.checker_role(p) == "master"]
            if not masters:
                return
            process = masters[fault.rank % len(masters)]
        kind = fault.kind
        if kind is K.MACHINE_CRASH:
            self.crash = (fault.rank, int(fault.seconds))
            self._crash_at_sync(processes, counting=False)
        elif kind is K.DIE:
            if process.finished:
                return  # it exited before: nothing to kill, its messages are sent
            self.checker.note_kill(process)
            scheduler.kill(process)
            self._lose_messages(process)
        elif kind is K.PAUSE:
            scheduler.pause(process, fault.seconds)
        elif kind is K.SLOW_LINK:
            scheduler.slow[process.index] = fault.seconds
        elif kind is K.CLOCK_JUMP:
            scheduler.wall_offset += fault.seconds
        elif kind is K.SUSPEND:  # the whole machine stops: both clocks jump
            for process in processes:
                if process.alive:
                    scheduler.pause(process, fault.seconds)
        elif kind is K.STALE_GENERATION:
            scheduler.stale_results.add(process.index)
        elif kind is K.SEND_FAIL:
            scheduler.send_errors[process.index] = int(fault.seconds)
        elif kind is K.DISK_ERROR:
            process.disk_fault = ("error", int(fault.seconds))
        elif kind is K.DISK_FULL:
            process.disk_fault = ("full",)
        elif kind is K.TORN_WRITE:
            process.disk_fault = ("tear",)
        elif kind is K.SLOW_DISK:
            process.disk_fault = ("stall", fault.seconds)
        elif kind is K.LEASE_WRITE_ERROR:
            process.disk_fault = ("error", int(fault.seconds), LEASES)
        elif kind is K.SLOW_LEASE_WRITE:
            process.disk_fault = ("stall", fault.seconds, LEASES)
        elif kind is K.STALL_IN_COMMIT:
            process.disk_fault = ("stall", fault.seconds, COMMITTING)
        else:
            raise ValueError(f"the simulation cannot inject {fault.name}")

    def _boot_id(self) -> str:
        machine = self._machine_now() or 0
        return f"simulated-{machine}-{self.boots[machine]}"

    def _machine_now(self) -> int | None:
        current = self.scheduler.current if self.scheduler is not None else None
        return None if current is None else current.machine

    def _crash_at_sync(self, processes: list[Process], *, counting: bool = True) -> None:
        """The armed machine's death, if this is its moment: its countdown of fsyncs by its
        ranks has run out. Inside a rank's fsync, that rank dies there and never returns."""
        if self.crash is None:
            return
        machine, fsyncs = self.crash
        if counting:
            if machine >= 0 and self._machine_now() != machine:
                return  # (a power failure, -1, counts every machine's fsyncs)
            if fsyncs > 0:
                self.crash = (machine, fsyncs - 1)
                return
        elif fsyncs > 0:
            return
        self.crash = None
        scheduler = self.scheduler
        scheduler.struck(0.0)
        power = machine < 0 or self.schedule.machines == 1
        dying = [p for p in processes if p.alive and (power or p.machine == machine)]
        self.checker.machines_dying(dying)
        for process in dying:
            self.checker.note_kill(process)
            scheduler.kill(process)
            self._lose_messages(process)
        self.trace.update(f"crash{machine}".encode())
        for died in range(self.schedule.machines) if power else (machine,):
            self.boots[died] += 1
        if power:
            self.disk.power_failure()
        self.checker.crashed()
        current = scheduler.current
        if current is not None and not current.alive:
            scheduler.park()  # never resumed: it died inside the fsync
            raise AssertionError("a dead rank ran again")

    def _lose_messages(self, process: Process) -> None:
        """A killed rank's messages still on their way arrive, or are lost, as the schedule
        draws (MPI promises nothing about them)."""
        for group in Group.every:
            for queue in group.queues.values():
                doomed = [m for m in queue if m.source is process
                          and m.deliver_at > self.scheduler.now and self.rng.random() < 0.5]
                for message in doomed:
                    queue.remove(message)

    def checker_role(self, process: Process) -> str:
        return self.checker.role(process)


def _running(processes: list[Process]) -> str:
    return ", ".join(str(p.index) for p in processes if p.alive and not p.finished) or "none"


def _scratch() -> str | None:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def _real_time():
    import time

    return time


def run_schedule(schedule: Schedule, *, verbose: bool = False) -> Outcome:
    """`verbose`: the ranks' log and the campaign's output, as a real job prints them."""
    if verbose:
        return Simulation(schedule).run()
    logger = logging.getLogger("symcc_mpi")
    level = logger.level
    logger.setLevel(logging.ERROR)  # quiet, but tracebacks are findings
    try:
        with contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            return Simulation(schedule).run()
    finally:
        logger.setLevel(level)  # the process goes on (pytest): its logging as it was
