"""The invariants a simulation checks after every turn, and the oracles over the finished
campaign. Each check names the rule it holds the code to (the seeds' F313 D1–D8, F317 W1–W10,
F443's generations and the campaign's own) and is counted in the outcome's `checks`.

The checker reads what a debugger would: the ranks' live objects (found on their greenlets'
stacks: the session code is not told it is watched), the messages in flight, and OUT.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from pathlib import Path

import msgspec

from symcc_mpi.corpus import CampaignDir
from symcc_mpi.dispatch.tables import Table
from symcc_mpi.durable.generations import GENERATIONS_JOURNAL, GenerationLog
from symcc_mpi.protocol import Tag
from symcc_mpi.session import Generations
from symcc_mpi.verify import verify_campaign

from .world import Process, SimComm

WORK = int(Tag.WORK)


class Violation(Exception):
    def __init__(self, message: str, step: int):
        super().__init__(f"step {step}: {message}")
        self.rule = message
        self.step = step


class Checker:
    def __init__(self, simulation):
        self.simulation = simulation
        self.out: Path = simulation.out
        self.jobs: dict[int, Generations] = {}
        self.processes: list[Process] = []
        self.journal_size = -1
        self.done: Counter[str] = Counter()  # work id -> done records
        self.records: list[dict] = []
        self.corpus_seen: set[str] = set()
        self.corpus_listed = -1
        self.done_journal = CampaignDir(self.out).done_journal
        self.generations = self.out / "state" / GENERATIONS_JOURNAL
        self.generations_size = -1
        self.generation = None  # the log's current generation
        self.killed_masters = 0

    # -- the ranks' objects --------------------------------------------------------------

    def job_of(self, process: Process) -> Generations | None:
        job = self.jobs.get(process.index)
        if job is None and process.glet is not None:
            frame = process.glet.gr_frame
            while frame is not None and job is None:
                candidate = frame.f_locals.get("self")
                if isinstance(candidate, Generations):
                    job = candidate
                frame = frame.f_back
            if job is not None:
                self.jobs[process.index] = job
        return job

    def role(self, process: Process) -> str | None:
        job = self.job_of(process)
        if job is None:
            return None
        if job.master is not None:
            return "master"
        return "worker" if job.worker is not None else None  # None: opening the campaign

    def _count(self, rule: str) -> None:
        self.simulation.outcome.checks[rule] += 1

    def _fail(self, rule: str) -> None:
        raise Violation(rule, self.simulation.scheduler.steps)

    # -- per job -------------------------------------------------------------------------

    def begin_job(self, processes: list[Process]) -> None:
        self.processes = processes
        self.jobs = {}

    def note_kill(self, process: Process) -> None:
        if self.role(process) == "master":
            self.killed_masters += 1

    def end_job(self, processes: list[Process], *, aborted: int | None) -> None:
        for process in processes:
            if process.alive and not process.finished:
                self._fail(f"rank {process.index} neither ended nor died, and the job is over")
        self._check_journal()
        self._count("a job ends with every live rank returned")

    # -- after every turn ----------------------------------------------------------------

    def after_turn(self, process: Process) -> None:
        """After a turn that did something: a worker's turn that neither sent nor received
        changed nothing anyone can see (its naps are its own)."""
        role = self.role(process)
        process.watched = role != "worker"
        if role != "master" and not self.simulation.scheduler.activity:
            return
        self.simulation.outcome.checked_turns += 1
        master_process = next((p for p in self.processes
                               if p.alive and self.role(p) == "master"), None)
        master = self.jobs[master_process.index].master if master_process else None
        if master is not None:
            self._check_tables(master)
            self._check_object_caches(master)
            self._check_generation(master)
        self._check_journal()
        self._check_corpus()
        if master is not None and not master.storage_problem:
            self._check_nothing_lost(master)

    def _check_tables(self, master) -> None:
        """F313 D1: a rank is in at most one of preparing, active and committing; an idle,
        parked or retired rank in none. F317 W6: a parked rank is not idle."""
        dispatch = master.dispatch
        tables = dispatch.tables
        held = Counter()
        for table in Table:
            for rank in tables.workers(table):
                held[rank] += 1
        twice = [rank for rank, n in held.items() if n > 1]
        if twice:
            self._fail(f"F313 D1: rank {twice[0]} is in two transaction tables")
        for rank in dispatch.idle:
            if tables.holds(rank):
                self._fail(f"F313 D1: idle rank {rank} holds a transaction")
            if dispatch.gate.is_parked(rank):
                self._fail(f"F317 W6: parked rank {rank} is idle")
        self._count("F313 D1 one table per rank, none when idle")
        self._count("F317 W6 a parked rank is not idle")

    def _check_object_caches(self, master) -> None:
        """F313 D7: the master never believes a worker holds an object it neither received
        nor has on its way in a WORK that was sent."""
        comm = master.channel.comm
        if not isinstance(comm, SimComm):
            return
        for rank in master.workers:
            believed = master.dispatch.objects.held(rank)
            if not believed:
                continue
            process = comm.group.members[rank]
            job = self.job_of(process)
            worker = job.worker if job is not None else None
            if not process.alive or worker is None or worker.generation != master.generation:
                continue
            coming = set()
            for message in comm.group.queues.get((rank, comm.rank), ()):
                if message.tag == WORK:
                    coming |= msgspec.msgpack.decode(message.payload).get("objects", {}).keys()
            missing = believed - worker.objects.held.keys() - coming
            if missing:
                self._fail(f"F313 D7: the master's cache says rank {rank} holds "
                           f"{next(iter(missing))[:12]}, which it never received")
        self._count("F313 D7 the object cache claims only what a worker holds")

    def _check_generation(self, master) -> None:
        """F443: a master works in the generation the log says is current; no rank is ahead
        of it."""
        try:
            size = self.generations.stat().st_size
        except FileNotFoundError:
            return
        if size != self.generations_size:
            self.generations_size = size
            current = GenerationLog(self.generations,
                                    quarantine_dir=self.out / "quarantine").current()
            self.generation = None if current is None else current.generation
        if self.generation is None:
            return
        if master.generation > self.generation:
            self._fail(f"F443: the master is in generation {master.generation}, the log's "
                       f"last is {self.generation}")
        self._count("F443 no rank ahead of the generation log")

    def _check_journal(self) -> None:
        """Nothing committed twice: a work id has at most one done record, and each done
        record's RESULT came in the generation it was committed in (F443 §3)."""
        try:
            size = self.done_journal.stat().st_size
        except FileNotFoundError:
            return
        if size == self.journal_size:
            return
        self.journal_size = size
        records, _ = CampaignDir(self.out).inspect_journal()
        done = Counter(_work_id(r) for r in records if "kind" not in r)
        twice = [work for work, n in done.items() if n > 1]
        if twice:
            self._fail(f"committed twice: {twice[0][:12]} has {done[twice[0]]} done records")
        sent = self.simulation.scheduler.results
        for record in records[len(self.records):]:
            if "kind" in record:
                continue
            generation = sent.get(record.get("token"))
            if generation is not None and generation != record.get("generation", 0):
                self._fail(f"F443: {record['sha256'][:12]} committed in generation "
                           f"{record.get('generation', 0)} from a RESULT of generation "
                           f"{generation}")
        self.records = records
        self.done = done
        self._count("nothing committed twice")
        self._count("F443 a RESULT commits only in its own generation")

    def _check_corpus(self) -> None:
        """Every corpus file is named by the SHA-256 of its bytes."""
        try:
            names = os.listdir(self.out / "corpus")
        except FileNotFoundError:
            return
        if len(names) != self.corpus_listed:  # files are only ever added
            self.corpus_listed = len(names)
            for name in names:
                if name in self.corpus_seen or name.startswith("."):
                    continue
                digest = hashlib.sha256((self.out / "corpus" / name).read_bytes()).hexdigest()
                if digest != name:
                    self._fail(f"corpus/{name[:12]} holds bytes whose SHA-256 is "
                               f"{digest[:12]}")
                self.corpus_seen.add(name)
        self._count("every corpus file is named by its content")

    def _check_nothing_lost(self, master) -> None:
        """Every input in the corpus is analysed, waiting, in flight or set aside."""
        frontier = master.frontier
        pending = set(frontier.pending)
        held = {tx.work_id.split("#")[0] for _, tx in master.dispatch.tables.transactions()}
        deferred = {w.split("#")[0] for w in master.dispatch.recovery.deferred()}
        for digest in self.corpus_seen:
            if digest in frontier.done or digest in pending or digest in held \
                    or digest in deferred or digest in master.dispatch.unreadable:
                continue
            self._fail(f"lost: {digest[:12]} is in the corpus but neither analysed, waiting, "
                       "in flight nor set aside")
        self._count("nothing lost")

    # -- the finished campaign -----------------------------------------------------------

    def campaign_complete(self) -> bool:
        self.journal_size = -1
        self._check_journal()
        return self.simulation.reachable() <= set(self.done)

    def final(self) -> None:
        problems, facts = verify_campaign(self.out)
        if problems:
            self._fail(f"verify: {problems[0]}")
        self._count("verify's oracles over the finished campaign")
        reachable = self.simulation.reachable()
        analysed = set(self.done)
        if analysed != reachable:
            extra = sorted(analysed - reachable)
            self._fail(f"analysed {len(analysed)} inputs, {len(reachable)} reachable"
                       + (f"; e.g. unknown {extra[0][:12]}" if extra else ""))
        self._count("exactly the reachable inputs analysed")
        self._check_reexecution()

    def _check_reexecution(self) -> None:
        """An input runs again only if it was in flight when something failed: each extra
        execution is declared by a requeue record, or by the takeover of a dead master."""
        requeued = Counter()
        for record in self.records:
            if record.get("kind") == "requeue":
                requeued[record["sha256"]] += 1
            elif record.get("kind") == "recovered":
                for work in record.get("requeued", ()):
                    requeued[work.split("#")[0]] += 1
        for digest, runs in self.simulation.executions.items():
            allowed = 1 + requeued[digest]
            if runs > allowed:
                self._fail(f"{digest[:12]} ran {runs} times with {requeued[digest]} declared "
                           "re-dispatches")
        self._count("only work in flight at a failure runs again")


def _work_id(record: dict) -> str:
    return record["sha256"] if record.get("part") is None else \
        f"{record['sha256']}#{record['part']}"

