"""The simulated world the real session code runs in: virtual time, ranks as greenlets, MPI
communicators with ULFM's failure semantics, the doorbell, and a deterministic executor.

One OS process hosts every rank. A rank runs `session.run_rank` (the code of a real rank)
on a `SimHost`; it gives control back to the scheduler only where a real rank would wait:
`SYSTEM_CLOCK.sleep` (its naps and polls), a collective, the doorbell. The scheduler wakes
the rank whose wake-up comes first in virtual time (ties broken by the schedule's random
stream), so a run is a function of its schedule alone.

What MPI guarantees and nothing more: one sender's messages to one receiver arrive in the
order sent (every receive here matches any tag), after a delay the schedule draws; which
sender a receive from anyone matches is the schedule's choice. A dead rank's messages not
yet delivered may be lost. Under ULFM a probe or send that involves a dead rank, or a
revoked communicator, raises the error class a real one would.
"""

from __future__ import annotations

import errno
import hashlib
import heapq
import os
import random
import weakref
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import greenlet
import msgspec
from mpi4py import MPI

from symcc_mpi.campaign.layout import LEASE_DIRECTORY_PREFIX
from symcc_mpi.coverage.edges import FileCoverage
from symcc_mpi.executors.base import ExecutionResult, Outcome
from symcc_mpi.roles.host import Host
from symcc_mpi.ulfm.capability import Decision
from symcc_mpi.ulfm.generations import GENERATIONS_JOURNAL
from symcc_mpi.wire.protocol import Tag

WALL_START = 1_800_000_000.0  # the virtual wall clock's reading at virtual monotonic 0
MIN_NAP = 1e-6  # a sleep of 0 still lets the others run
READY = int(Tag.READY)
RESULT = int(Tag.RESULT)
WORK = int(Tag.WORK)
FD_DIRECTORY = "/proc/self/fd"
LEASES = "leases"
COMMITTING = "committing"  # armed: waits for a commit's fence
IN_COMMIT = "in-commit"  # past the fence: strikes the commit's first child published


class JobAborted(BaseException):
    """MPI_Abort: every rank of the job ends at once."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


class Killed(BaseException):
    """Thrown into a dead rank's greenlet when the simulation ends, to free it."""


@dataclass(eq=False)
class Process:
    """One simulated rank: an OS process of the job."""

    index: int  # its rank in the job's world
    name: str  # its endpoint (ulfm.runtime.endpoint)
    machine: int = 0  # the machine it runs on: its death takes what it had not synced
    alive: bool = True
    finished: bool = False
    status: int | None = None  # run_rank's return value
    error: BaseException | None = None
    glet: greenlet.greenlet | None = None
    wake_seq: int = 0  # the wake-up that counts; earlier ones in the heap are stale
    busy_until: float = 0.0  # executing until then: no message leaves, no wake-up before
    paused_until: float = 0.0  # stopped (SIGSTOP) until then
    doorbell: SimDoorbell | None = None
    rang: bool = False
    waiting_for_ring: bool = False
    files: set[int] = field(default_factory=set)  # descriptors it opened and holds open
    disk_fault: tuple | None = None  # what its next durable write or fsync meets (SimDisk)
    watched: bool = True  # its turns may open files (a worker's idle polls do not)


@dataclass(eq=False)
class Message:
    source: Process
    dest: Process
    tag: int
    payload: bytes
    deliver_at: float


class Scheduler:
    """Virtual time and the ranks' turns. It is also the clock source (SYSTEM_CLOCK.source)."""

    def __init__(self, rng: random.Random, *, delays: tuple[float, float]):
        self.rng = rng
        self.delays = delays  # message delay bounds, seconds
        self.now = 0.0
        self.wall_offset = WALL_START
        self.heap: list[tuple[float, float, int, int]] = []
        self.processes: list[Process] = []
        self.current: Process | None = None
        self.main = greenlet.getcurrent()
        self.steps = 0
        self.aborted: int | None = None
        self.link_until: dict[tuple[int, int], float] = {}  # FIFO per (source, dest)
        self.slow: dict[int, float] = {}  # extra delay on a process's outgoing messages
        self.activity = False  # this turn sent, received or joined something
        self.descriptors = _open_descriptors()
        self.orphaned: set[int] = set()  # dead ranks' descriptors, each left on /dev/null
        self.works: dict[str, int] = {}  # token -> generation, of every WORK sent
        self.stale_results: set[int] = set()  # processes whose next RESULT lags a generation
        self.send_errors: dict[int, int] = {}  # process -> WORK sends still to fail
        # Called when a fault planned earlier strikes (a write, a send), with how long its
        # effect lasts: the simulation widens the window of work it may disturb.
        self.struck = lambda seconds: None
        # Called with the input of each WORK or RESULT a slow link delays: the dispatch it
        # belongs to is struck, each dispatch over the link anew.
        self.slowed = lambda digest: None
        # Called inside each WORK send, with its sender and destination rank and whether
        # it went out (False: it raised): the checker reads the dispatch being sent.
        self.work_sent = lambda process, dest, sent: None
        # Called with each READY or RESULT a rank receives (its process, the communicator's
        # group, the source rank, the tag and the payload).
        self.received = lambda process, group, source, tag, payload: None

    # -- the clock source ----------------------------------------------------------------

    def time(self) -> float:
        return self.wall_offset + self.now

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        process = self.current
        if process is None:  # outside any rank (set-up): time just passes
            self.now += max(seconds, 0.0)
            return
        self.wake(process, self.now + max(seconds, MIN_NAP))
        self.park()

    # -- turns ---------------------------------------------------------------------------

    def spawn(self, process: Process, body) -> None:
        self.processes.append(process)
        process.glet = greenlet.greenlet(body, parent=self.main)
        self.wake(process, self.now)

    def wake(self, process: Process, at: float) -> None:
        at = max(at, process.busy_until, process.paused_until)
        process.wake_seq += 1
        heapq.heappush(self.heap, (at, self.rng.random(), process.wake_seq, process.index))

    def park(self) -> None:
        """Give the turn back; returns when the scheduler wakes this rank again."""
        self.main.switch()

    def next_turn(self) -> Process | None:
        """Advance virtual time to the next wake-up and return its rank (None: no one left)."""
        while self.heap:
            at, _, seq, index = heapq.heappop(self.heap)
            process = self.processes[index]
            if not process.alive or process.finished or seq != process.wake_seq:
                continue
            self.now = max(self.now, at)
            return process
        return None

    def run_turn(self, process: Process) -> None:
        self.current = process
        self.activity = False
        try:
            returned = process.glet.switch()
        finally:
            self.current = None
            if process.watched or self.activity:
                self._note_files(process)
        self.steps += 1
        if process.glet.dead and process.alive:
            process.finished = True
            process.status = returned

    def _note_files(self, process: Process) -> None:
        """Which rank holds which descriptor, so that its death closes them as the kernel
        would (releasing its flock on the campaign, for one)."""
        now_open = _open_descriptors()
        for name in now_open - self.descriptors:
            process.files.add(int(name))
        for name in self.descriptors - now_open:
            for other in self.processes:
                other.files.discard(int(name))
        self.descriptors = now_open

    # -- faults --------------------------------------------------------------------------

    def kill(self, process: Process) -> None:
        """SIGKILL: the rank never runs again; no `finally` of its runs now."""
        if not process.alive or (process.finished and not process.files):
            return
        if process is self.current:  # killed inside its turn: what it opened so far too
            self._note_files(process)
        process.alive = False
        if process.files:
            # Closed as the kernel closes a dead process's files; the numbers stay taken
            # (by /dev/null) so that its objects, freed later, close nothing of another's.
            null = os.open(os.devnull, os.O_RDWR)
            for fd in process.files:
                os.dup2(null, fd)
            os.close(null)
            self.orphaned |= process.files
            process.files.clear()
        for group in list(Group.every):
            if process in group.members:
                group.member_died()

    def pause(self, process: Process, seconds: float) -> None:
        """SIGSTOP for `seconds`: no turn and no message leaves it until then."""
        process.paused_until = max(process.paused_until, self.now + seconds)
        self.wake(process, process.paused_until)

    def abort(self, status: int) -> None:
        """MPI_Abort: every rank of the job is killed."""
        self.aborted = status
        for process in self.processes:
            self.kill(process)
        raise JobAborted(status)

    # -- messages ------------------------------------------------------------------------

    def deliver_time(self, source: Process, dest: Process) -> float:
        low, high = self.delays
        at = max(self.now, source.busy_until, source.paused_until) + self.rng.uniform(low, high)
        at += self.slow.get(source.index, 0.0)
        key = (source.index, dest.index)
        at = max(at, self.link_until.get(key, 0.0))  # never overtakes an earlier message
        self.link_until[key] = at
        return at

    def free(self) -> None:
        """End every greenlet still parked (dead ranks, a job that ran out of time)."""
        for process in self.processes:
            if process.glet is not None and not process.glet.dead:
                try:
                    process.glet.throw(Killed())
                except (Killed, greenlet.GreenletExit):
                    pass
                except BaseException:  # noqa: BLE001 - a dead rank's unwinding is not judged
                    pass


def close_orphaned(descriptors: set[int]) -> None:
    """Close what dead ranks held, once nothing of theirs is left (their objects collected:
    a finalizer may close its own descriptor): a raw descriptor is not closed when its
    object is freed, and every schedule leaking a few made each turn's descriptor listing
    slower (a run of 1000 took twice as long)."""
    null = os.stat(os.devnull)
    finalized = {info.args[0] for info in weakref.finalize._registry.values()  # noqa: SLF001
                 if info.func is os.close and info.args}  # still to be closed by their own
    for fd in descriptors - finalized:
        try:
            held = os.fstat(fd)
        except OSError:
            continue
        if (held.st_dev, held.st_ino) == (null.st_dev, null.st_ino):
            os.close(fd)


# -- communicators -------------------------------------------------------------------------


def _open_descriptors() -> set[str]:
    """This process's open file descriptors (not the one the listing itself used)."""
    lowest_free = os.open(os.devnull, os.O_RDONLY)
    os.close(lowest_free)
    listed = set(os.listdir(FD_DIRECTORY))
    try:
        os.fstat(lowest_free)
    except OSError:  # the listing's own, closed now: it took the lowest free number
        listed.discard(str(lowest_free))
        return listed
    # Another thread took that number first: each listed descriptor is asked (one fstat
    # each, which is what the lowest free number spares after every turn).
    open_now = set()
    for name in listed:
        try:
            os.fstat(int(name))
        except OSError:
            continue
        open_now.add(name)
    return open_now


class Slot:
    """One collective call: every member's contribution, then the outcome."""

    def __init__(self, kind: str):
        self.kind = kind
        self.arrived: dict[int, object] = {}
        self.done = False
        self.outcome: dict[int, object] = {}  # per rank: its value, or an MPI error class
        self.waiting: list[Process] = []


class Group:
    """A communicator as every member shares it: members, messages, revocation, collectives."""

    every: list[Group] = []  # reset per simulation

    def __init__(self, scheduler: Scheduler, members: list[Process]):
        self.scheduler = scheduler
        self.members = members
        self.revoked = False
        self.queues: dict[tuple[int, int], deque[Message]] = {}  # (dest rank, source rank)
        self.slots: list[Slot] = []
        self.calls: dict[int, int] = {}  # per member rank: collectives called
        self.acked: dict[int, frozenset[int]] = {}  # per member rank: failures acknowledged
        Group.every.append(self)

    def rank_of(self, process: Process) -> int:
        return self.members.index(process)

    def dead_ranks(self) -> frozenset[int]:
        return frozenset(r for r, p in enumerate(self.members) if not p.alive)

    def member_died(self) -> None:
        for slot in self.slots:
            if not slot.done:
                self._try_complete(slot)

    def collective(self, rank: int, kind: str, value: object):
        """Contribute to this member's next collective and wait for its outcome."""
        number = self.calls.get(rank, 0)
        self.calls[rank] = number + 1
        while len(self.slots) <= number:
            self.slots.append(Slot(kind))
        slot = self.slots[number]
        assert slot.kind == kind, f"collective mismatch: {slot.kind} against {kind}"
        slot.arrived[rank] = value
        self.scheduler.activity = True
        self._try_complete(slot)
        while not slot.done:
            slot.waiting.append(self.scheduler.current)
            self.scheduler.wake(self.scheduler.current, float("inf"))  # only the slot wakes it
            self.scheduler.park()
        outcome = slot.outcome[rank]
        if isinstance(outcome, MPI.Exception):
            raise outcome
        return outcome

    def start_collective(self, rank: int, kind: str) -> Slot:
        """A non-blocking collective (Ibarrier): the slot, complete when every member came."""
        number = self.calls.get(rank, 0)
        self.calls[rank] = number + 1
        while len(self.slots) <= number:
            self.slots.append(Slot(kind))
        slot = self.slots[number]
        slot.arrived[rank] = None
        self._try_complete(slot)
        return slot

    def _try_complete(self, slot: Slot) -> None:
        living = {r for r, p in enumerate(self.members) if p.alive}
        if not living <= set(slot.arrived):
            return
        slot.done = True
        arrived = {r: slot.arrived[r] for r in sorted(living)}
        for rank, outcome in self._outcomes(slot.kind, arrived, bool(self.dead_ranks())).items():
            slot.outcome[rank] = outcome
        for process in slot.waiting:
            if process.alive:
                self.scheduler.wake(process, self.scheduler.now)
        slot.waiting.clear()

    def _outcomes(self, kind: str, arrived: dict[int, object], deaths: bool) -> dict:
        """Each surviving member's outcome: a value, or the MPI error it raises."""
        if kind == "shrink":
            group = Group(self.scheduler, [self.members[r] for r in arrived])
            return dict.fromkeys(arrived, group)
        if kind == "barrier":
            return dict.fromkeys(arrived)
        if deaths:  # ULFM: the operation fails at every survivor alike
            return {r: MPI.Exception(MPI.ERR_PROC_FAILED) for r in arrived}
        if kind == "agree":
            return dict.fromkeys(arrived, int(all(arrived.values())))
        if kind == "allgather":
            return dict.fromkeys(arrived, list(arrived.values()))
        if kind == "bcast":
            value = next(v for is_root, v in arrived.values() if is_root)
            return dict.fromkeys(arrived, value)
        if kind == "dup":
            return dict.fromkeys(arrived, Group(self.scheduler, list(self.members)))
        if kind == "split":
            groups = {}
            for color in {color for color, _ in arrived.values() if color != MPI.UNDEFINED}:
                chosen = sorted((key, r) for r, (c, key) in arrived.items() if c == color)
                groups[color] = Group(self.scheduler, [self.members[r] for _, r in chosen])
            return {r: groups.get(color) for r, (color, _) in arrived.items()}
        raise AssertionError(f"unknown collective {kind}")


class SimRequest:
    def __init__(self, slot: Slot | None = None):
        self.slot = slot

    def Test(self) -> bool:  # noqa: N802 - mpi4py's name
        return self.slot is None or self.slot.done


class SimGroup:
    def __init__(self, ranks: list[int]):
        self.ranks = ranks

    def Get_size(self) -> int:  # noqa: N802
        return len(self.ranks)

    def Translate_ranks(self, ranks, group) -> list[int]:  # noqa: N802
        return [self.ranks[r] for r in ranks]

    def Free(self) -> None:  # noqa: N802
        pass


def _raise(error_class: int):
    raise MPI.Exception(error_class)


class SimComm:
    """One member's handle on a Group: the subset of mpi4py's Comm the session code uses."""

    def __init__(self, group: Group, process: Process):
        self.group = group
        self.process = process
        self.rank = group.rank_of(process)

    @property
    def scheduler(self) -> Scheduler:
        return self.group.scheduler

    def Get_rank(self) -> int:  # noqa: N802
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return len(self.group.members)

    def Set_errhandler(self, handler) -> None:  # noqa: N802
        pass

    def Free(self) -> None:  # noqa: N802
        pass

    def Abort(self, status: int = 1) -> None:  # noqa: N802
        self.scheduler.abort(status)

    # -- point to point ------------------------------------------------------------------

    def _check_revoked(self) -> None:
        if self.group.revoked:
            _raise(MPI.ERR_REVOKED)

    def Isend(self, buffer, dest: int, tag: int) -> SimRequest:  # noqa: N802
        if tag != WORK:
            return self._isend(buffer, dest, tag)
        try:
            request = self._isend(buffer, dest, tag)
        except MPI.Exception:
            self.scheduler.work_sent(self.process, dest, False)
            raise
        self.scheduler.work_sent(self.process, dest, True)
        return request

    def _isend(self, buffer, dest: int, tag: int) -> SimRequest:
        self._check_revoked()
        target = self.group.members[dest]
        if not target.alive:
            _raise(MPI.ERR_PROC_FAILED)
        if tag == WORK and self.scheduler.send_errors.get(self.process.index):
            self.scheduler.send_errors[self.process.index] -= 1
            self.scheduler.struck(0.0)
            _raise(MPI.ERR_OTHER)  # not a failed peer: the send alone failed
        payload = bytes(buffer[0])
        if tag == RESULT:
            payload = self._lag(payload)
        elif tag == WORK:
            work = msgspec.msgpack.decode(payload)
            self.scheduler.works[work["token"]] = work["generation"]
        if tag in (WORK, RESULT) and self.process.index in self.scheduler.slow:
            self.scheduler.slowed(msgspec.msgpack.decode(payload).get("digest"))
        at = self.scheduler.deliver_time(self.process, target)
        queue = self.group.queues.setdefault((dest, self.rank), deque())
        queue.append(Message(self.process, target, tag, payload, at))
        self.scheduler.activity = True
        return SimRequest()

    def _lag(self, payload: bytes) -> bytes:
        """A worker made to lag (the `stale-generation` fault) sends its next RESULT with the
        generation before its own."""
        scheduler = self.scheduler
        try:
            message = msgspec.msgpack.decode(payload)
        except msgspec.DecodeError:
            return payload
        if not isinstance(message, dict) or not isinstance(message.get("generation"), int):
            return payload
        if self.process.index in scheduler.stale_results and message["generation"] > 0:
            scheduler.stale_results.discard(self.process.index)
            scheduler.struck(0.0)
            message["generation"] -= 1
            payload = msgspec.msgpack.encode(message)
        return payload

    def Send(self, buffer, dest: int, tag: int) -> None:  # noqa: N802
        self.Isend(buffer, dest, tag)

    def _deliverable(self, source: int) -> Message | None:
        queue = self.group.queues.get((self.rank, source))
        if not queue:
            return None
        head = queue[0]
        if head.deliver_at > self.scheduler.now:
            return None
        return head

    def Iprobe(self, source: int, tag: int, status=None) -> bool:  # noqa: N802
        self._check_revoked()
        scheduler = self.scheduler
        if source == MPI.ANY_SOURCE:
            unacked = self.group.dead_ranks() - self.group.acked.get(self.rank, frozenset())
            if unacked:
                _raise(MPI.ERR_PROC_FAILED_PENDING)
            ready = [r for r in range(len(self.group.members)) if self._deliverable(r)]
            if not ready:
                return False
            source = ready[scheduler.rng.randrange(len(ready))] if len(ready) > 1 else ready[0]
        else:
            if self._deliverable(source) is None:
                if not self.group.members[source].alive:
                    _raise(MPI.ERR_PROC_FAILED)
                return False
        head = self._deliverable(source)
        if status is not None:
            status.Set_source(source)
            status.Set_tag(head.tag)
            status.Set_elements(MPI.BYTE, len(head.payload))
        return True

    def Recv(self, buffer, source: int, tag: int) -> None:  # noqa: N802
        queue = self.group.queues[(self.rank, source)]
        message = queue.popleft()
        assert message.tag == tag
        buffer[0][:] = message.payload
        if tag in (READY, RESULT):
            self.scheduler.received(self.process, self.group, source, tag, message.payload)
        self.scheduler.activity = True

    # -- ULFM ----------------------------------------------------------------------------

    def Get_failed(self) -> SimGroup:  # noqa: N802
        return SimGroup(sorted(self.group.dead_ranks()))

    def Ack_failed(self) -> None:  # noqa: N802
        self.group.acked[self.rank] = self.group.dead_ranks()

    def Get_group(self) -> SimGroup:  # noqa: N802
        return SimGroup(list(range(len(self.group.members))))

    def Revoke(self) -> None:  # noqa: N802
        self.group.revoked = True
        self.scheduler.activity = True

    def Is_revoked(self) -> bool:  # noqa: N802
        return self.group.revoked

    def Shrink(self) -> SimComm:  # noqa: N802
        group = self.group.collective(self.rank, "shrink", None)
        return SimComm(group, self.process)

    def Agree(self, flag: int) -> int:  # noqa: N802
        return self.group.collective(self.rank, "agree", flag)

    # -- collectives ---------------------------------------------------------------------

    def Dup(self) -> SimComm:  # noqa: N802
        self._check_revoked()
        return SimComm(self.group.collective(self.rank, "dup", None), self.process)

    def allgather(self, value):
        self._check_revoked()
        return self.group.collective(self.rank, "allgather", value)

    def bcast(self, value, root: int = 0):
        self._check_revoked()
        return self.group.collective(self.rank, "bcast", (self.rank == root, value))

    def Split(self, color: int, key: int):  # noqa: N802
        self._check_revoked()
        group = self.group.collective(self.rank, "split", (color, key))
        return MPI.COMM_NULL if group is None else SimComm(group, self.process)

    def Ibarrier(self) -> SimRequest:  # noqa: N802
        self._check_revoked()
        return SimRequest(self.group.start_collective(self.rank, "barrier"))


# -- the doorbell, the executor, the host --------------------------------------------------


class SimDoorbell:
    """The master's doorbell: a nap the workers' rings cut short."""

    def __init__(self, scheduler: Scheduler, process: Process):
        self.scheduler = scheduler
        self.process = process
        self.address = f"sim-doorbell-{process.index}"
        process.doorbell = self

    def wait(self, timeout: float) -> bool:
        process = self.process
        if not process.rang:
            process.waiting_for_ring = True
            self.scheduler.sleep(timeout)
            process.waiting_for_ring = False
        return self.drain()

    def drain(self) -> bool:
        rang, self.process.rang = self.process.rang, False
        return rang

    def close(self) -> None:
        self.process.doorbell = None


class SimRinger:
    def __init__(self, scheduler: Scheduler, address: str):
        self.scheduler = scheduler
        by_address = {p.doorbell.address: p for p in scheduler.processes
                      if p.doorbell is not None}
        self.master = by_address.get(address)
        self.reachable = self.master is not None and self.master.alive

    def ring(self) -> None:
        master = self.master
        if master is None or not master.alive or master.doorbell is None:
            return
        master.rang = True
        if master.waiting_for_ring:  # the ring lands when the message may: no sooner
            sender = self.scheduler.current
            at = self.scheduler.now if sender is None else max(
                self.scheduler.now, sender.busy_until, sender.paused_until)
            self.scheduler.wake(master, at + self.scheduler.delays[0])

    def close(self) -> None:
        pass


class SimDisk:
    """The durable writes of the rank whose turn it is, as its fault (if any) has them:
    ("error", n): the next n fail with EIO; ("full",): every one fails with ENOSPC; ("tear",):
    the next journal write stops halfway and the rank dies there; ("stall", s): the next
    fsync takes s seconds (the rank is stopped inside it, mid-commit). A fault whose last
    item is LEASES meets only writes to the masters' shared lease tables (F320). One whose
    last item is COMMITTING waits for the lease write that marks a commit under way and
    stalls the commit's first publication of a child (a commit that publishes none leaves
    it armed for the next): the master stopped past its lease's expiry after the fence, the
    moment F321 makes safe (a simulator's "buggify")."""

    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler

    def _fault(self, call: str, path: str = "", data=b"") -> tuple | None:
        process = self.scheduler.current
        fault = process.disk_fault if process is not None else None
        if fault is None:
            return None
        in_leases = LEASE_DIRECTORY_PREFIX in path
        if fault[-1] == COMMITTING:
            if in_leases and b'"committing"' in data:
                process.disk_fault = fault[:-1] + (IN_COMMIT,)
            return None
        if fault[-1] == IN_COMMIT:
            if in_leases:  # the commit completed without a child: the next lease write
                if b'"committing"' not in data:  # (unless it fences the next commit)
                    process.disk_fault = fault[:-1] + (COMMITTING,)
                return None
            fault = fault[:-1]
        elif fault[-1] == LEASES and not in_leases:
            return None
        kind = fault[0]
        if kind == "stall" and path.endswith(GENERATIONS_JOURNAL):
            return None  # written under a blocking flock: see fsync
        # A lease table is written, not fsynced (its job's lifetime is the epoch's): its
        # stalls come at the write; the others' at whichever comes first.
        strikes = kind in ("error", "full") or (kind == "tear" and call == "write") \
            or (kind == "stall" and (call == "write" or fault[-1] != LEASES))
        if strikes:
            self.scheduler.struck(fault[1] if kind == "stall" else 0.0)
        if kind == "error":
            process.disk_fault = (("error", fault[1] - 1) + fault[2:]) if fault[1] > 1 \
                else None
            raise OSError(errno.EIO, "injected I/O error")
        if kind == "full":
            raise OSError(errno.ENOSPC, "injected: no space left on device")
        if strikes:
            process.disk_fault = None
            return fault
        return None

    def write(self, fd: int, data) -> int:
        fault = self._fault("write", os.readlink(f"{FD_DIRECTORY}/{fd}"), bytes(data))
        if fault is None:
            return os.write(fd, data)
        if fault[0] == "stall":
            self.scheduler.sleep(fault[1])
            return os.write(fd, data)
        os.write(fd, bytes(data[:max(1, len(data) // 2)]))
        process = self.scheduler.current
        self.scheduler.kill(process)
        self.scheduler.park()  # never resumed: it died inside the write
        raise AssertionError("a dead rank ran again")

    def fsync(self, fd: int) -> None:
        # Not inside the generation log's blocking flock: a real rank waiting on it sleeps in
        # the kernel, here it would stop every rank of this one process.
        path = os.readlink(f"{FD_DIRECTORY}/{fd}")
        if not path.endswith(GENERATIONS_JOURNAL):
            fault = self._fault("fsync", path)
            if fault is not None:
                self.scheduler.sleep(fault[1])
        os.fsync(fd)


def branches_of(data: bytes, *, fanout: int, depth: int, space: int
                ) -> list[tuple[int, bytes | None]]:
    """The branches on the path of `data`, in path order, each with the child its solving
    generates (None: unsatisfiable): a function of its bytes alone. Byte 0 is the depth;
    children draw from a small space so that different parents find the same child (the
    campaign must analyse it once), and a branch is named by the child it yields, so that
    inputs share branches as a parser's inputs do (a split's target reserve has work)."""
    level = data[0] if data else 0
    digest = hashlib.sha256(data).digest()
    count = 0 if level >= depth else digest[0] % (fanout + 1)
    branches: list[tuple[int, bytes | None]] = []
    for i in range(count):
        child = bytes([level + 1, digest[1 + i] % space, i])
        branches.append((1 + (child[0] * space + child[1]) * fanout + i, child))
    for i in range(digest[8] % 3):  # branches no model satisfies
        branches.append((UNSATISFIABLE_BRANCHES + digest[9 + i] % 50, None))
    return branches


UNSATISFIABLE_BRANCHES = 10_000  # their numbers, above every satisfiable one's
QSYM_CONTEXT_HALF = 65536  # where QSYM's map keeps its context bits, the model's branches'


def children_of(data: bytes, *, fanout: int, depth: int, space: int) -> list[bytes]:
    """The inputs a whole run of `data` generates."""
    return [child for _, child in branches_of(data, fanout=fanout, depth=depth, space=space)
            if child is not None]


def coverage_of(data: bytes) -> FileCoverage:
    """The AFL edges a run of `data` hits: a function of its depth and first value, so that
    many inputs hit the same and triage has some to set aside."""
    level, value = (data[0], data[1]) if len(data) > 1 else (0, 0)
    edges = {1 + level, 16 + (level * 7 + value) % 23, 64 + value % 5}
    return FileCoverage.from_pairs(((edge, 1) for edge in edges), map_size=COVERAGE_MAP_SIZE)


COVERAGE_MAP_SIZE = 1 << 16


class SimProbe:
    """--afl-target's probe (forkserver.ForkserverProbe): coverage_of each input, at once."""

    def probe_bytes(self, data: bytes) -> FileCoverage:
        return coverage_of(data)

    def probe(self, files) -> list[FileCoverage]:
        return [coverage_of(Path(path).read_bytes()) for path in files]

    def close(self) -> None:
        pass

    def __enter__(self) -> SimProbe:
        return self

    def __exit__(self, *_) -> None:
        pass


class SimExecutor:
    """Deterministic: children from the input's bytes, a duration from its digest, spent as
    virtual time during which the rank sends nothing and takes no turn. With splitting on,
    it can be targeted (executors/base.py): it reports the branches on the path and solves
    only those it is given. Given QSYM's `coverage_map` (pruning), a whole pruned run skips
    each branch whose bit the map holds and sets the bit of each branch it solves, as QSYM's
    AflTraceMap does (a branch's bit is its own: the model's map has no collisions)."""

    name = "simulated"

    def __init__(self, simulation, process: Process, coverage_map: Path | None = None):
        self.simulation = simulation
        self.process = process
        self.targetable = simulation.schedule.split
        self.coverage_map = coverage_map

    def run(self, input_path: Path, output_dir: Path,
            targets: frozenset[int] | None = None, *, pruned: bool = True) -> ExecutionResult:
        data = input_path.read_bytes()
        sim = self.simulation
        digest = hashlib.sha256(data).digest()
        low, high = sim.schedule.execution_seconds
        seconds = low + (high - low) * digest[-1] / 255
        scheduler = sim.scheduler
        self.process.busy_until = max(scheduler.now, self.process.paused_until) + seconds
        sim.executed(hashlib.sha256(data).hexdigest(), targets, self.process)
        branches = branches_of(data, fanout=sim.schedule.fanout, depth=sim.schedule.depth,
                               space=sim.schedule.space)
        qsym_map = None
        if targets is None and pruned and self.coverage_map is not None:
            qsym_map = bytearray(self.coverage_map.read_bytes())
        generated, skipped = [], set()
        for number, (branch, child) in enumerate(branches):
            if targets is not None and branch not in targets:
                continue
            if qsym_map is not None:
                byte, bit = QSYM_CONTEXT_HALF + branch // 8, 1 << branch % 8
                if qsym_map[byte] & bit:
                    skipped.add(branch)
                    continue
                qsym_map[byte] |= bit
            if child is not None:
                path = output_dir / f"{number:06d}"
                path.write_bytes(child)
                generated.append(path)
        if qsym_map is not None:
            self.coverage_map.write_bytes(qsym_map)
            sim.pruned(data, skipped)
        crashed = digest[2] % 7 == 0
        path_targets = tuple(dict.fromkeys(branch for branch, _ in branches))
        return ExecutionResult(
            Outcome.CRASH if crashed else Outcome.OK, -11 if crashed else 0, seconds,
            generated=tuple(generated), queries_skipped=len(skipped),
            path_targets=path_targets if self.targetable else None,
            solved_targets=() if targets is None else
            tuple(branch for branch in path_targets if branch in targets))

    def cancel(self) -> None:
        pass

    def close(self) -> None:
        pass


def sim_host(simulation, process: Process, world: Group) -> Host:
    scheduler = simulation.scheduler
    return Host(
        world=lambda: SimComm(world, process),
        endpoint=lambda: process.name,
        decide_fault_tolerance=lambda comm, config: Decision(True, "on (simulated ULFM)"),
        doorbell=lambda: SimDoorbell(scheduler, process),
        ringer=lambda address: SimRinger(scheduler, address),
        executor=lambda config, scratch, coverage_map=None: SimExecutor(simulation, process,
                                                                        coverage_map),
        probe=lambda config, scratch: SimProbe(),
        finalize=lambda seconds: None,
    )


