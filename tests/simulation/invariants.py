"""The invariants a simulation checks after every turn, and the oracles over the finished
campaign. Each check names the rule it holds the code to (the seeds' F313 D1–D8, F317 W1–W10,
F443's generations and the campaign's own) and is counted in the outcome's `checks`.

The checker reads what a debugger would: the ranks' live objects (found on their greenlets'
stacks: the session code is not told it is watched), the messages in flight, and OUT.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from symcc_mpi.campaign.corpus import CampaignDir
from symcc_mpi.campaign.layout import done_journals
from symcc_mpi.campaign.verify import _read_deferred, verify_campaign
from symcc_mpi.dispatch.coordinator import FRONTIER_ENTRY, DispatchCoordinator
from symcc_mpi.dispatch.tables import Table
from symcc_mpi.dispatch.transaction import DispatchTransaction, TransactionState
from symcc_mpi.durable.deferred import DEFERRED_JOURNAL_NAME
from symcc_mpi.job.generations import Generations
from symcc_mpi.roles.master import Master
from symcc_mpi.roles.worker import Worker
from symcc_mpi.scheduling.frontier import _SENT_SHIFT
from symcc_mpi.scheduling.splitting import TRACE, WorkSource, parse_work_id
from symcc_mpi.ulfm.generations import GENERATIONS_JOURNAL, GenerationLog
from symcc_mpi.wire.protocol import Tag

from .world import Process, SimComm, SimDoorbell, branches_of, children_of, coverage_of

WORK = int(Tag.WORK)
READY = int(Tag.READY)
RESULT = int(Tag.RESULT)
D4 = "F313 D4 a dispatch discarded after its send keeps its count and commits nothing"
ROLLED_BACK = TransactionState.ROLLED_BACK
COMMITTED = TransactionState.COMMITTED


class Violation(Exception):
    def __init__(self, message: str, step: int):
        super().__init__(f"step {step}: {message}")
        self.rule = message
        self.step = step


class Tracebacks(logging.Handler):
    """A rank that logs a traceback met an error nobody handled: a finding, whatever the
    campaign's oracles say afterwards."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.seen: list[str] = []
        self.judging = True  # not while dead ranks are freed: they died, they did not fail

    def emit(self, record: logging.LogRecord) -> None:
        if self.judging and record.exc_info and record.exc_info[0] is not None:
            error = record.exc_info[1]
            self.seen.append(f"{record.getMessage()}: {type(error).__name__}: {error}")


class Checker:
    def __init__(self, simulation):
        self.simulation = simulation
        self.out: Path = simulation.out
        self.roles: dict[int, object] = {}  # per process, as of its last turn
        self.tracebacks = Tracebacks()
        self.processes: list[Process] = []
        self.journal_sizes: tuple = ()
        self.journals_read: dict[Path, _JournalRead] = {}
        self.judged: set[str] = set()  # tokens of the done records checked
        self.done: Counter[str] = Counter()  # work id -> done records
        self.records: list[dict] = []
        self.corpus_seen: set[str] = set()
        self.corpus_listed = -1
        self.generations = self.out / "state" / GENERATIONS_JOURNAL
        self.generations_size = -1
        self.generation = None  # the log's current generation
        self.killed_masters = 0
        # Per fault: until when its effects may still show, and every input seen in flight
        # meanwhile (work in flight at a failure may run again, F443 §3; other work not).
        self.exposures: list[tuple[float, set[str]]] = []
        # Per input, the dispatches of it a slow link delayed (a lasting fault that strikes
        # each dispatch over it anew: dispatch_slowed).
        self.slowed: Counter[str] = Counter()
        self.forgotten: Counter[str] = Counter()  # inputs whose done record a crash took
        # Corpus files a power failure left with a durable name and not their bytes (another
        # master's fsync of corpus/ made the name durable): the campaign must repair them.
        self.damaged: set[str] = set()
        # What the turn under way did, as the world saw it (world.Scheduler's hooks): its
        # WORK sends, each with the dispatch it was of, and the READY and RESULT messages it
        # received.
        self.sends: list[tuple] = []
        # per coordinator: the WORK sends since its master was last at rest, judged (D3) once
        # it is again (a stalled write inside a failed send's rollback spans turns)
        self.unjudged_sends: dict = {}
        self.received: list[tuple] = []
        self.group_sends: Counter = Counter()  # per coordinator: its group WORKs that went out
        self.seen: dict = {}  # per master: its dispatch state as of the last check (_Seen)
        # per master: the late RESULTs of parked ranks it received and has maybe not yet
        # classified, and its count of stale RESULTs before them
        self.late: dict = {}
        self.readies: dict = {}  # per master: the READYs it received since it was at rest
        self.parks: dict = {}  # per master: parks and unparks not yet judged, and since when
        self.void: set[str] = set()  # tokens of dispatches discarded: none may commit
        self.recorded: set[str] = set()  # tokens of the done and part records on disk
        self.commits: list = []  # (master, dispatch) committed since the last check
        self.pruned_runs: list[tuple[bytes, set[int]]] = []  # (input, branches its map skipped)

    # -- the ranks' objects --------------------------------------------------------------

    def role_of(self, process: Process, *, refresh: bool = False):
        """The rank's Master or Worker object, the innermost on its stack (a worker that
        took the campaign over is a master from then on); None while it opens or ends.
        Looked up again after a turn that may have changed it (`refresh`)."""
        known = self.roles.get(process.index)
        if known is not None and not refresh:
            return known
        if process.glet is None or process.glet.gr_frame is None:
            return known
        role = None
        frame = process.glet.gr_frame
        while frame is not None:
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, Master | Worker):
                role = candidate
                break
            if isinstance(candidate, Generations):
                role = candidate.master or candidate.worker
                break
            frame = frame.f_back
        self.roles[process.index] = role
        return role

    def role(self, process: Process) -> str | None:
        role = self.role_of(process)
        return "master" if isinstance(role, Master) else "worker" if role else None

    def _at_rest(self, master) -> bool:
        """Whether `master`'s rank waits in its loop's nap (not inside an operation)."""
        process = next(p for p in self.processes if self.roles.get(p.index) is master)
        frame = process.glet.gr_frame if process.glet is not None else None
        while frame is not None:
            if isinstance(frame.f_locals.get("self"), SimDoorbell):
                return True
            frame = frame.f_back
        return False

    def masters(self) -> list:
        return [role for p in self.processes if p.alive
                and isinstance(role := self.role_of(p), Master)]

    def _count(self, rule: str) -> None:
        self.simulation.outcome.checks[rule] += 1

    def _fail(self, rule: str) -> None:
        raise Violation(rule, self.simulation.scheduler.steps)

    # -- per job -------------------------------------------------------------------------

    def begin_job(self, processes: list[Process]) -> None:
        self.processes = processes
        self.roles = {}

    def note_kill(self, process: Process) -> None:
        if self.role(process) == "master":
            self.killed_masters += 1

    def end_job(self, processes: list[Process], *, aborted: int | None) -> None:
        self.no_traceback()
        for process in processes:
            if process.alive and not process.finished:
                self._fail(f"rank {process.index} neither ended nor died, and the job is over")
        self._count("a job ends with every live rank returned")
        if _stop_reason(self.out) == "frontier exhausted" and not self.campaign_complete():
            missing = sorted(self.required() - set(self.done))
            self._fail(f"F320 quiescence: the job ended with its frontier exhausted, but "
                       f"{len(missing)} reachable inputs were never analysed, e.g. "
                       f"{missing[0][:12]}")
        self._count("F320 an exhausted frontier leaves no input unanalysed")

    # -- after every turn ----------------------------------------------------------------

    def after_turn(self, process: Process) -> None:
        """After a turn that did something: a worker's turn that neither sent nor received
        changed nothing anyone can see (its naps are its own)."""
        self.no_traceback()
        if self.pruned_runs:
            self._check_pruning()
        sends, self.sends = self.sends, []
        received, self.received = self.received, []
        activity = self.simulation.scheduler.activity
        # A role changes only in a turn that did something (a takeover joins collectives).
        role = self.role_of(process, refresh=activity or process.glet.dead)
        process.watched = not isinstance(role, Worker)
        if not isinstance(role, Master) and not activity:
            return
        self.simulation.outcome.checked_turns += 1
        masters = self.masters()
        self._note_exposed(masters)
        if sends or self.unjudged_sends:
            self._check_sends(masters, sends)
        for master in masters:
            self._check_transitions(master, received if master is role else (), sends)
            self._check_tables(master)
            self._check_object_caches(master)
            self._check_generation(master)
        self._check_journal()
        if self.commits:
            self._check_commits_recorded()
        self._check_corpus()
        # Where an input is, a master knows between two of its operations, not while it
        # waits inside one (a stalled fsync, a lock): only at rest is it asked.
        resting = [m for m in masters if self._at_rest(m)]
        for master in resting:
            self._check_at_rest(master)
        if self.simulation.schedule.masters == 1:
            if resting and not resting[0].storage_problem:
                self._check_nothing_lost(resting[0])
        else:
            self._check_single_winner(masters)
            self._check_quiescence(masters)
            for master in resting:
                self._check_leases_kept(master)

    def _journals_now(self) -> tuple[Counter[str], Counter[str]]:
        """The inputs with a record (done, dispatch, requeue...), and the re-dispatches
        declared, as the journals say now."""
        self.journal_sizes = ()
        self._check_journal()
        return Counter(r["digest"] for r in self.records if "digest" in r), \
            _declared(self.records)

    def machines_dying(self, processes: list[Process]) -> None:
        """`processes` are about to die with their machines: what the journals hold, and
        what their masters have in flight (dispatched, or committed and waiting for the
        group commit's append: done_log.py)."""
        masters = [role for p in processes if isinstance(role := self.role_of(p), Master)]
        in_flight = _dispatched(masters) | {
            record["digest"] for master in masters
            for record in master.campaign.journal._pending if "digest" in record}
        self._before_crash = (*self._journals_now(), in_flight)

    def crashed(self) -> None:
        """Machines died and the disk forgot what was not durable. An input whose journal
        records it took may run again undeclared (F443 §3: a done record vouches once
        durable; a dispatch record, not fsynced, is what a resume declares a re-dispatch
        by: done_log.py), as may what the dead masters had in flight, and the re-dispatch
        records it took declare nothing any more; and corpus files may have gone."""
        recorded, declared, in_flight = self._before_crash
        now_recorded, now_declared = self._journals_now()
        lost = set(recorded - now_recorded) | in_flight
        self.forgotten.update(lost)
        self.forgotten.update(declared - now_declared)
        until = self.simulation.scheduler.now + self.simulation.exposure_slack
        self.exposures.append((until, set(lost)))
        self.corpus_seen.clear()
        self.corpus_listed = -1
        self.generations_size = -1
        corpus = self.out / "corpus"
        self.damaged = {name for name in (os.listdir(corpus) if corpus.is_dir() else ())
                        if not name.startswith(".") and
                        hashlib.sha256((corpus / name).read_bytes()).hexdigest() != name}

    def fault_injected(self, until: float) -> None:
        self.exposures.append((until, set()))
        self._note_exposed(self.masters())

    def dispatch_slowed(self, digest: str) -> None:
        """A slow link delayed the WORK or the RESULT of a dispatch of `digest`. It is not
        one failure but one per dispatch across it: each may miss the watchdog's deadline,
        and a timeout is a suspicion that runs the input again (F317 §6; W5: the first
        requeues it, the next defers it, and --resume runs what was deferred). A link slower
        than the deadline times out every dispatch of an input that lands on it again (a
        slow master's: every dispatch); the fault's own window counts only one of them."""
        self.slowed[digest] += 1

    def work_sent(self, process: Process, dest: int, sent: bool) -> None:
        """Inside a WORK send to `dest` (world.SimComm.Isend; `sent`: it went out, else it
        raised): the dispatch it is of, read from the coordinator sending it, and that work's
        dispatch count before this send may count. Judged after the turn (_check_sends): a
        violation raised here would meet the session code's own exception handling."""
        frame = sys._getframe(1)
        while frame is not None:
            coordinator = frame.f_locals.get("self")
            if isinstance(coordinator, DispatchCoordinator):
                break
            frame = frame.f_back
        else:
            return
        tx = coordinator.tables.get(Table.PREPARING, dest)
        count = _dispatch_count(coordinator.source, tx.work_id) if tx is not None else 0
        self.sends.append((coordinator, dest, tx, sent, count,
                           coordinator.tables._counts["sent"]))
        if sent and tx is not None and parse_work_id(tx.work_id)[1] not in (None, TRACE):
            self.group_sends[coordinator] += 1

    def message_received(self, process: Process, group, source: int, tag: int,
                         payload: bytes) -> None:
        """A READY or RESULT received in the turn under way (only the running rank
        receives)."""
        self.received.append((group, source, tag, payload))

    def _note_exposed(self, masters: list) -> None:
        now = self.simulation.scheduler.now
        open_windows = [seen for until, seen in self.exposures if now <= until]
        if not open_windows:
            return
        in_flight = _dispatched(masters)
        for seen in open_windows:
            seen |= in_flight

    def no_traceback(self) -> None:
        if self.tracebacks.seen:
            self._fail(f"a rank logged a traceback: {self.tracebacks.seen[0]}")

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
        for table, tx in tables.transactions():
            if tx.state.value != table.value:
                self._fail(f"F313: rank {tx.worker}'s transaction is {tx.state.value} in the "
                           f"{table.value} table")
            if table is not Table.ACTIVE and tx.expired(float("inf"), 1e-9):
                self._fail(f"F317 W1: a {table.value} transaction of rank {tx.worker} has a "
                           "deadline")
        self._count("F317 W1 only active dispatches have a deadline, in their table's state")

    def _check_sends(self, masters: list, sends: list[tuple]) -> None:
        """F313 D3: a WORK send that raised is undone exactly (rolled back before the send:
        closed with no send time, in no table) and counts no dispatch: from the turn of its
        first send to the next check with its master at rest (a stalled write may hold the
        rollback up for turns: seed 3047), the coordinator's dispatches and each work's
        dispatch count grew by the sends that went out, and by no send that failed."""
        alive = {master.dispatch: master for master in masters}
        turn = self.unjudged_sends
        for coordinator, dest, tx, sent, count, sent_before in sends:
            if coordinator not in alive:
                continue  # its master died in the turn
            if tx is None:
                self._fail(f"F313 D2: a WORK went to rank {dest} with no dispatch preparing")
            before, went, failed = turn.setdefault(coordinator, ({}, Counter(), []))
            before.setdefault(tx.work_id, count)
            before.setdefault("", sent_before)
            if sent:
                went[tx.work_id] += 1
            else:
                failed.append(tx)
        for coordinator in list(turn):
            master = alive.get(coordinator)
            if master is not None and not self._at_rest(master):
                continue
            before, went, failed = turn.pop(coordinator)
            if master is None or not failed:
                continue
            for tx in failed:
                if tx.state is not ROLLED_BACK or tx._dispatched_at is not None \
                        or coordinator.holds_token(tx.token):
                    self._fail(f"F313 D3: rank {tx.worker}'s WORK send of {tx.work_id[:12]} "
                               f"failed, and its dispatch is {tx.state.value}, not rolled back "
                               "before the send")
            sent_before = before.pop("")
            for work, count in before.items():
                expected = count + went[work]
                now = _dispatch_count(coordinator.source, work)
                if now != (min(3, expected) if parse_work_id(work)[1] is None else expected):
                    self._fail(f"F313 D3: {work[:12]} went out {went[work]} times in the turn, "
                               f"with a send that failed, and its dispatch count went from "
                               f"{count} to {now}")
            if coordinator.tables._counts["sent"] - sent_before != sum(went.values()):
                self._fail(f"F313 D3: {sum(went.values())} WORK sends went out in the turn "
                           f"and {len(failed)} failed, and the master counted "
                           f"{coordinator.tables._counts['sent'] - sent_before} dispatches")
            self._count("F313 D3 a failed send is undone exactly and counts no dispatch")

    def _check_transitions(self, master, received, sends) -> None:
        """The master's dispatches between two checks: each still in a table can give its
        input back (D2) and was sent on the master's monotonic clock (W2); each that left
        them left committed once its work was done (D6), or compensated (D8); each rank
        parked since was parked by a timeout of exactly its active dispatch (W2-W5, W9), each
        unparked by a READY of exactly its retired token (W7, W10), and a parked rank's late
        RESULT is stale (W8). `received`: the READY and RESULT messages of its turn;
        `sends`: the turn's WORK sends."""
        dispatch = master.dispatch
        now = self.simulation.scheduler.now
        transactions = {}
        for table, tx in dispatch.tables.transactions():
            transactions[tx.token] = (table, tx)
            if not any(step.resource == FRONTIER_ENTRY for step in tx._stack):
                self._fail(f"F313 D2: rank {tx.worker}'s dispatch of {tx.work_id[:12]} is "
                           f"{table.value} with no compensation for its frontier entry")
            if tx._dispatched_at is not None and tx._dispatched_at > now:
                self._fail(f"F317 W2: rank {tx.worker}'s dispatch was sent at "
                           f"{tx._dispatched_at:.3f}, after the master's monotonic now "
                           f"{now:.3f}")
        self._count("F313 D2 every dispatch in a table can give its input back")
        source = dispatch.source
        # A group is counted when taken, its WORK sent after the dispatch record's write,
        # which a stalled disk may leave for a later turn: judged at rest.
        if source.stats.split_dispatches != self.group_sends[dispatch] \
                and self._at_rest(master):
            self._fail(f"F313 D4: {self.group_sends[dispatch]} group WORKs went out, and the "
                       f"master counts {source.stats.split_dispatches} group dispatches")
        gate, watchdog = dispatch.gate, dispatch.watchdog
        state = _Seen(master.generation, transactions, dict(gate._parked), gate._counts["parks"],
                      watchdog._counts["timeouts"], gate._counts["recoveries"],
                      watchdog._counts["stale_results"])
        seen = self.seen.get(master)
        self.seen[master] = state
        if seen is None or seen.generation != state.generation:
            self.late.pop(master, None)
            self.readies.pop(master, None)
            self.parks.pop(master, None)
            return  # a new generation numbers the ranks anew: nothing carries over
        for token, (_, tx) in seen.transactions.items():
            if token not in transactions:
                self._left(master, tx)
        comm_group = getattr(master.channel.comm, "group", None)
        messages = [(source_rank, tag, payload) for group, source_rank, tag, payload in received
                    if group is comm_group]
        parked = state.parked
        timeouts = {r: t for r, t in parked.items() if seen.parked.get(r) != t}
        recovered = {r: t for r, t in seen.parked.items() if parked.get(r) != t}
        if timeouts:  # the dispatches sent in the turn too: a sweep may be wrong at once
            sent = {tx.token: (Table.ACTIVE, tx) for coordinator, _, tx, went, *_ in sends
                    if went and tx is not None and coordinator is dispatch}
            sent.update(seen.transactions)
            for rank, token in timeouts.items():
                self._judge_timeout(master, sent, transactions, rank, token, messages)
        # A READY received is joined in the same round, which a stalled write may leave for
        # a later turn: those received since the master was last at rest count.
        readies = self.readies.setdefault(master, set())
        readies.update((source_rank, _token(payload)) for source_rank, tag, payload in messages
                       if tag == READY)
        for rank, token in recovered.items():
            if (rank, token) not in readies:
                self._fail(f"F317 W7: parked rank {rank} was unparked without a READY of its "
                           f"retired token {token[:12]}")
            self._count("F317 W7/W10 only a READY of the retired token unparks a rank")
        if self._at_rest(master):
            readies.clear()
        # A sweep parks a rank, then rolls its dispatch back and counts the timeout; a
        # stalled write in between leaves the count for a later turn: judged at rest. A
        # rank may be parked and unparked within one turn (rounds run on while messages
        # wait), so unparks are what the parks since take to leave `parked` as it is.
        parks, unparks, since = self.parks.pop(master, (0, 0, seen))
        parked_in_turn = state.parks - seen.parks
        parks += parked_in_turn
        unparks += len(seen.parked) + parked_in_turn - len(parked)
        if parks or unparks:
            if not self._at_rest(master):
                self.parks[master] = (parks, unparks, since)
            else:
                if (state.timeouts - since.timeouts, state.recoveries - since.recoveries) != \
                        (parks, unparks):
                    self._fail(f"F317 W9: {parks} ranks parked and {unparks} recovered, and "
                               f"the figures count {state.timeouts - since.timeouts} timeouts "
                               f"and {state.recoveries - since.recoveries} recoveries")
                self._count("F317 W9 every timeout and every parked rank's recovery is counted")
        late = 0
        for source_rank, tag, payload in messages:
            retired = (seen.parked.get(source_rank), parked.get(source_rank))
            if tag != RESULT or retired == (None, None) or _token(payload) not in retired:
                continue
            late += 1
            token = _token(payload)
            self.void.add(token)
            if token in transactions:
                self._fail(f"F317 W8: the late RESULT {token[:12]} of parked rank "
                           f"{source_rank} holds a dispatch")
        # A RESULT received is classified in the same round, which a stalled write may
        # leave for a later turn: judged once the master is at rest.
        count, since = self.late.pop(master, (0, seen.stale_results))
        if count + late:
            if not self._at_rest(master):
                self.late[master] = (count + late, since)
                return
            if state.stale_results - since < count + late:
                self._fail(f"F317 W8: {count + late} late RESULTs of parked ranks, "
                           f"{state.stale_results - since} found stale")
            self._count("F317 W8 a parked rank's late RESULT is stale and commits nothing")

    def _left(self, master, tx: DispatchTransaction) -> None:
        """`tx` left the master's tables since the last check."""
        if tx.state is COMMITTED:
            source = master.dispatch.source
            if not source.is_done(tx.work_id) or tx.work_id in source.in_flight:
                self._fail(f"F313 D6: rank {tx.worker}'s dispatch of {tx.work_id[:12]} "
                           "dropped its compensations, and its work is not done or its "
                           "targets not released")
            self.commits.append((master, tx))
        elif tx.state is ROLLED_BACK:
            if tx._dispatched_at is not None:
                self.void.add(tx.token)
                if parse_work_id(tx.work_id)[1] is None \
                        and _dispatch_count(master.dispatch.source, tx.work_id) < 1:
                    self._fail(f"F313 D4: {tx.work_id[:12]} was discarded after its send, and "
                               "its dispatch no longer counts")
                self._count(D4)
        else:
            self._fail(f"F313 D8: rank {tx.worker}'s dispatch of {tx.work_id[:12]} left the "
                       f"tables {tx.state.value}, neither committed nor compensated")

    def _check_commits_recorded(self) -> None:
        """F313 D6, triage: a dispatch committed has its done (or part) record, on disk or
        waiting for the group commit."""
        commits, self.commits = self.commits, []
        for master, tx in commits:
            self._count("F313 D6 compensations are dropped once the work is done")
            if tx.token in self.recorded:
                continue
            if not any(record.get("token") == tx.token
                       for record in master.campaign.journal._pending):
                self._fail(f"F313 D6: rank {tx.worker}'s dispatch of {tx.work_id[:12]} dropped "
                           "its compensations with no done record")

    def _judge_timeout(self, master, before: dict, transactions: dict, rank: int,
                       token: str, messages: list) -> None:
        """The watchdog parked `rank` on `token` since the last check; `before`: the
        dispatches (by token) in the tables then, and those sent since."""
        previous = before.get(token)
        if previous is None or previous[1].worker != rank or previous[0] is not Table.ACTIVE:
            self._fail(f"F317 W4: rank {rank} was parked on {token[:12]}, which was not its "
                       "active dispatch")
        tx = previous[1]
        dispatch = master.dispatch
        deadline = tx.deadline(dispatch.watchdog.seconds)
        if deadline is None or self.simulation.scheduler.now < deadline:
            self._fail(f"F317 W2: rank {rank}'s dispatch timed out at "
                       f"{self.simulation.scheduler.now:.3f} on the master's monotonic clock, "
                       f"before its deadline {deadline or 0:.3f}")
        self._count("F317 W2 a deadline counts on the master's monotonic clock")
        if token in transactions or tx.state is not ROLLED_BACK or tx._dispatched_at is None:
            self._fail(f"F317 W4: rank {rank} timed out, and its dispatch {token[:12]} is "
                       f"{tx.state.value}, not discarded after its send")
        self._count("F317 W4 a timeout discards exactly the rank's active dispatch")
        for source_rank, tag, payload in messages:
            if source_rank == rank and _token(payload) == token:
                self._fail(f"F317 W3: rank {rank}'s dispatch {token[:12]} timed out in the "
                           f"round that received its {'READY' if tag == READY else 'RESULT'}")
        self._count("F317 W3 no timeout of a dispatch whose RESULT or READY came")
        recovery, source, work = dispatch.recovery, dispatch.source, tx.work_id
        if recovery.failures(work) < 1 or token in recovery._failures:
            self._fail(f"F317 W5: the timeout of {work[:12]} counts a failure under its token, "
                       "not its work")
        digest = parse_work_id(work)[0]
        if not (work in recovery.deferred() or source.is_done(work) or _waiting(source, work)
                or any(_same_frontier_entry(other.work_id, work)
                       for _, other in transactions.values())
                or (master.federation is not None and not master.federation.holds(digest))):
            self._fail(f"F317 W5: {work[:12]} timed out and is neither waiting, in flight, "
                       "done nor deferred")
        self._count("F317 W5 a timed-out work goes back by its work id")

    def _check_at_rest(self, master) -> None:
        """F313 D8: preparing and committing end, or are swept by their exception boundary,
        within the step that began them: a master at rest holds only dispatches sent."""
        for table, tx in master.dispatch.tables.transactions():
            if table is not Table.ACTIVE:
                self._fail(f"F313 D8: the master is at rest with rank {tx.worker}'s dispatch of "
                           f"{tx.work_id[:12]} {table.value}")
        self._count("F313 D8 a master at rest holds no dispatch preparing or committing")

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
            worker = self.role_of(process)
            if not process.alive or not isinstance(worker, Worker) \
                    or worker.generation != master.generation:
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
        """Nothing committed twice: a work id has at most one done record over every
        master's journal, and each done record's RESULT is of its WORK's generation
        (F443 §3)."""
        paths = done_journals(self.out)
        sizes = tuple(_size(path) for path in paths)
        if sizes == self.journal_sizes:
            return
        self.journal_sizes = sizes
        records = [record for path in paths for record in self._read_journal(path)]
        done = Counter(_work_id(r) for r in records if "kind" not in r)
        twice = [work for work, n in done.items() if n > 1]
        if twice:
            self._fail(f"committed twice: {twice[0][:12]} has {done[twice[0]]} done records")
        sent = self.simulation.scheduler.works
        for record in records:
            if record.get("kind", "part") == "part":
                self.recorded.add(record.get("token"))
            if "kind" in record or record.get("token") in self.judged:
                continue
            self.judged.add(record.get("token"))
            if record.get("token") in self.void:
                self._fail(f"F313 D4: {record['digest'][:12]} committed from a RESULT whose "
                           "dispatch was discarded")
            self._count(D4)
            generation = sent.get(record.get("token"))
            if generation is not None and generation != record.get("generation", 0):
                self._fail(f"F443: {record['digest'][:12]} committed from a RESULT of "
                           f"generation {record.get('generation', 0)} for a WORK of "
                           f"generation {generation}")
        self.records = records
        self.done = done
        self._count("nothing committed twice")
        self._count("F443 a RESULT commits only in its own generation")

    def _read_journal(self, path: Path) -> list[dict]:
        """The records of the journal at `path`, decoded on from where the last reading
        stopped while the file only grew (a power failure cuts it, a repair rewrites it:
        then from its start)."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raw = b""
        read = self.journals_read.get(path)
        if read is None or not raw.startswith(read.data):
            read = self.journals_read[path] = _JournalRead()
        if len(raw) > len(read.data):
            records, torn = CampaignDir(self.out).inspect_journal(
                path, after=(len(read.data), read.lines))
            end = raw.rfind(b"\n") + 1
            if torn is not None and end == len(raw):  # the torn line has its newline
                end = raw.rfind(b"\n", 0, end - 1) + 1
            read.lines += raw.count(b"\n", len(read.data), end)
            read.data = raw[:end]
            read.records += records
        return read.records

    def _check_pruning(self) -> None:
        """QSYM pruning (pruning.py): a run skips a branch only if the campaign has its child
        (in corpus/, or set aside by triage as adding no coverage). Bits of a run whose
        RESULT was dropped would prune the run that redoes it, and lose its children."""
        runs, self.pruned_runs = self.pruned_runs, []
        schedule = self.simulation.schedule
        corpus = set(os.listdir(self.out / "corpus"))
        covered = None
        for data, skipped in runs:
            for branch, child in branches_of(data, fanout=schedule.fanout, depth=schedule.depth,
                                             space=schedule.space):
                if branch not in skipped or child is None:
                    continue
                digest = hashlib.sha256(child).hexdigest()
                if digest in corpus:
                    continue
                if schedule.triage:
                    if covered is None:
                        inputs = self.simulation.inputs()
                        covered = {pair for d in corpus if d in inputs
                                   for pair in coverage_of(inputs[d]).pairs()}
                    if covered.issuperset(coverage_of(child).pairs()):
                        continue
                self._fail(f"QSYM pruning: a run of {hashlib.sha256(data).hexdigest()[:12]} "
                           f"skipped branch {branch}, whose child {digest[:12]} the campaign "
                           "does not have")
        self._count("QSYM pruning skips only branches whose child the campaign has")

    def _check_corpus(self) -> None:
        """Every corpus file is named by the SHA-256 of its bytes."""
        try:
            names = os.listdir(self.out / "corpus")
        except FileNotFoundError:
            return
        if len(names) != self.corpus_listed or self.damaged:  # files are only ever added
            self.corpus_listed = len(names)
            for name in names:
                if name in self.corpus_seen or name.startswith("."):
                    continue
                digest = hashlib.sha256((self.out / "corpus" / name).read_bytes()).hexdigest()
                if name in self.damaged:
                    if digest != name:
                        continue  # not repaired yet
                    self.damaged.discard(name)
                if digest != name:
                    self._fail(f"corpus/{name[:12]} holds bytes whose SHA-256 is "
                               f"{digest[:12]}")
                self.corpus_seen.add(name)
        self._count("every corpus file is named by its content")

    def _check_single_winner(self, masters: list) -> None:
        """F320: no input is being committed by two masters at once (a paused master may
        still hold in flight what another took over at its lease's expiry; its commit is
        fenced)."""
        owner: dict[str, int] = {}
        for master in masters:
            for table, tx in master.dispatch.tables.transactions():
                if table is not Table.COMMITTING:
                    continue
                digest = tx.work_id.split("#")[0]
                other = owner.setdefault(digest, master.federation.index)
                if other != master.federation.index:
                    self._fail(f"F320: {digest[:12]} is being committed by masters {other} "
                               f"and {master.federation.index}")
        self._count("F320 one master commits an input")

    def _check_quiescence(self, masters: list) -> None:
        """F320 §2.5: once the masters decided the frontier is exhausted, no master has an
        input of its own waiting or in flight."""
        if not any(master.federation.done for master in masters):
            return
        for master in masters:
            federation = master.federation
            if master.dispatch.in_flight:
                self._fail(f"F320: quiescence decided while master {federation.index} has "
                           f"{master.dispatch.in_flight} inputs in flight")
            waiting = [d for d in master.frontier.pending
                       if d in federation.held or federation.owns(d)]
            if waiting:
                self._fail(f"F320: quiescence decided while master {federation.index} has "
                           f"{waiting[0][:12]} waiting")
        self._count("F320 quiescence only when no master has work")

    def _check_leases_kept(self, master) -> None:
        """F320 with F313 D5: every input a master holds the lease of is waiting, in flight,
        analysed or set aside there (a lease held for nothing blocks the input until it
        expires, and its master never runs it)."""
        frontier = master.frontier
        pending = None
        held = None
        for digest in master.federation.held:
            if digest in frontier.done or digest in master.dispatch.unreadable:
                continue
            if pending is None:
                pending = set(frontier.pending)
                held = _held(master)
            if digest not in pending and digest not in held:
                self._fail(f"F313 D5: master {master.federation.index} holds the lease of "
                           f"{digest[:12]}, which is neither waiting, in flight, analysed nor "
                           "set aside there")
        self._count("F320/F313 D5 a held lease is for work the master has")

    def _check_nothing_lost(self, master) -> None:
        """Every input in the corpus is analysed, waiting, in flight or set aside."""
        frontier = master.frontier
        pending = set(frontier.pending)
        held = _held(master)
        for digest in self.corpus_seen:
            if digest in frontier.done or digest in pending or digest in held \
                    or digest in master.dispatch.unreadable:
                continue
            self._fail(f"lost: {digest[:12]} is in the corpus but neither analysed, waiting, "
                       "in flight nor set aside")
        self._count("nothing lost")

    # -- the finished campaign -----------------------------------------------------------

    def deferred(self) -> set[str]:
        paths = [self.out / "state" / DEFERRED_JOURNAL_NAME,
                 *(p.parent / DEFERRED_JOURNAL_NAME for p in done_journals(self.out))]
        return {w.split("#")[0] for p in set(paths) for w in _read_deferred(p)[0]}

    def kept(self) -> set[str] | None:
        """With triage, the children it kept (published in corpus/): the others, set aside,
        need no run. None: every child is kept."""
        if not self.simulation.schedule.triage:
            return None
        corpus = self.out / "corpus"
        return set(os.listdir(corpus)) if corpus.is_dir() else set()

    def required(self) -> set[str]:
        """What the campaign must analyse or set aside by now."""
        return self.simulation.reachable(self.deferred(), self.kept())

    def campaign_complete(self) -> bool:
        self.journal_sizes = ()
        self._check_journal()
        return self.required() <= set(self.done) | self.deferred()

    def final(self) -> None:
        self.corpus_listed = -1
        self._check_corpus()
        if self.damaged & set(os.listdir(self.out / "corpus")):
            self._fail(f"corpus/{min(self.damaged)[:12]} is still without its bytes, as a "
                       "power failure left it")
        self._count("a power failure's damage is repaired")
        problems, facts = verify_campaign(self.out)
        if problems:
            self._fail(f"verify: {problems[0]}")
        self._count("verify's oracles over the finished campaign")
        # A deferred input ran at least once, and what its run published before it failed
        # stays: its children may be analysed, but need not be.
        deferred = self.deferred()
        required = self.required() - deferred
        analysed = set(self.done)
        unknown = sorted(analysed - self.simulation.reachable())
        if unknown:
            self._fail(f"analysed {unknown[0][:12]}, which no execution generates")
        missing = sorted(required - analysed)
        if missing:
            self._fail(f"{len(missing)} reachable inputs never analysed nor set aside, e.g. "
                       f"{missing[0][:12]}")
        self._count("every reachable input analysed or set aside, and no other")
        if self.simulation.schedule.triage:
            self._check_triage(analysed)
        self._check_reexecution()

    def _check_triage(self, analysed: set[str]) -> None:
        """Triage set aside only children that add no coverage: every edge of each child of
        an analysed input is an edge of an input corpus/ holds (the masters' maps merged)."""
        schedule, kept = self.simulation.schedule, self.kept()
        inputs = self.simulation.inputs()
        covered = set()
        for digest in kept:
            if digest in inputs:
                covered.update(coverage_of(inputs[digest]).pairs())
        for digest in sorted(analysed):
            for child in children_of(inputs[digest], fanout=schedule.fanout,
                                     depth=schedule.depth, space=schedule.space):
                beyond = set(coverage_of(child).pairs()) - covered
                if beyond:
                    self._fail(f"triage set aside {hashlib.sha256(child).hexdigest()[:12]}, "
                               f"a child of {digest[:12]}, which adds edge {min(beyond)[0]}")
        self._count("triage sets aside only children that add no coverage")

    def _check_reexecution(self) -> None:
        """An input runs again only if it was in flight when something failed: once more
        per master for each fault that found it in flight (a paused master's watchdog takes
        it back, another master takes its lease over; a slow link finds each dispatch it
        delays), and with one master (F443 §3) each extra run declared by a requeue record
        or by the takeover of a dead master."""
        exposed = Counter(d for _, seen in self.exposures for d in seen) + self.slowed
        masters = self.simulation.schedule.masters
        runs_of = [(work.split("#")[0], runs)  # a part of a split input runs as its input
                   for work, runs in self.simulation.executions.items()]
        for digest, runs in runs_of:
            if runs > 1 + masters * exposed[digest]:
                self._fail(f"{digest[:12]} ran {runs} times, in flight at "
                           f"{exposed[digest]} faults")
        self._count("only work in flight at a failure runs again")
        if self.simulation.schedule.masters > 1:
            return
        requeued = _declared(self.records)
        for digest, runs in runs_of:
            allowed = 1 + requeued[digest] + self.forgotten[digest]
            if runs > allowed:
                self._fail(f"{digest[:12]} ran {runs} times with {requeued[digest]} declared "
                           "re-dispatches")
        self._count("F443 every re-dispatch is declared")


@dataclass
class _JournalRead:
    """A done journal as far as the checker decoded it: its whole lines, their records."""

    data: bytes = b""
    lines: int = 0
    records: list[dict] = field(default_factory=list)


@dataclass
class _Seen:
    """A master's dispatch state as of a check: what the next turn is judged against."""

    generation: int
    transactions: dict[str, tuple[Table, DispatchTransaction]]  # by token
    parked: dict[int, str]  # rank -> retired token
    parks: int  # the gate's parks, each the insertion of a rank into `parked`
    timeouts: int  # the figures' watchdog timeouts
    recoveries: int  # the figures' parked ranks recovered
    stale_results: int


def _dispatch_count(source: WorkSource, work_id: str) -> int:
    """How many dispatches of `work_id` the master counts (an input's: 0..3)."""
    digest, part = parse_work_id(work_id)
    if part is not None:
        return source.dispatches[work_id]
    frontier = source.frontier
    entry = frontier._find(digest)
    return 0 if entry < 0 else (frontier._table.flags(entry) >> _SENT_SHIFT) & 3


def _waiting(source: WorkSource, work_id: str) -> bool:
    digest, part = parse_work_id(work_id)
    if part is None or part == TRACE:
        return any(pending == digest for pending in source.frontier.pending.head())
    return work_id in source.waiting


def _same_frontier_entry(work_id: str, other: str) -> bool:
    """Whether the two are the same work, or go out of the same frontier entry: an input
    requeued whole may go out again as its trace, and a trace whole (WorkSource.peek)."""
    if work_id == other:
        return True
    (digest, part), (other_digest, other_part) = parse_work_id(work_id), parse_work_id(other)
    return digest == other_digest and part in (None, TRACE) and other_part in (None, TRACE)


def _token(payload: bytes) -> str | None:
    try:
        message = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError:
        return None
    return message.get("token") if isinstance(message, dict) else None


def _dispatched(masters: list) -> set[str]:
    """The inputs `masters` have in their transaction tables."""
    return {tx.work_id.split("#")[0] for master in masters
            for _, tx in master.dispatch.tables.transactions()}


def _held(master) -> set[str]:
    """The inputs `master` has in flight, set aside, or split with parts still to commit."""
    return {tx.work_id.split("#")[0] for _, tx in master.dispatch.tables.transactions()} \
        | {w.split("#")[0] for w in master.dispatch.recovery.deferred()} \
        | set(master.split.open)


def _declared(records: list[dict]) -> Counter[str]:
    """Per input, the re-dispatches the journal's records declare."""
    requeued = Counter()
    for record in records:
        if record.get("kind") == "requeue":
            requeued[record["digest"]] += 1
        elif record.get("kind") == "recovered":
            for work in record.get("requeued", ()):
                requeued[work.split("#")[0]] += 1
    return requeued


def _stop_reason(out: Path) -> str:
    try:
        return json.loads((out / "stats.json").read_text())["extra"]["stop_reason"]
    except (OSError, ValueError, KeyError):
        return ""


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return -1


def _work_id(record: dict) -> str:
    return record["digest"] if record.get("part") is None else \
        f"{record['digest']}#{record['part']}"

